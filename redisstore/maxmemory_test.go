package redisstore_test

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/internal/redistest"
	"github.com/go-idempotency/idempotency/internal/reliability"
	"github.com/go-idempotency/idempotency/redisstore"
	"github.com/redis/go-redis/v9"
)

// fillServer makes the private server behind c full: noeviction, and a
// maxmemory below what it uses. It returns a function that lifts the limit
// again, also called when t ends.
func fillServer(t *testing.T, c *redis.Client) (lift func()) {
	t.Helper()
	if err := c.ConfigSet(ctx, "maxmemory-policy", "noeviction").Err(); err != nil {
		t.Fatal(err)
	}
	if err := c.ConfigSet(ctx, "maxmemory", "1").Err(); err != nil {
		t.Fatal(err)
	}
	lift = func() {
		if err := c.ConfigSet(ctx, "maxmemory", "0").Err(); err != nil {
			t.Error(err)
		}
	}
	t.Cleanup(lift)
	return lift
}

// TestMaxmemoryEdges: on a full server (maxmemory reached, noeviction) a
// record already held can still be extended, completed and replayed, or
// released; only a new record is refused, with ErrStoreFull. Without the
// scripts' flags line (servers before Redis 7) complete and extend are
// refused there too.
func TestMaxmemoryEdges(t *testing.T) {
	c := newClient(t)
	if !privateServer() {
		t.Skip("changes maxmemory: needs a private server, not REDIS_ADDR")
	}
	for _, plain := range []bool{false, true} {
		name := "FlagsLine"
		if plain {
			name = "PlainScripts"
		}
		t.Run(name, func(t *testing.T) {
			s := newStore(t, c)
			if plain {
				redisstore.UsePlainScripts(s)
			}
			held, other := randKey(), randKey()
			mustAcquire(t, s, req(held, "t"), idempotency.Acquired)
			mustAcquire(t, s, req(other, "t"), idempotency.Acquired)
			fillServer(t, c)

			// Reads work: a duplicate sees the live lease.
			mustAcquire(t, s, req(held, "dup"), idempotency.InFlight)
			if _, err := s.Acquire(ctx, req(randKey(), "t")); !errors.Is(err, idempotency.ErrStoreFull) {
				t.Fatalf("Acquire of a new key on a full server = %v, want ErrStoreFull", err)
			}

			extendErr := s.Extend(ctx, held, "t", 20*time.Second)
			if !plain {
				if extendErr != nil {
					t.Fatalf("Extend on a full server: %v", extendErr)
				}
				a := mustAcquire(t, s, req(held, "dup"), idempotency.InFlight)
				if a.LeaseRemaining <= 10*time.Second {
					t.Fatalf("LeaseRemaining %v after Extend(20s) on a full server", a.LeaseRemaining)
				}
			}
			completeErr := s.Complete(ctx, held, "t", sampleResponse(), time.Hour)
			if plain {
				for name, err := range map[string]error{"Extend": extendErr, "Complete": completeErr} {
					if err == nil || !strings.Contains(err.Error(), "OOM") {
						t.Errorf("%s without the flags line on a full server = %v, want an OOM error", name, err)
					}
				}
				if state := recordState(c, s.RecordKey(held)); state != "in_progress" {
					t.Errorf("record state %q after the refused Complete, want in_progress", state)
				}
			} else {
				if completeErr != nil {
					t.Fatalf("Complete on a full server: %v", completeErr)
				}
				a := mustAcquire(t, s, req(held, "dup"), idempotency.Completed)
				if !bytes.Equal(a.Response.Body, sampleResponse().Body) {
					t.Fatalf("replayed body %q", a.Response.Body)
				}
			}

			// Watch writes its mark: refused, so a waiter re-checks at
			// the end of the holder's lease instead.
			if _, stop, err := s.Watch(ctx, other); err == nil {
				stop()
				t.Error("Watch on a full server succeeded; the README says its mark is refused")
			}

			// Release only frees memory: it works either way.
			if err := s.Release(ctx, other, "t"); err != nil {
				t.Fatalf("Release on a full server: %v", err)
			}
			if n := c.Exists(ctx, s.RecordKey(other)).Val(); n != 0 {
				t.Fatal("the released record is still there")
			}
			if _, err := s.Acquire(ctx, req(other, "t2")); !errors.Is(err, idempotency.ErrStoreFull) {
				t.Fatalf("Acquire of the released key on a full server = %v, want ErrStoreFull", err)
			}
		})
	}
}

