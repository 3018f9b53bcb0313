package idempotency

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"sync"
)

// recorder is the one http.ResponseWriter wrapper of the middleware. It
// passes every write through to the client as the handler makes it and
// captures what is stored: the status, the headers as they were when the
// status was written (the snapshot rule of httptest.ResponseRecorder), and
// the body up to the store cap. Every write path goes through it: Write,
// WriteString, WriteHeader, ReadFrom (io.Copy), Flush and Hijack; Unwrap
// lets http.ResponseController reach the rest.
type recorder struct {
	w      http.ResponseWriter
	status int
	header http.Header
	body   []byte
	limit  int

	wroteHeader bool
	omitted     bool
	hijacked    bool
	setCookie   bool
}

var recorderPool = sync.Pool{New: func() any { return new(recorder) }}

func newRecorder(w http.ResponseWriter, limit int, storeSetCookie bool) *recorder {
	rec := recorderPool.Get().(*recorder)
	rec.w = w
	rec.limit = limit
	rec.setCookie = storeSetCookie
	return rec
}

func (rec *recorder) free() {
	*rec = recorder{}
	recorderPool.Put(rec)
}

// Header returns the client's header map: headers the handler sets are sent
// as usual.
func (rec *recorder) Header() http.Header { return rec.w.Header() }

// WriteHeader passes the status through and takes the header snapshot.
// Informational statuses (1xx but 101) pass through without ending the
// header phase, as net/http does. Later calls are dropped, as net/http
// drops them (without its log line, which would name this file).
func (rec *recorder) WriteHeader(code int) {
	if rec.wroteHeader {
		return
	}
	if code >= 100 && code <= 199 && code != http.StatusSwitchingProtocols {
		rec.w.WriteHeader(code)
		return
	}
	rec.wroteHeader = true
	rec.status = code
	rec.header = storedHeader(rec.w.Header(), rec.setCookie)
	rec.w.WriteHeader(code)
}

func (rec *recorder) Write(p []byte) (int, error) {
	if !rec.wroteHeader {
		rec.WriteHeader(http.StatusOK)
	}
	n, err := rec.w.Write(p)
	rec.capture(p[:n])
	return n, err
}

// WriteString avoids a copy for handlers that use io.WriteString.
func (rec *recorder) WriteString(s string) (int, error) {
	if !rec.wroteHeader {
		rec.WriteHeader(http.StatusOK)
	}
	n, err := io.WriteString(rec.w, s)
	if !rec.omitted {
		if len(rec.body)+n > rec.limit {
			rec.omit()
		} else {
			rec.body = append(rec.body, s[:n]...)
		}
	}
	return n, err
}

func (rec *recorder) capture(p []byte) {
	if rec.omitted {
		return
	}
	if len(rec.body)+len(p) > rec.limit {
		rec.omit()
		return
	}
	if rec.body == nil {
		rec.body = make([]byte, 0, rec.sizeHint(len(p)))
	}
	rec.body = append(rec.body, p...)
}

// sizeHint sizes the capture buffer from Content-Length when the handler
// declared it, so that the stored body is built in one allocation.
func (rec *recorder) sizeHint(first int) int {
	if rec.header != nil {
		if cl := rec.header.Get("Content-Length"); cl != "" {
			n := 0
			for i := 0; i < len(cl); i++ {
				c := cl[i]
				if c < '0' || c > '9' || n > rec.limit {
					return first
				}
				n = n*10 + int(c-'0')
			}
			if n >= first && n <= rec.limit {
				return n
			}
		}
	}
	return first
}

func (rec *recorder) omit() {
	rec.omitted = true
	rec.body = nil
}

// writerOnly hides ReadFrom so that ReadFrom's copy loop calls Write.
type writerOnly struct{ io.Writer }

var copyBufPool = sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}

// ReadFrom copies src through Write, so io.Copy is captured like any write.
func (rec *recorder) ReadFrom(src io.Reader) (int64, error) {
	bp := copyBufPool.Get().(*[]byte)
	defer copyBufPool.Put(bp)
	return io.CopyBuffer(writerOnly{rec}, src, *bp)
}

// FlushError flushes the client's response; a streaming handler's output
// passes through live and is stored afterwards under the same cap.
func (rec *recorder) FlushError() error {
	if !rec.wroteHeader {
		rec.WriteHeader(http.StatusOK)
	}
	return http.NewResponseController(rec.w).Flush()
}

// Flush implements http.Flusher.
func (rec *recorder) Flush() { _ = rec.FlushError() }

// Hijack hands the connection to the handler. The response then cannot be
// known, so the key is released when the handler returns.
func (rec *recorder) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	conn, brw, err := http.NewResponseController(rec.w).Hijack()
	if err == nil {
		rec.hijacked = true
	}
	return conn, brw, err
}

// Unwrap returns the client's ResponseWriter, for http.ResponseController.
func (rec *recorder) Unwrap() http.ResponseWriter { return rec.w }

// finish closes the capture: a handler that wrote nothing sent 200 with the
// headers it had set when it returned.
func (rec *recorder) finish() {
	if !rec.wroteHeader {
		rec.wroteHeader = true
		rec.status = http.StatusOK
		rec.header = storedHeader(rec.w.Header(), rec.setCookie)
	}
}

// response returns the stored form of what was captured.
func (rec *recorder) response() *Response {
	return &Response{Status: rec.status, Header: rec.header, Body: rec.body, BodyOmitted: rec.omitted}
}
