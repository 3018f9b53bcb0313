package idempotency

import (
	"bufio"
	"errors"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync"
)

// holdLimit is how much of a response the recorder holds back before it
// sends anything. A response that fits is sent when the handler returns,
// with a Content-Length, and flushed before the middleware writes the store,
// so its client has all of it while the record is stored (net/http itself
// holds back 2 KiB for a Content-Length). A larger response, or one the
// handler flushes, passes through as the handler writes it. Held bytes cost
// no memory of their own: they are the captured body.
const holdLimit = 8 << 10

// recorder is the one http.ResponseWriter wrapper of the middleware. It
// captures what is stored: the status, the headers the handler set as they
// were when the status was written (the snapshot rule of
// httptest.ResponseRecorder), up to the header cap, and the body the
// handler wrote, up to the body cap. Every write path goes
// through it: Write, WriteHeader, ReadFrom (io.Copy), Flush and Hijack;
// Unwrap lets http.ResponseController reach the rest.
//
// The record must hold what the handler wrote, never less: a write that does
// not reach the client (it hung up, or the server's WriteTimeout passed) is
// captured all the same. But a handler that sees such an error may stop
// writing, so the body is stored only when it is known to be whole: the
// handler returned without a write or flush failing, or the body has the
// length its Content-Length declares. Otherwise the record is stored with
// its body omitted, as for a body over the cap.
type recorder struct {
	w           http.ResponseWriter
	limit       int          // the body cap
	headerLimit int          // the header cap (see headerSize)
	policy      headerPolicy // which headers are stored
	before      http.Header  // the headers set before the middleware ran, which are not the handler's
	head        bool         // the request is a HEAD
	whole       bool         // hold the whole response until release (transactional routes)

	status int
	header http.Header // stored: as it was when the status was written
	late   http.Header // what Header returns after the status, while held
	body   []byte      // what the handler wrote, up to limit

	wroteHeader bool // the status is known
	passing     bool // the status went to w; writes go through
	omitted     bool // the body is over the cap
	headerOver  bool // the stored headers are over their cap: neither they nor the body are stored
	failed      bool // a write or flush to the client failed while the handler ran
	hijacked    bool
	tooLarge    bool // whole: the response went over the cap
	finished    bool // finish ran
}

// Errors a handler's writes get on a transactional route (see
// WithTransaction), where the response is held until the commit.
var (
	errResponseTooLarge = errors.New("idempotency: the response is over the store cap of a transactional route")
	errHijackHeld       = errors.New("idempotency: a transactional route cannot hand over its connection")
)

// Header returns the client's header map. Once the status is written and
// while the response is held back, it returns a copy instead, so that, as
// with net/http, changes made after the status do not reach the client
// (trailers excepted, which finish passes on).
func (rec *recorder) Header() http.Header {
	if rec.wroteHeader && (!rec.passing || rec.late != nil) {
		if rec.late == nil {
			rec.late = rec.w.Header().Clone()
			if rec.late == nil {
				rec.late = http.Header{}
			}
		}
		return rec.late
	}
	return rec.w.Header()
}

// WriteHeader takes the status and the header snapshot. Informational
// statuses (1xx but 101) pass through without ending the header phase, as
// net/http does. Later calls are dropped, as net/http drops them (without
// its log line, which would name this file).
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
	rec.header = rec.policy.stored(rec.w.Header(), rec.before)
	if headerSize(rec.header) > rec.headerLimit {
		rec.header, rec.headerOver = nil, true
		rec.omitted = true // nothing of the body is kept either
		if rec.whole {
			rec.tooLarge = true
		}
	}
	if code == http.StatusSwitchingProtocols {
		rec.pass(false)
	}
}

// Write captures p and sends it, or holds it back while the response fits
// in holdLimit.
func (rec *recorder) Write(p []byte) (int, error) {
	if !rec.wroteHeader {
		rec.WriteHeader(http.StatusOK)
	}
	if rec.whole {
		if rec.tooLarge || len(rec.body)+len(p) > rec.limit {
			rec.tooLarge = true
			return 0, errResponseTooLarge
		}
		rec.body = append(rec.body, p...)
		return len(p), nil
	}
	if !rec.passing {
		if !rec.omitted && len(rec.body)+len(p) <= min(holdLimit, rec.limit) {
			rec.body = append(rec.body, p...)
			return len(p), nil
		}
		if err := rec.pass(false); err != nil {
			rec.failed = true
		}
	}
	n, err := rec.w.Write(p)
	if err != nil || n < len(p) {
		rec.failed = true
	}
	rec.capture(p)
	return n, err
}

// capture adds p to the stored body, or omits the body once it is over the
// cap.
func (rec *recorder) capture(p []byte) {
	if rec.omitted {
		return
	}
	if len(rec.body)+len(p) > rec.limit {
		rec.omitted = true
		rec.body = nil
		return
	}
	rec.body = append(rec.body, p...)
}