// TestMaxmemoryOverHTTP: a handler holding its request for several leases
// while the server is full keeps its lease through heartbeats, so a
// duplicate gets 409 rather than a second execution; its response is
// stored and replayed, and only a new key is refused with 503 store_full.
func TestMaxmemoryOverHTTP(t *testing.T) {
	c := newClient(t)
	if !privateServer() {
		t.Skip("changes maxmemory: needs a private server, not REDIS_ADDR")
	}
	s := newStore(t, c)
	const lease = 300 * time.Millisecond
	var calls atomic.Int64
	entered, gate := make(chan struct{}), make(chan struct{})
	var liveAtEnd atomic.Bool
	srv := httptest.NewServer(idempotency.New(s, idempotency.WithLease(lease))(http.HandlerFunc(
		func(w http.ResponseWriter, r *http.Request) {
			n := calls.Add(1)
			if n == 1 {
				close(entered)
				<-gate
				liveAtEnd.Store(r.Context().Err() == nil)
			}
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusCreated)
			fmt.Fprintf(w, `{"call":%d}`, n)
		})))
	defer srv.Close()
	// Opened at the latest when the test ends, so that srv.Close, which
	// waits for the handler, returns after a failure too.
	var once sync.Once
	openGate := func() { once.Do(func() { close(gate) }) }
	defer openGate()

	type result struct {
		status int
		body   []byte
		err    error
	}
	first := make(chan result, 1)
	go func() {
		r, err := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader("pay"))
		if err != nil {
			first <- result{err: err}
			return
		}
		r.Header.Set("Idempotency-Key", "k")
		resp, err := http.DefaultClient.Do(r)
		if err != nil {
			first <- result{err: err}
			return
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		first <- result{resp.StatusCode, body, err}
	}()
	select {
	case <-entered:
	case res := <-first:
		t.Fatalf("first request answered before its handler ran: %d %s %v", res.status, res.body, res.err)
	}
	lift := fillServer(t, c)
	// Only real time shows the heartbeats at work: three leases pass.
	time.Sleep(3 * lease)
	if resp, body := post(t, srv.URL, "k", "pay"); resp.StatusCode != http.StatusConflict {
		t.Fatalf("duplicate after %v on a full server: status %d %s, want 409", 3*lease, resp.StatusCode, body)
	}
	openGate()
	res := <-first
	if res.err != nil {
		t.Fatal(res.err)
	}
	if res.status != http.StatusCreated || string(res.body) != `{"call":1}` {
		t.Fatalf("first request: %d %s", res.status, res.body)
	}
	if !liveAtEnd.Load() {
		t.Fatal("the handler's context was cancelled: its lease was lost")
	}
	// The response is sent before the record is completed.
	rkey := s.RecordKey(idempotency.StorageKey("", "k"))
	if !redistest.WaitFor(5*time.Second, func() bool { return recordState(c, rkey) == "complete" }) {
		t.Fatalf("record not completed on a full server: %v", c.HGetAll(ctx, rkey).Val())
	}
	resp, body := post(t, srv.URL, "k", "pay")
	if resp.StatusCode != http.StatusCreated || resp.Header.Get("Idempotent-Replayed") != "true" || string(body) != `{"call":1}` {
		t.Fatalf("duplicate after completion: %d %v %s; want the replay of the first response", resp.StatusCode, resp.Header, body)
	}
	if n := calls.Load(); n != 1 {
		t.Fatalf("handler ran %d times, want 1", n)
	}
	resp, body = post(t, srv.URL, "new", "pay")
	if resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(string(body), `"code":"store_full"`) {
		t.Fatalf("new key on a full server: %d %s, want 503 store_full", resp.StatusCode, body)
	}
	// With room again, the record is still the completed one: a duplicate
	// is replayed, not run again.
	lift()
	resp, body = post(t, srv.URL, "k", "pay")
	if resp.StatusCode != http.StatusCreated || resp.Header.Get("Idempotent-Replayed") != "true" || string(body) != `{"call":1}` {
		t.Fatalf("duplicate once the server has room: %d %v %s; want the replay", resp.StatusCode, resp.Header, body)
	}
	if n := calls.Load(); n != 1 {
		t.Fatalf("handler ran %d times, want 1", n)
	}
	reliability.Report(t, reliability.Result{Scenario: "fault: Redis at maxmemory (noeviction)", Store: "redis",
		Operations: 5, Faults: 1,
		Note: "heartbeats and complete of a taken record land, duplicates 409 then replay, new key 503 store_full; 1 execution"})
}
