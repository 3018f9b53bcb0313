package load

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// HeaderKind is the request header the driver sets to the kind of each
// request ("new" or "dup"), so that a record floor knows whether to write
// a record or read one. Other servers ignore it.
const HeaderKind = "X-Load-Kind"

// Payload returns a response body of size bytes: a JSON document padded
// with spaces, so that it stays valid JSON whatever the size.
func Payload(size int) []byte {
	const doc = `{"id":"pay_123","amount":"10.00","currency":"EUR"}`
	if size <= len(doc) {
		return []byte(doc[:size])
	}
	return append([]byte(doc), bytes.Repeat([]byte(" "), size-len(doc))...)
}

// Handler returns the handler every measurement wraps: it reads the request
// body and answers 201 with a JSON content type, a declared length and
// payload.
func Handler(payload []byte) http.Handler {
	length := []string{strconv.Itoa(len(payload))}
	ctype := []string{"application/json"}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		h := w.Header()
		h["Content-Type"] = ctype
		h["Content-Length"] = length
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write(payload)
	})
}

// The record floors' scripts do the least any store that keeps its records
// in Redis hashes must do, and check nothing: RecordNewScript creates a
// record with an expiry (KEYS[1]; ARGV[1] the expiry in ms),
// RecordDoneScript stores a payload in it (ARGV[2] meta, ARGV[3] body) and
// RecordReadScript reads the payload back.
var (
	RecordNewScript  = redis.NewScript(`redis.call('HSET', KEYS[1], 'state', 'in_progress') redis.call('PEXPIRE', KEYS[1], ARGV[1]) return {1}`)
	RecordDoneScript = redis.NewScript(`redis.call('HSET', KEYS[1], 'state', 'complete', 'meta', ARGV[2], 'body', ARGV[3]) redis.call('PEXPIRE', KEYS[1], ARGV[1]) return {1}`)
	RecordReadScript = redis.NewScript(`return redis.call('HMGET', KEYS[1], 'meta', 'body')`)
)

// RecordFloorHandler returns the record floor over HTTP: the handler of
// Handler with the record floor's scripts (RecordNewScript,
// RecordDoneScript, RecordReadScript) on a hash named prefix plus the
// request's Idempotency-Key, kept for ttl. A first execution creates the
// record, runs the handler, flushes its response (as the middleware does
// before it stores it) and stores the payload with a meta block of the
// size redisstore keeps; a duplicate reads the payload back and answers
// with it without running the handler. It checks nothing: it is the least
// a store keeping its records in Redis hashes does, over HTTP.
func RecordFloorHandler(c redis.UniversalClient, prefix string, payload []byte, ttl time.Duration) http.Handler {
	next := Handler(payload)
	ms := strconv.FormatInt(ttl.Milliseconds(), 10)
	meta := bytes.Repeat([]byte("m"), 40)
	ctype := []string{"application/json"}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key := []string{prefix + r.Header.Get("Idempotency-Key")}
		if r.Header.Get(HeaderKind) == "dup" {
			_, _ = io.Copy(io.Discard, r.Body) // the middleware reads it for the fingerprint
			v, err := RecordReadScript.Run(r.Context(), c, key).Slice()
			if err != nil {
				http.Error(w, err.Error(), http.StatusServiceUnavailable)
				return
			}
			body := payload
			if len(v) == 2 {
				if b, ok := v[1].(string); ok {
					body = []byte(b)
				}
			}
			h := w.Header()
			h["Content-Type"] = ctype
			h["Content-Length"] = []string{strconv.Itoa(len(body))}
			w.WriteHeader(http.StatusCreated)
			_, _ = w.Write(body)
			return
		}
		if err := RecordNewScript.Run(r.Context(), c, key, ms).Err(); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		next.ServeHTTP(w, r)
		_ = http.NewResponseController(w).Flush()
		// The response is written: a failed second trip (a client cut off
		// when a run's time is up) can change nothing in it.
		_ = RecordDoneScript.Run(r.Context(), c, key, ms, meta, payload).Err()
	})
}

// Server is an HTTP server on a loopback port.
type Server struct {
	URL string
	srv *http.Server
	ln  net.Listener
}

// Serve starts serving h on 127.0.0.1 on a free port.
func Serve(h http.Handler) (*Server, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	s := &Server{URL: "http://" + ln.Addr().String(), srv: &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}, ln: ln}
	go func() { _ = s.srv.Serve(ln) }()
	return s, nil
}

// Close stops the server and waits for its connections to close.
func (s *Server) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err := s.srv.Shutdown(ctx)
	if errors.Is(err, context.DeadlineExceeded) {
		return s.srv.Close()
	}
	return err
}

// Loopback reports whether addr (host:port) names a loopback address.
func Loopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
