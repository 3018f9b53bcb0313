package idempotency_test

import (
	"bytes"
	"fmt"
	"net/http"
	"strconv"
	"sync/atomic"
	"testing"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/memstore"
)

// benchWriter is a reusable http.ResponseWriter that discards the body, so
// that benchmarks measure the middleware rather than a recorder.
type benchWriter struct {
	h      http.Header
	status int
	n      int
}

func (w *benchWriter) Header() http.Header         { return w.h }
func (w *benchWriter) WriteHeader(code int)        { w.status = code }
func (w *benchWriter) Write(p []byte) (int, error) { w.n += len(p); return len(p), nil }
func (w *benchWriter) reset()                      { clear(w.h); w.status, w.n = 0, 0 }

// benchBody is a reusable request body.
type benchBody struct{ bytes.Reader }

func (*benchBody) Close() error { return nil }

// payloadHandler answers 201 with a JSON content type and payload.
func payloadHandler(payload []byte) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		w.Write(payload)
	})
}

var benchSizes = []int{0, 1 << 10, 64 << 10}

func benchStore(b *testing.B) *memstore.Store {
	s := memstore.New(memstore.WithMaxEntries(1<<26), memstore.WithMaxBytes(1<<40))
	b.Cleanup(func() { s.Close() })
	return s
}

// benchKeys returns n distinct header values.
func benchKeys(prefix string, n int) [][]string {
	keys := make([][]string, n)
	for i := range keys {
		keys[i] = []string{prefix + strconv.Itoa(i)}
	}
	return keys
}

type benchCase struct {
	name string
	// prepare runs once and returns the handler and a function giving the
	// key of iteration i (nil: no key).
	prepare func(b *testing.B, payload []byte, n int) (http.Handler, func(i int) []string)
}

var benchCases = []benchCase{
	{"Bare", func(b *testing.B, payload []byte, n int) (http.Handler, func(int) []string) {
		return payloadHandler(payload), func(int) []string { return nil }
	}},
	{"FirstExecution", func(b *testing.B, payload []byte, n int) (http.Handler, func(int) []string) {
		keys := benchKeys(fmt.Sprintf("first-%d-", b.N), n)
		return idempotency.New(benchStore(b))(payloadHandler(payload)), func(i int) []string { return keys[i] }
	}},
	{"Replay", func(b *testing.B, payload []byte, n int) (http.Handler, func(int) []string) {
		h := idempotency.New(benchStore(b))(payloadHandler(payload))
		key := []string{"replayed"}
		serveOnce(h, key, payload)
		return h, func(int) []string { return key }
	}},
	{"Conflict", func(b *testing.B, payload []byte, n int) (http.Handler, func(int) []string) {
		s := benchStore(b)
		held := make(chan struct{})
		b.Cleanup(func() { close(held) })
		entered := make(chan struct{})
		slow := idempotency.New(s)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			close(entered)
			<-held
		}))
		key := []string{"held"}
		go serveOnce(slow, key, payload)
		<-entered
		return idempotency.New(s)(payloadHandler(payload)), func(int) []string { return key }
	}},
	{"Mismatch", func(b *testing.B, payload []byte, n int) (http.Handler, func(int) []string) {
		h := idempotency.New(benchStore(b))(payloadHandler(payload))
		key := []string{"mismatched"}
		serveOnce(h, key, []byte("another body"))
		return h, func(int) []string { return key }
	}},
}

func serveOnce(h http.Handler, key []string, body []byte) {
	req, _ := http.NewRequest(http.MethodPost, "http://example.com/payments", bytes.NewReader(body))
	req.Header["Idempotency-Key"] = key
	h.ServeHTTP(&benchWriter{h: http.Header{}}, req)
}

// BenchmarkMiddleware measures one request through the middleware on
// memstore, in process, beside the bare handler. Run with -benchmem.
func BenchmarkMiddleware(b *testing.B) {
	for _, size := range benchSizes {
		payload := bytes.Repeat([]byte("x"), size)
		for _, bc := range benchCases {
			b.Run(fmt.Sprintf("%s/body=%d", bc.name, size), func(b *testing.B) {
				h, key := bc.prepare(b, payload, b.N)
				req, _ := http.NewRequest(http.MethodPost, "http://example.com/payments", nil)
				body := &benchBody{}
				w := &benchWriter{h: http.Header{}}
				b.ReportAllocs()
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					body.Reset(payload)
					req.Body = body
					req.ContentLength = int64(len(payload))
					if k := key(i); k != nil {
						req.Header["Idempotency-Key"] = k
					}
					w.reset()
					h.ServeHTTP(w, req)
				}
			})
		}
	}
}

// BenchmarkMiddlewareParallel is BenchmarkMiddleware with concurrent
// requests (run with -cpu 1,2,4 to see the scaling).
func BenchmarkMiddlewareParallel(b *testing.B) {
	payload := bytes.Repeat([]byte("x"), 1<<10)
	for _, bc := range benchCases {
		b.Run(bc.name, func(b *testing.B) {
			h, key := bc.prepare(b, payload, b.N+1024)
			var next atomic.Int64
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				req, _ := http.NewRequest(http.MethodPost, "http://example.com/payments", nil)
				body := &benchBody{}
				w := &benchWriter{h: http.Header{}}
				for pb.Next() {
					body.Reset(payload)
					req.Body = body
					req.ContentLength = int64(len(payload))
					if k := key(int(next.Add(1) - 1)); k != nil {
						req.Header["Idempotency-Key"] = k
					}
					w.reset()
					h.ServeHTTP(w, req)
				}
			})
		})
	}
}
