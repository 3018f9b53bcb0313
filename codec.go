package idempotency

import "encoding/json"

// Codec encodes the results Do stores and decodes those it replays. A
// result of type []byte is stored as it is, whatever the Codec.
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

// WithCodec sets the Codec of the results a Runner stores: Do only (New
// panics on it).
// Default: JSON.
func WithCodec(c Codec) Option {
	if c == nil {
		panic("idempotency: WithCodec needs a Codec")
	}
	return func(cfg *config) {
		cfg.functionOnly = append(cfg.functionOnly, "WithCodec")
		cfg.codec = c
	}
}

// encode returns v as a result's stored body and its content type.
func encode(c Codec, v any) ([]byte, string, error) {
	if b, ok := any(v).([]byte); ok {
		return b, rawContentType, nil
	}
	b, err := c.Marshal(v)
	return b, c.ContentType(), err
}

// decode sets *v from a stored result's body of content type ct.
func decode[T any](c Codec, ct string, body []byte, v *T) error {
	if p, ok := any(v).(*[]byte); ok {
		if ct != rawContentType {
			return errCodec(ct, rawContentType)
		}
		*p = append([]byte(nil), body...)
		return nil
	}
	if ct != c.ContentType() {
		return errCodec(ct, c.ContentType())
	}
	return c.Unmarshal(body, v)
}
