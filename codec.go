package idempotency

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
)

// Codec encodes the results Do stores and decodes those it replays. A
// result of type []byte is stored as it is, and one of type *Response as
// the response it is, whatever the Codec.
type Codec interface {
	// ContentType names the encoding. It is stored with each result, and
	// a result stored under another name is not decoded (Do reports it as
	// ErrCorruptRecord), so that a change of Codec never misreads a record.
	ContentType() string
	Marshal(v any) ([]byte, error)
	Unmarshal(data []byte, v any) error
}

// JSON is the default Codec: encoding/json, as "application/json".
var JSON Codec = jsonCodec{}

type jsonCodec struct{}

func (jsonCodec) ContentType() string                { return "application/json" }
func (jsonCodec) Marshal(v any) ([]byte, error)      { return json.Marshal(v) }
func (jsonCodec) Unmarshal(data []byte, v any) error { return json.Unmarshal(data, v) }

// rawContentType is the content type of a []byte result, stored as it is.
const rawContentType = "application/octet-stream"

// WithCodec sets the Codec of the results a Runner stores (a Runner
// option: New does not take it).
// Default: JSON.
func WithCodec(c Codec) RunnerOption {
	if c == nil {
		panic("idempotency: WithCodec needs a Codec")
	}
	return runnerOption(func(cfg *config) { cfg.codec = c })
}

// record returns the record that stores v, a result of Do, under cfg's
// caps: a *Response as it is (its status, headers and body, as the
// middleware stores a handler's response), a []byte as its body, anything
// else encoded by the Codec. A result that cannot be stored whole is marked
// omitted, with the error that says why when it is not a cap.
func record(cfg *config, v any) (*Response, error) {
	if r, ok := v.(*Response); ok {
		return recordResponse(cfg, r)
	}
	var (
		body []byte
		ct   string
		err  error
	)
	if b, ok := v.([]byte); ok {
		body, ct = b, rawContentType
	} else {
		body, err = cfg.codec.Marshal(v)
		ct = cfg.codec.ContentType()
	}
	resp := &Response{Status: http.StatusOK, Header: http.Header{"Content-Type": {ct}}, Body: body}
	if err != nil || len(body) > cfg.maxResponseBody {
		resp.Body, resp.BodyOmitted = nil, true
	}
	return resp, err
}

// recordResponse returns the record of a *Response result: r itself when
// it fits, else a copy marked omitted. Status 0 means 200.
func recordResponse(cfg *config, r *Response) (*Response, error) {
	switch {
	case r == nil:
		return &Response{Status: http.StatusOK, BodyOmitted: true, HeaderOmitted: true}, errors.New("idempotency: a nil *Response result")
	case r.Status != 0 && (r.Status < 200 || r.Status > 599):
		return &Response{Status: http.StatusOK, BodyOmitted: true, HeaderOmitted: true},
			fmt.Errorf("idempotency: a *Response result with status %d, outside 200..599", r.Status)
	}
	c := *r
	if c.Status == 0 {
		c.Status = http.StatusOK
	}
	if c.HeaderOmitted || headerSize(c.Header) > cfg.maxHeader {
		c.Header, c.HeaderOmitted = nil, true
	}
	if c.HeaderOmitted || len(c.Body) > cfg.maxResponseBody {
		c.Body, c.BodyOmitted = nil, true
	}
	return &c, nil
}

// decode sets *v from a stored record resp: a *Response result gets a copy
// of resp, a []byte the body, anything else the body decoded by c. A
// record stored under another content type than the one v's type is read
// with is ErrCorruptRecord.
func decode[T any](c Codec, resp *Response, v *T) error {
	switch p := any(v).(type) {
	case **Response:
		r := *resp
		r.Header = resp.Header.Clone()
		*p = &r
		return nil
	case *[]byte:
		if ct := resp.Header.Get("Content-Type"); ct != rawContentType {
			return errCodec(ct, rawContentType)
		}
		*p = append([]byte(nil), resp.Body...)
		return nil
	}
	if ct := resp.Header.Get("Content-Type"); ct != c.ContentType() {
		return errCodec(ct, c.ContentType())
	}
	return c.Unmarshal(resp.Body, v)
}
