// Package wire is the binary form of an idempotency.Response that the
// stores keep: redisstore writes it to Redis, and memstore keeps it in
// memory, where a block of bytes costs the garbage collector nothing to
// scan, unlike a header map.
//
// A Response is kept as two parts: the body as raw bytes, and a meta block
// with everything else:
//
//	version   1 byte, MetaVersion
//	status    uvarint, 200..599
//	flags     1 byte: bit 0 = body omitted, bit 1 = headers omitted
//	          (only with bit 0, and with no headers); other bits zero
//	headers   uvarint count, then per header name:
//	            uvarint length, name bytes,
//	            uvarint count of values, then per value: uvarint length, bytes
//
// Nothing is base64- or JSON-encoded, so a stored body costs its own size.
package wire

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math/bits"
	"net/http"
	"slices"
	"unsafe"

	"github.com/go-idempotency/idempotency"
)

// MetaVersion is the first byte of every meta block.
const MetaVersion = 1

const (
	flagBodyOmitted   = 1 << 0
	flagHeaderOmitted = 1 << 1
)

// ErrUnstorable reports a Response that has no meta block: nil, or with a
// status outside 200..599. Stores wrap it in their own error.
var ErrUnstorable = errors.New("response cannot be stored")

// uvarintLen is the length of x as a uvarint.
func uvarintLen(x uint64) int { return (bits.Len64(x|1) + 6) / 7 }

// AppendMeta appends the meta block of resp to b. Header names are written
// in sorted order so equal responses encode to equal bytes. A response
// marked HeaderOmitted is written without headers and marked BodyOmitted
// too. When b has no room, the block is built in one allocation of its
// exact size.
func AppendMeta(b []byte, resp *idempotency.Response) ([]byte, error) {
	if resp == nil {
		return b, fmt.Errorf("%w: nil response", ErrUnstorable)
	}
	if resp.Status < 200 || resp.Status > 599 {
		return b, fmt.Errorf("%w: status %d outside 200..599", ErrUnstorable, resp.Status)
	}
	header := resp.Header
	if resp.HeaderOmitted {
		header = nil
	}
	var buf [16]string
	names := buf[:0]
	size := 1 + uvarintLen(uint64(resp.Status)) + 1 + uvarintLen(uint64(len(header)))
	for name, values := range header {
		names = append(names, name)
		size += uvarintLen(uint64(len(name))) + len(name) + uvarintLen(uint64(len(values)))
		for _, v := range values {
			size += uvarintLen(uint64(len(v))) + len(v)
		}
	}
	slices.Sort(names)

	b = slices.Grow(b, size)
	b = append(b, MetaVersion)
	b = binary.AppendUvarint(b, uint64(resp.Status))
	var flags byte
	if resp.BodyOmitted || resp.HeaderOmitted {
		flags |= flagBodyOmitted
	}
	if resp.HeaderOmitted {
		flags |= flagHeaderOmitted
	}
	b = append(b, flags)
	b = binary.AppendUvarint(b, uint64(len(names)))
	for _, name := range names {
		values := resp.Header[name]
		b = binary.AppendUvarint(b, uint64(len(name)))
		b = append(b, name...)
		b = binary.AppendUvarint(b, uint64(len(values)))
		for _, v := range values {
			b = binary.AppendUvarint(b, uint64(len(v)))
			b = append(b, v...)
		}
	}
	return b, nil
}

// decodeError is a meta block or body that cannot be decoded.
func decodeError(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{idempotency.ErrCorruptRecord}, args...)...)
}

