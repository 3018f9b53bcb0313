package pgbench

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

var ctx = context.Background()

// discardWriter is a reusable http.ResponseWriter that discards the body.
type discardWriter struct {
	h      http.Header
	status int
}

func (w *discardWriter) Header() http.Header         { return w.h }
func (w *discardWriter) WriteHeader(code int)        { w.status = code }
func (w *discardWriter) Write(p []byte) (int, error) { return len(p), nil }
func (w *discardWriter) reset()                      { clear(w.h); w.status = 0 }

type rewindBody struct{ bytes.Reader }

func (*rewindBody) Close() error { return nil }

// reqBody is the body of every request.
var reqBody = []byte(`{"amount":"10.00","currency":"EUR"}`)

// requester returns a function that sends request i, with the
// Idempotency-Key key(i), to h and returns how long it took and the status
// it got. It reuses one request and one writer, so each goroutine needs
// its own.
func requester(h http.Handler, key func(int) []string) func(i int) (time.Duration, int) {
	r, _ := http.NewRequest(http.MethodPost, "http://example.com/payments", nil)
	body := &rewindBody{}
	w := &discardWriter{h: http.Header{}}
	return func(i int) (time.Duration, int) {
		body.Reset(reqBody)
		r.Body, r.ContentLength = body, int64(len(reqBody))
		r.Header["Idempotency-Key"] = key(i)
		w.reset()
		start := time.Now()
		h.ServeHTTP(w, r)
		return time.Since(start), w.status
	}
}

// runPhase runs f(g, r) for r < perGoroutine in each of goroutines
// goroutines g, and returns how long the phase took.
func runPhase(goroutines, perGoroutine int, f func(g, r int)) time.Duration {
	var wg sync.WaitGroup
	start := time.Now()
	for g := range goroutines {
		wg.Go(func() {
			for r := range perGoroutine {
				f(g, r)
			}
		})
	}
	wg.Wait()
	return time.Since(start)
}

// prepare runs f(j) for every j < n from a few goroutines, and returns
// the first error.
func prepare(n int, f func(j int) error) error {
	var next atomic.Int64
	var first atomic.Value
	runPhase(8, 1, func(int, int) {
		for j := int(next.Add(1) - 1); j < n; j = int(next.Add(1) - 1) {
			if err := f(j); err != nil {
				first.CompareAndSwap(nil, err)
				return
			}
		}
	})
	if err, ok := first.Load().(error); ok {
		return err
	}
	return nil
}

// keys returns n keys of 64 characters (the length of the middleware's
// storage keys), unique to the call, each as a header value.
func keys(n int) [][]string {
	var b [24]byte
	_, _ = rand.Read(b[:])
	prefix := hex.EncodeToString(b[:])
	out := make([][]string, n)
	for j := range out {
		out[j] = []string{fmt.Sprintf("%s%016d", prefix, j)}
	}
	return out
}
