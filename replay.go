package idempotency

import (
	"net/http"
	"slices"
)

var (
	trueValue  = []string{"true"}
	zeroLength = []string{"0"}
)

// replay writes a stored response to w: the stored headers over whatever w
// already holds, Idempotent-Replayed: true, the stored status and body. resp
// is shared with concurrent replays and is only read.
func replay(w http.ResponseWriter, resp *Response) error {
	h := w.Header()
	for k, v := range resp.Header {
		// Clip, so that an append by a later writer copies instead of
		// writing into the shared array.
		h[k] = slices.Clip(v)
	}
	h[HeaderReplayed] = slices.Clip(trueValue)
	if resp.BodyOmitted {
		h[HeaderBodyOmitted] = slices.Clip(trueValue)
		h["Content-Length"] = slices.Clip(zeroLength)
	}
	w.WriteHeader(resp.Status)
	if len(resp.Body) == 0 {
		return nil
	}
	_, err := w.Write(resp.Body)
	return err
}