// Decode rebuilds the Response stored as meta and body. Every failure wraps
// idempotency.ErrCorruptRecord. A Response with no headers has a nil
// Header, and one with an empty body a nil Body. Header names and values
// are substrings of meta, and Body shares body's bytes: both must be
// immutable, as a Response is.
func Decode(meta, body string) (*idempotency.Response, error) {
	d := decoder{b: meta}
	if len(meta) == 0 {
		return nil, decodeError("meta is empty")
	}
	if v := meta[0]; v != MetaVersion {
		return nil, decodeError("unknown meta version %d", v)
	}
	d.b = d.b[1:]
	status, err := d.uvarint("status")
	if err != nil {
		return nil, err
	}
	if status < 200 || status > 599 {
		return nil, decodeError("status %d outside 200..599", status)
	}
	flags, err := d.byte("flags")
	if err != nil {
		return nil, err
	}
	if flags&^(flagBodyOmitted|flagHeaderOmitted) != 0 {
		return nil, decodeError("unknown flags %#x", flags)
	}
	resp := &idempotency.Response{
		Status:        int(status),
		BodyOmitted:   flags&flagBodyOmitted != 0,
		HeaderOmitted: flags&flagHeaderOmitted != 0,
	}
	if resp.HeaderOmitted && !resp.BodyOmitted {
		return nil, decodeError("headers marked omitted without the body")
	}
	n, err := d.count("header count")
	if err != nil {
		return nil, err
	}
	if resp.HeaderOmitted && n != 0 {
		return nil, decodeError("headers present but marked omitted")
	}
	// One array holds the values of all headers while they fit (most
	// headers have one value); each header's slice is capped at its own
	// values, so appending to one never writes into the next.
	var values []string
	if n > 0 {
		resp.Header = make(http.Header, n)
		values = make([]string, 0, n)
	}
	for i := uint64(0); i < n; i++ {
		name, err := d.str("header name")
		if err != nil {
			return nil, err
		}
		if name == "" {
			return nil, decodeError("empty header name")
		}
		if _, dup := resp.Header[name]; dup {
			return nil, decodeError("header %q stored twice", name)
		}
		nv, err := d.count("header value count")
		if err != nil {
			return nil, err
		}
		if uint64(cap(values)-len(values)) < nv {
			values = make([]string, 0, nv)
		}
		start := len(values)
		for j := uint64(0); j < nv; j++ {
			v, err := d.str("header value")
			if err != nil {
				return nil, err
			}
			values = append(values, v)
		}
		resp.Header[name] = values[start:len(values):len(values)]
	}
	if len(d.b) != 0 {
		return nil, decodeError("%d bytes after the header block", len(d.b))
	}
	if len(body) > 0 {
		if resp.BodyOmitted {
			return nil, decodeError("body present but marked omitted")
		}
		// body is immutable and a Response's body is never modified (see
		// idempotency.Acquisition), so it becomes the body without a copy.
		resp.Body = unsafe.Slice(unsafe.StringData(body), len(body))
	}
	return resp, nil
}

// DecodeOwned is Decode of a meta block and body the caller hands over:
// the Response shares their bytes, which must not change afterwards. A
// store whose driver gives it copies of its columns decodes them with it
// instead of copying them again into strings.
func DecodeOwned(meta, body []byte) (*idempotency.Response, error) {
	return Decode(unsafe.String(unsafe.SliceData(meta), len(meta)), unsafe.String(unsafe.SliceData(body), len(body)))
}

type decoder struct{ b string }

func (d *decoder) byte(what string) (byte, error) {
	if len(d.b) == 0 {
		return 0, decodeError("meta truncated before %s", what)
	}
	c := d.b[0]
	d.b = d.b[1:]
	return c, nil
}

func (d *decoder) uvarint(what string) (uint64, error) {
	return d.varint(what, "")
}

// varint reads a uvarint; what and suffix name it in errors, kept apart so
// that naming costs nothing when nothing fails.
func (d *decoder) varint(what, suffix string) (uint64, error) {
	var x uint64
	var s uint
	for i := 0; i < len(d.b); i++ {
		c := d.b[i]
		if i == binary.MaxVarintLen64 || (i == binary.MaxVarintLen64-1 && c > 1) {
			return 0, decodeError("%s%s overflows", what, suffix)
		}
		if c < 0x80 {
			d.b = d.b[i+1:]
			return x | uint64(c)<<s, nil
		}
		x |= uint64(c&0x7f) << s
		s += 7
	}
	return 0, decodeError("meta truncated in %s%s", what, suffix)
}

// count reads an element count, bounded by the bytes left (every element
// takes at least one byte), so a corrupt count cannot force a huge
// allocation.
func (d *decoder) count(what string) (uint64, error) {
	n, err := d.uvarint(what)
	if err != nil {
		return 0, err
	}
	if n > uint64(len(d.b)) {
		return 0, decodeError("%s %d exceeds the %d bytes left", what, n, len(d.b))
	}
	return n, nil
}

func (d *decoder) str(what string) (string, error) {
	n, err := d.varint(what, " length")
	if err != nil {
		return "", err
	}
	if n > uint64(len(d.b)) {
		return "", decodeError("%s of %d bytes exceeds the %d bytes left", what, n, len(d.b))
	}
	s := d.b[:n]
	d.b = d.b[n:]
	return s, nil
}
