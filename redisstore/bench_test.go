package redisstore_test

import (
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/redis/go-redis/v9"
)

// floorScript is the cheapest possible script: one EVALSHA round trip is
// the floor every store operation is measured against.
var floorScript = redis.NewScript(`return {1}`)

// BenchmarkEvalShaFloor measures one EVALSHA of a trivial script.
func BenchmarkEvalShaFloor(b *testing.B) {
	c := newClient(b)
	if err := floorScript.Run(ctx, c, []string{"k"}).Err(); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if err := floorScript.Run(ctx, c, []string{"k"}).Err(); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkAcquireReplay measures Acquire on a COMPLETE record: a replay.
func BenchmarkAcquireReplay(b *testing.B) {
	s := newStore(b, newClient(b))
	key := randKey()
	mustAcquire(b, s, req(key, "t1"), idempotency.Acquired)
	if err := s.Complete(ctx, key, "t1", sampleResponse(), time.Hour); err != nil {
		b.Fatal(err)
	}
	r := req(key, "t2")
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		a, err := s.Acquire(ctx, r)
		if err != nil || a.Outcome != idempotency.Completed {
			b.Fatal(a.Outcome, err)
		}
	}
}

// BenchmarkAcquireComplete measures a first execution: Acquire on a new key
// then Complete.
func BenchmarkAcquireComplete(b *testing.B) {
	s := newStore(b, newClient(b))
	resp := sampleResponse()
	keys := make([]string, b.N)
	for i := range keys {
		keys[i] = randKey()
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		a, err := s.Acquire(ctx, req(keys[i], "t1"))
		if err != nil || a.Outcome != idempotency.Acquired {
			b.Fatal(a.Outcome, err)
		}
		if err := s.Complete(ctx, keys[i], "t1", resp, time.Hour); err != nil {
			b.Fatal(err)
		}
	}
}

func benchHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		w.Write([]byte(`{"id":"pay_123","amount":"10.00","currency":"EUR"}`))
	})
}

func benchRequest(key string) *http.Request {
	r := httptest.NewRequest(http.MethodPost, "/payments", strings.NewReader(`{"amount":"10.00"}`))
	r.Header.Set("Idempotency-Key", key)
	return r
}

// BenchmarkMiddlewareFirstExecution measures a covered request with a new
// key through the middleware over Redis.
func BenchmarkMiddlewareFirstExecution(b *testing.B) {
	s := newStore(b, newClient(b))
	h := idempotency.New(s)(benchHandler())
	reqs := make([]*http.Request, b.N)
	for i := range reqs {
		reqs[i] = benchRequest("first-" + strconv.Itoa(i))
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, reqs[i])
		if w.Code != http.StatusCreated {
			b.Fatal(w.Code)
		}
	}
}

// BenchmarkMiddlewareReplay measures a duplicate replayed through the
// middleware over Redis.
func BenchmarkMiddlewareReplay(b *testing.B) {
	s := newStore(b, newClient(b))
	h := idempotency.New(s)(benchHandler())
	w := httptest.NewRecorder()
	h.ServeHTTP(w, benchRequest("replay"))
	if w.Code != http.StatusCreated {
		b.Fatal(w.Code)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, benchRequest("replay"))
		if w.Header().Get("Idempotent-Replayed") != "true" {
			b.Fatal(w.Code)
		}
	}
}
