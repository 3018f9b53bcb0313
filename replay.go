package idempotency

import (
	"net/http"
	"slices"
	"strconv"
)

var (
	trueValue  = []string{"true"}
	zeroLength = []string{"0"}
)

// replay writes a stored response to w: the stored status and body, the
// stored headers over those the middleware in front set for this request,
// and Idempotent-Replayed: true. It sends only what the recorder would
// have stored under p, whatever the record holds (a record written by
// another writer, or tampered with): the headers p keeps, and a
// Content-Length that is the length of the body it sends (for a HEAD, the
// stored one when it is a number). head reports a HEAD request. resp is
// shared with concurrent replays and is only read.
func replay(w http.ResponseWriter, resp *Response, p headerPolicy, head bool) error {
	h := w.Header()
	var length []string
	p.each(resp.Header, func(name string, values []string) {
		if name == "Content-Length" {
			length = values
			return
		}
		// Clip, so that an append by a later writer copies instead of
		// writing into the shared array.
		h[name] = slices.Clip(values)
	})
	delete(h, "Content-Length")
	switch {
	case resp.BodyOmitted || resp.HeaderOmitted:
		h[HeaderBodyOmitted] = slices.Clip(trueValue)
		if resp.HeaderOmitted {
			h[HeaderHeaderOmitted] = slices.Clip(trueValue)
		}
		if bodyAllowed(resp.Status) {
			h["Content-Length"] = slices.Clip(zeroLength)
		}
	case head:
		if len(length) == 1 {
			if _, err := strconv.ParseUint(length[0], 10, 63); err == nil {
				h["Content-Length"] = slices.Clip(length)
			}
		}
	case bodyAllowed(resp.Status):
		h["Content-Length"] = []string{strconv.Itoa(len(resp.Body))}
	}
	h[HeaderReplayed] = slices.Clip(trueValue)
	w.WriteHeader(resp.Status)
	if len(resp.Body) == 0 || resp.BodyOmitted || head || !bodyAllowed(resp.Status) {
		return nil
	}
	_, err := w.Write(resp.Body)
	return err
}
