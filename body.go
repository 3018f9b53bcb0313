package idempotency

import (
	"bytes"
	"errors"
	"io"
	"net/http"
	"sync"
)

// Why readBody refused a request body.
var (
	errBodyTooLarge   = errors.New("idempotency: request body too large")
	errBodyUnreadable = errors.New("idempotency: request body unreadable")
)

// requestBody is the request body the middleware read to fingerprint it,
// handed to the handler to read again. Its buffer comes from a pool and goes
// back when the middleware returns; the reader is emptied then, so a handler
// that kept the body reads nothing rather than another request's bytes.
type requestBody struct {
	bytes.Reader
	buf *[]byte // from bodyPool
}

// Close does nothing: the body was read already.
func (*requestBody) Close() error { return nil }

// free empties the reader and returns its buffer to the pool.
func (b *requestBody) free() {
	b.Reset(nil)
	putBuffer(b.buf, *b.buf)
	b.buf = nil
}

// putBuffer returns buf to the pool holding b, the buffer it grew into,
// unless b grew unusually large.
func putBuffer(buf *[]byte, b []byte) {
	if cap(b) <= maxPooledBody {
		*buf = b[:0]
		bodyPool.Put(buf)
	}
}

// maxPooledBody keeps unusually large buffers out of the pool; a 64 KiB
// body still fits.
const maxPooledBody = 64 << 10

var bodyPool = sync.Pool{New: func() any { b := make([]byte, 0, 2<<10); return &b }}

// readBody reads r's body, at most limit bytes, and replaces r.Body with a
// requestBody holding them; the caller frees it when the handler is done. It
// returns nil for a request without a body, errBodyTooLarge for a body over
// limit and errBodyUnreadable when reading failed (a client that hung up, a
// body shorter than its Content-Length).
//
// The buffer grows with the bytes that arrive, doubling at most: a declared
// Content-Length caps it but allocates nothing ahead of the bytes, so a
// client that declares a megabyte and sends a byte costs the pooled buffer.
func readBody(r *http.Request, limit int64) (*requestBody, error) {
	if r.Body == nil || r.Body == http.NoBody {
		return nil, nil
	}
	if r.ContentLength > limit {
		return nil, errBodyTooLarge
	}
	buf := bodyPool.Get().(*[]byte)
	b := (*buf)[:0]
	for {
		if len(b) == cap(b) {
			if r.ContentLength >= 0 && int64(len(b)) >= r.ContentLength {
				// All the declared bytes are in: a read into a byte of
				// its own sees EOF without growing the buffer.
				var probe [1]byte
				n, err := io.ReadFull(r.Body, probe[:])
				if n == 0 && err == io.EOF {
					break
				}
				b = append(b, probe[:n]...)
				if err != nil && err != io.EOF {
					putBuffer(buf, b)
					return nil, errBodyUnreadable
				}
				continue
			}
			// Double, but never past the limit (plus the byte that
			// shows the body is over it) or the declared length.
			grow := int64(max(cap(b), 512))
			grow = min(grow, limit+1-int64(len(b)))
			if r.ContentLength >= 0 {
				grow = min(grow, r.ContentLength-int64(len(b)))
			}
			nb := make([]byte, len(b), len(b)+int(grow)) // exactly: slices.Grow rounds up past the pool's bound
			copy(nb, b)
			b = nb
		}
		n, err := r.Body.Read(b[len(b):cap(b)])
		b = b[:len(b)+n]
		if int64(len(b)) > limit {
			putBuffer(buf, b)
			return nil, errBodyTooLarge
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			putBuffer(buf, b)
			return nil, errBodyUnreadable
		}
	}
	*buf = b
	body := &requestBody{buf: buf}
	body.Reset(b)
	r.Body = body
	return body, nil
}
