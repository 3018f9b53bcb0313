package redisstore

import (
	"encoding/binary"
	"errors"
	"strconv"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/internal/wire"
)

// A record is a hash (see README.md, Record layout). Its field h, the head,
// is
//
//	<state><token length>:<token><epoch>:<lease end>:<fingerprint>
//
// with state "p" (in progress), "P" (in progress, watched) or "c"
// (complete), and the lease's end in Unix milliseconds on the server's
// clock. A COMPLETE record also holds its payload in the field named "c"
// followed by the fingerprint, so that a replay is one HGET of the field
// the request's own fingerprint names. The scripts parse and write heads;
// the Go side only sends the parts (tokenTag, payloadField).

// payloadField returns the name of the payload field of a COMPLETE record
// made by a request with fingerprint fp.
func payloadField(fp string) string { return "c" + fp }

// tokenTag returns token as a head spells it after its state:
// <length>:<token>. A head opens with its state and this tag, so the fenced
// scripts compare one substring; a decimal length followed by ":" is never
// a prefix of another, so equal tags mean equal tokens.
func tokenTag(token string) string { return strconv.Itoa(len(token)) + ":" + token }

// appendPayload appends the payload of resp to b: the length of its meta
// block as a uvarint, the meta block (wire.AppendMeta) and the body (none
// when BodyOmitted or HeaderOmitted).
func appendPayload(b []byte, resp *idempotency.Response) ([]byte, error) {
	meta, err := wire.AppendMeta(nil, resp)
	if err != nil {
		return nil, err
	}
	body := resp.Body
	if resp.BodyOmitted || resp.HeaderOmitted {
		body = nil
	}
	b = binary.AppendUvarint(b, uint64(len(meta)))
	b = append(b, meta...)
	return append(b, body...), nil
}

// splitPayload returns the meta block and the body of a payload. The
// uvarint is read from a copy of the payload's first bytes only (at most
// binary.MaxVarintLen64), never of the body.
func splitPayload(p string) (meta, body string, err error) {
	n, k := binary.Uvarint([]byte(p[:min(len(p), binary.MaxVarintLen64)]))
	if k <= 0 || n > uint64(len(p)-k) {
		return "", "", errors.New("payload: malformed meta length")
	}
	end := k + int(n)
	return p[k:end], p[end:], nil
}
