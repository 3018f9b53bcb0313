package idempotency

import (
	"errors"
	"strings"
)

// HeaderKey is the request header that carries the idempotency key.
const HeaderKey = "Idempotency-Key"

// MaxKeyLen is the largest key, in bytes of content (after unquoting), that
// ParseKey accepts.
const MaxKeyLen = 255

// ErrInvalidKey is wrapped by the errors ParseKey returns; the wrapping error
// says what is wrong with the key.
var ErrInvalidKey = errors.New("idempotency: invalid key")

var (
	errKeyEmpty    = keyError("empty key")
	errKeyTooLong  = keyError("key longer than 255 bytes")
	errKeyControl  = keyError("key contains a control, space or non-ASCII character")
	errKeyQuoting  = keyError("bad quoting: a quoted key must end with '\"' and escape only '\"' and '\\'")
	errKeyMultiple = keyError("more than one Idempotency-Key header line")
)

type invalidKeyError string

func keyError(s string) error { return invalidKeyError(s) }

func (e invalidKeyError) Error() string { return "idempotency: invalid key: " + string(e) }
func (e invalidKeyError) Unwrap() error { return ErrInvalidKey }

// keyDetail is what a client is told of a malformed key, without the
// package's prefix.
func keyDetail(err error) string {
	var e invalidKeyError
	if errors.As(err, &e) {
		return "invalid Idempotency-Key: " + string(e)
	}
	return "invalid Idempotency-Key"
}

// ParseKey parses the value of an Idempotency-Key header line and returns the
// key. Two forms are accepted:
//
//   - the Structured Field String of the IETF draft: "abc", where the content
//     is printable ASCII and '"' and '\' are escaped with '\';
//   - the bare token that many clients send: abc, printable ASCII (0x21–0x7E)
//     without '"'.
//
// Surrounding spaces and tabs are ignored. The key must hold 1 to MaxKeyLen
// bytes of content. Errors wrap ErrInvalidKey.
func ParseKey(v string) (string, error) {
	v = strings.Trim(v, " \t")
	if v == "" {
		return "", errKeyEmpty
	}
	if v[0] != '"' {
		if len(v) > MaxKeyLen {
			return "", errKeyTooLong
		}
		for i := 0; i < len(v); i++ {
			c := v[i]
			if c == '"' {
				return "", errKeyQuoting
			}
			if c < 0x21 || c > 0x7e {
				return "", errKeyControl
			}
		}
		return v, nil
	}
	return parseSFString(v)
}

// parseSFString parses a Structured Field String (RFC 8941 §3.3.3) that
// starts with '"'.
func parseSFString(v string) (string, error) {
	if len(v) < 2 || v[len(v)-1] != '"' {
		return "", errKeyQuoting
	}
	body := v[1 : len(v)-1]
	escapes := 0
	n := 0
	for i := 0; i < len(body); i++ {
		c := body[i]
		switch {
		case c == '\\':
			i++
			if i == len(body) || (body[i] != '"' && body[i] != '\\') {
				return "", errKeyQuoting
			}
			escapes++
		case c == '"':
			return "", errKeyQuoting
		case c < 0x20 || c > 0x7e:
			return "", errKeyControl
		}
		n++
	}
	if n == 0 {
		return "", errKeyEmpty
	}
	if n > MaxKeyLen {
		return "", errKeyTooLong
	}
	if escapes == 0 {
		return body, nil
	}
	var b strings.Builder
	b.Grow(n)
	for i := 0; i < len(body); i++ {
		if body[i] == '\\' {
			i++
		}
		b.WriteByte(body[i])
	}
	return b.String(), nil
}

// requestKey returns the request's key: ok is false when the request carries
// no Idempotency-Key header.
func requestKey(values []string) (key string, ok bool, err error) {
	switch len(values) {
	case 0:
		return "", false, nil
	case 1:
		key, err = ParseKey(values[0])
		return key, true, err
	default:
		return "", true, errKeyMultiple
	}
}