// pass sends the status, the header as it was when the status was written
// and the held bytes. When the handler has returned (final), it first gives
// the response a Content-Length where net/http would: the client then knows
// the response is whole without waiting for the end of the handler's turn.
func (rec *recorder) pass(final bool) error {
	rec.passing = true
	if final && rec.canDeclareLength() {
		rec.w.Header().Set("Content-Length", strconv.Itoa(len(rec.body)))
	}
	rec.w.WriteHeader(rec.status)
	if len(rec.body) == 0 || rec.omitted {
		return nil
	}
	_, err := rec.w.Write(rec.body)
	return err
}

// canDeclareLength reports whether a held response may be given a
// Content-Length: the rule net/http applies to a response the handler
// finished within its buffer.
func (rec *recorder) canDeclareLength() bool {
	h := rec.w.Header()
	if !bodyAllowed(rec.status) || (rec.head && len(rec.body) == 0) ||
		h.Get("Content-Length") != "" || h.Get("Transfer-Encoding") != "" || h.Get("Trailer") != "" {
		return false
	}
	for k := range h {
		if isTrailer(k) {
			return false
		}
	}
	return true
}

// bodyAllowed reports whether a response with status may have a body.
func bodyAllowed(status int) bool {
	return (status < 100 || status > 199) && status != http.StatusNoContent && status != http.StatusNotModified
}

// writerOnly hides ReadFrom, so that io.Copy in ReadFrom calls Write.
type writerOnly struct{ io.Writer }

var copyBuffers = sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}

// ReadFrom copies src through Write, so io.Copy is captured like any write.
func (rec *recorder) ReadFrom(src io.Reader) (int64, error) {
	buf := copyBuffers.Get().(*[]byte)
	defer copyBuffers.Put(buf)
	return io.CopyBuffer(writerOnly{rec}, src, *buf)
}

// FlushError sends what is held and flushes the client's response: a
// streaming handler's output passes through live and is stored afterwards
// under the same cap.
func (rec *recorder) FlushError() error {
	if !rec.wroteHeader {
		rec.WriteHeader(http.StatusOK)
	}
	if rec.whole {
		return nil // held until the commit
	}
	var err error
	if !rec.passing {
		err = rec.pass(false)
	}
	if ferr := http.NewResponseController(rec.w).Flush(); err == nil {
		err = ferr
	}
	if err != nil && !errors.Is(err, http.ErrNotSupported) {
		rec.failed = true
	}
	return err
}

// Flush implements http.Flusher.
func (rec *recorder) Flush() { _ = rec.FlushError() }

// Hijack hands the connection to the handler, after what is held. The
// response then cannot be known, so the key is released when the handler
// returns.
func (rec *recorder) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	if rec.whole {
		return nil, nil, errHijackHeld
	}
	if rec.wroteHeader && !rec.passing {
		rec.pass(false)
	}
	conn, brw, err := http.NewResponseController(rec.w).Hijack()
	if err == nil {
		rec.hijacked = true
	}
	return conn, brw, err
}

// Unwrap returns the client's ResponseWriter, for http.ResponseController.
func (rec *recorder) Unwrap() http.ResponseWriter { return rec.w }

// finish ends the response once the handler has returned: a handler that
// wrote nothing sent 200 with the headers it had set; trailers set after the
// status are passed on; what is held is sent, and everything is flushed, so
// the client has the response before the middleware writes the store.
// Later calls do nothing.
func (rec *recorder) finish() {
	if rec.hijacked || rec.finished {
		return
	}
	rec.finished = true
	if !rec.wroteHeader {
		rec.WriteHeader(http.StatusOK)
	}
	if rec.late != nil {
		rec.passTrailers()
	}
	if !rec.passing {
		rec.pass(true)
	}
	_ = http.NewResponseController(rec.w).Flush()
}

// passTrailers copies to the client's header map the trailers the handler
// set in the copy Header returned after the status: those with net/http's
// prefix and those the Trailer header declared.
func (rec *recorder) passTrailers() {
	h := rec.w.Header()
	declared := map[string]bool{}
	for _, v := range h.Values("Trailer") {
		for _, name := range splitList(v) {
			declared[http.CanonicalHeaderKey(name)] = true
		}
	}
	for k, vv := range rec.late {
		if isTrailer(k) || declared[http.CanonicalHeaderKey(k)] {
			h[k] = vv
		}
	}
}

// response returns the stored form of what was captured: the body only when
// it is known to be whole (see recorder).
func (rec *recorder) response() *Response {
	if rec.headerOver {
		return &Response{Status: rec.status, BodyOmitted: true, HeaderOmitted: true}
	}
	if !rec.bodyWhole() {
		return &Response{Status: rec.status, Header: rec.header, BodyOmitted: true}
	}
	return &Response{Status: rec.status, Header: rec.header, Body: rec.body}
}

// bodyWhole reports whether the captured body is the whole body the handler
// meant to send: not over the cap, and either of the length the handler
// declared or written without an error from the client's side.
func (rec *recorder) bodyWhole() bool {
	if rec.omitted {
		return false
	}
	if !bodyAllowed(rec.status) || rec.head {
		return true
	}
	if cl := rec.header.Get("Content-Length"); cl != "" {
		n, err := strconv.ParseInt(cl, 10, 64)
		return err == nil && n == int64(len(rec.body))
	}
	return !rec.failed
}
