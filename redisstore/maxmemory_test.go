package redisstore_test

import (
	"bytes"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
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
// released; only a new record is refused, with ErrStoreFull. A payload
// within the allowance is stored in full there, in one round trip; a
// larger one is refused by Redis and stored marked in a second round trip:
// its status and headers when they fit in the allowance, else its status
// alone. Without the scripts' flags line (servers before Redis 7) complete
// and extend are refused there, whatever the payload's size.
func TestMaxmemoryEdges(t *testing.T) {
	c := hookedClient(t, redistest.Addr(t))
	if !privateServer() {
		t.Skip("changes maxmemory: needs a private server, not REDIS_ADDR")
	}
	counter := &commandCounter{}
	c.AddHook(counter)
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
			// Load both complete scripts while there is room, so the
			// round trips counted below are the calls' own.
			for _, resp := range []*idempotency.Response{sampleResponse(), largeBodyResponse()} {
				warm := randKey()
				mustAcquire(t, s, req(warm, "t"), idempotency.Acquired)
				if err := s.Complete(ctx, warm, "t", resp, time.Hour); err != nil {
					t.Fatal(err)
				}
			}
			held, bigBody, bigHeader, other := randKey(), randKey(), randKey(), randKey()
			for _, key := range []string{held, bigBody, bigHeader, other} {
				mustAcquire(t, s, req(key, "t"), idempotency.Acquired)
			}
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
			} else if extendErr == nil || !strings.Contains(extendErr.Error(), "OOM") {
				t.Errorf("Extend without the flags line on a full server = %v, want an OOM error", extendErr)
			}

			for _, tc := range []struct {
				name         string
				key          string
				resp, replay *idempotency.Response
				roundTrips   int64
			}{
				{"WithinAllowance", held, sampleResponse(), sampleResponse(), 1},
				{"LargeBody", bigBody, largeBodyResponse(), &idempotency.Response{
					Status: largeBodyResponse().Status, Header: largeBodyResponse().Header, BodyOmitted: true,
				}, 2},
				{"LargeHeader", bigHeader, largeHeaderResponse(), &idempotency.Response{
					Status: largeHeaderResponse().Status, BodyOmitted: true, HeaderOmitted: true,
				}, 2},
			} {
				counter.reset()
				err := s.Complete(ctx, tc.key, "t", tc.resp, time.Hour)
				trips := counter.roundTrips.Load()
				if plain {
					if err == nil || !strings.Contains(err.Error(), "OOM") {
						t.Errorf("%s: Complete without the flags line on a full server = %v, want an OOM error", tc.name, err)
					}
					if trips != 1 {
						t.Errorf("%s: the refused Complete took %d round trips, want 1: nothing to fall back to", tc.name, trips)
					}
					if state := recordState(c, s.RecordKey(tc.key)); state != "in_progress" {
						t.Errorf("%s: record state %q after the refused Complete, want in_progress", tc.name, state)
					}
					continue
				}
				if err != nil {
					t.Fatalf("%s: Complete on a full server: %v", tc.name, err)
				}
				if trips != tc.roundTrips {
					t.Errorf("%s: Complete on a full server took %d round trips, want %d", tc.name, trips, tc.roundTrips)
				}
				a := mustAcquire(t, s, req(tc.key, "dup"), idempotency.Completed)
				if diff := diffReplay(a.Response, tc.replay); diff != "" {
					t.Errorf("%s: replay after Complete on a full server: %s", tc.name, diff)
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

	first := make(chan postResult, 1)
	go func() { first <- postAsync(srv.URL, "k", "pay") }()
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

// largeSize is the size of the large body or header value of the
// responses below: far over the allowance.
const largeSize = 512 << 10

// largeBodyResponse returns a response whose body is over the allowance
// and whose headers fit in it.
func largeBodyResponse() *idempotency.Response {
	return &idempotency.Response{
		Status: http.StatusCreated,
		Header: http.Header{"Content-Type": {"application/octet-stream"}, "Location": {"/exports/7"}},
		Body:   bytes.Repeat([]byte("b"), largeSize),
	}
}

// largeHeaderResponse returns a response whose headers alone are over the
// allowance.
func largeHeaderResponse() *idempotency.Response {
	return &idempotency.Response{
		Status: http.StatusOK,
		Header: http.Header{"X-Report": {strings.Repeat("h", largeSize)}},
		Body:   []byte("small body"),
	}
}

// diffReplay describes how the replayed response got differs from want,
// or returns "" when they are equal (a nil and an empty Header or Body
// count as equal).
func diffReplay(got, want *idempotency.Response) string {
	switch {
	case got == nil:
		return "no response"
	case got.Status != want.Status:
		return fmt.Sprintf("status %d, want %d", got.Status, want.Status)
	case got.BodyOmitted != want.BodyOmitted || got.HeaderOmitted != want.HeaderOmitted:
		return fmt.Sprintf("BodyOmitted %v, HeaderOmitted %v; want %v, %v",
			got.BodyOmitted, got.HeaderOmitted, want.BodyOmitted, want.HeaderOmitted)
	case !bytes.Equal(got.Body, want.Body):
		return fmt.Sprintf("a body of %d bytes, want %d", len(got.Body), len(want.Body))
	case len(got.Header) != len(want.Header):
		return fmt.Sprintf("%d headers, want %d", len(got.Header), len(want.Header))
	}
	for name, values := range want.Header {
		if !slices.Equal(got.Header[name], values) {
			return fmt.Sprintf("header %s differs", name)
		}
	}
	return ""
}

// usedMemory returns the used_memory of INFO memory: what Redis compares
// with maxmemory.
func usedMemory(t *testing.T, c *redis.Client) int64 {
	t.Helper()
	info, err := c.Info(ctx, "memory").Result()
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.Lines(info) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "used_memory:"); ok {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	t.Fatalf("no used_memory in INFO memory:\n%s", info)
	return 0
}

// TestMaxmemoryBound: records in progress when the server reaches
// maxmemory (noeviction) all complete, concurrently, and each replays in
// full or marked, never in flight or absent; their completions take the
// server past maxmemory by no more than the payload Redis admitted last
// below it and an allowance per record; and small payloads completed on
// the full server are stored in full.
func TestMaxmemoryBound(t *testing.T) {
	c := newClient(t)
	if !privateServer() {
		t.Skip("changes maxmemory: needs a private server, not REDIS_ADDR")
	}
	if err := c.ConfigSet(ctx, "maxmemory-policy", "noeviction").Err(); err != nil {
		t.Fatal(err)
	}
	// The completes go through a client of their own, whose connections
	// are gone before the memory is read: Redis counts their query buffers
	// in used_memory, each up to twice the last large argument (the
	// argument, and a buffer of its size for the next). Four connections
	// keep those buffers within half of the 8 MiB of room, so the first
	// large payloads are stored in full.
	cc := redis.NewClient(&redis.Options{Addr: c.Options().Addr, PoolSize: 4})
	defer cc.Close()
	prefix := redistest.Prefix()
	s := redisstore.New(cc, redisstore.WithPrefix(prefix))
	defer s.Close()

	const large, small = 300, 50
	type record struct {
		key  string
		resp *idempotency.Response
	}
	records := make([]record, large+small)
	for i := range records {
		resp := sampleResponse() // within the allowance
		if i < large && i%2 == 0 {
			resp = largeBodyResponse()
		} else if i < large {
			resp = largeHeaderResponse()
		}
		records[i] = record{randKey(), resp}
		mustAcquire(t, s, req(records[i].key, "t"), idempotency.Acquired)
	}
	maxmemory := usedMemory(t, c) + 8<<20
	if err := c.ConfigSet(ctx, "maxmemory", strconv.FormatInt(maxmemory, 10)).Err(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.ConfigSet(ctx, "maxmemory", "0") })

	completeAll := func(records []record) {
		errs := make([]error, len(records))
		var wg sync.WaitGroup
		for i, r := range records {
			wg.Add(1)
			go func() {
				defer wg.Done()
				errs[i] = s.Complete(ctx, r.key, "t", r.resp, time.Hour)
			}()
		}
		wg.Wait()
		for i, err := range errs {
			if err != nil {
				t.Errorf("Complete of %s on a server at maxmemory: %v", records[i].key, err)
			}
		}
	}
	// The large payloads fill the server up to maxmemory, then are
	// refused; the small ones are completed once the server is full for
	// certain (maxmemory 1 byte, for as long as they take).
	completeAll(records[:large])
	if err := c.ConfigSet(ctx, "maxmemory", "1").Err(); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Acquire(ctx, req(randKey(), "t")); !errors.Is(err, idempotency.ErrStoreFull) {
		t.Fatalf("Acquire of a new key with maxmemory 1 = %v, want ErrStoreFull", err)
	}
	completeAll(records[large:])
	if err := c.ConfigSet(ctx, "maxmemory", strconv.FormatInt(maxmemory, 10)).Err(); err != nil {
		t.Fatal(err)
	}

	// CLIENT KILL frees the connections' buffers before it answers.
	cc.Close()
	if err := c.Do(ctx, "CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes").Err(); err != nil {
		t.Fatal(err)
	}
	// Each record completed past maxmemory stored at most the allowance,
	// rounded up by jemalloc (at most a quarter more), and a hash's
	// overhead (under 256 bytes). The payload that Redis admitted last
	// below maxmemory crossed it by its own size: 512 KiB and a few bytes,
	// rounded up the same way. The fixed 64 KiB covers what Redis
	// allocates besides the records (the script cache, the client struct
	// and reply buffer of the connection reading INFO).
	perRecord := int64(redisstore.DefaultMaxmemoryAllowance)*5/4 + 256
	crossing := int64(largeSize+4<<10) * 5 / 4
	bound := maxmemory + int64(len(records))*perRecord + crossing + 64<<10
	used := usedMemory(t, c)
	t.Logf("maxmemory %d, used_memory %d after %d completes (%+d), bound %d", maxmemory, used, len(records), used-maxmemory, bound)
	if used > bound {
		t.Errorf("used_memory %d (%.1f MiB) past the bound %d (maxmemory %.1f MiB + %d records × %d B + %d B + 64 KiB)",
			used, float64(used)/(1<<20), bound, float64(maxmemory)/(1<<20), len(records), perRecord, crossing)
	}

	replays := redisstore.New(c, redisstore.WithPrefix(prefix))
	defer replays.Close()
	var full, marked int // of the large payloads
	for i, r := range records {
		a, err := replays.Acquire(ctx, req(r.key, "dup"))
		if err != nil || a.Outcome != idempotency.Completed {
			t.Errorf("record %d: Acquire = %v, %v; want it completed", i, a.Outcome, err)
			continue
		}
		// A large body leaves its headers; a large header leaves the
		// status alone.
		mark := &idempotency.Response{Status: r.resp.Status, BodyOmitted: true, HeaderOmitted: true}
		if r.resp.Header.Get("X-Report") == "" {
			mark = &idempotency.Response{Status: r.resp.Status, Header: r.resp.Header, BodyOmitted: true}
		}
		switch {
		case i >= large:
			if diff := diffReplay(a.Response, r.resp); diff != "" {
				t.Errorf("record %d, within the allowance, completed on a full server: replay %s", i, diff)
			}
		case diffReplay(a.Response, r.resp) == "":
			full++
		case diffReplay(a.Response, mark) == "":
			marked++
		default:
			t.Errorf("record %d: replay neither in full (%s) nor marked (%s)", i, diffReplay(a.Response, r.resp), diffReplay(a.Response, mark))
		}
	}
	t.Logf("of %d large payloads, %d replay in full, %d marked", large, full, marked)
	if full == 0 {
		t.Error("no large payload was stored in full: the server refused them with room to spare")
	}
	if marked == 0 {
		t.Error("no large payload was stored marked: the server never refused one, so the bound was not tested")
	}
}

// TestMaxmemoryCompleteRetry: a retried Complete keeps the payload the
// first stored, whether the server has room for the retry's payload or
// not: a full record is not replaced by a marked one, nor a marked record
// by the full one.
func TestMaxmemoryCompleteRetry(t *testing.T) {
	c := newClient(t)
	if !privateServer() {
		t.Skip("changes maxmemory: needs a private server, not REDIS_ADDR")
	}
	s := newStore(t, c)
	resp := largeBodyResponse()
	marked := &idempotency.Response{Status: resp.Status, Header: resp.Header, BodyOmitted: true}

	t.Run("FullThenFull", func(t *testing.T) {
		key := randKey()
		mustAcquire(t, s, req(key, "t"), idempotency.Acquired)
		if err := s.Complete(ctx, key, "t", resp, time.Hour); err != nil {
			t.Fatal(err)
		}
		lift := fillServer(t, c)
		defer lift()
		if err := s.Complete(ctx, key, "t", resp, time.Hour); err != nil {
			t.Fatalf("retried Complete on a full server: %v", err)
		}
		a := mustAcquire(t, s, req(key, "dup"), idempotency.Completed)
		if diff := diffReplay(a.Response, resp); diff != "" {
			t.Fatalf("replay after the retry on a full server: %s; want the first, full payload", diff)
		}
	})
	t.Run("MarkedThenMarked", func(t *testing.T) {
		key := randKey()
		mustAcquire(t, s, req(key, "t"), idempotency.Acquired)
		lift := fillServer(t, c)
		if err := s.Complete(ctx, key, "t", resp, time.Hour); err != nil {
			t.Fatal(err)
		}
		lift()
		if err := s.Complete(ctx, key, "t", resp, time.Hour); err != nil {
			t.Fatalf("retried Complete with room: %v", err)
		}
		a := mustAcquire(t, s, req(key, "dup"), idempotency.Completed)
		if diff := diffReplay(a.Response, marked); diff != "" {
			t.Fatalf("replay after the retry with room: %s; want the first, marked payload", diff)
		}
	})
}

// TestMaxmemoryAllowanceOption: payloads up to the allowance are stored in
// full on a full server, one byte more is stored marked; the option panics
// on a negative allowance.
func TestMaxmemoryAllowanceOption(t *testing.T) {
	func() {
		defer func() {
			if recover() == nil {
				t.Error("WithMaxmemoryAllowance(-1) did not panic")
			}
		}()
		redisstore.WithMaxmemoryAllowance(-1)
	}()

	c := newClient(t)
	if !privateServer() {
		t.Skip("changes maxmemory: needs a private server, not REDIS_ADDR")
	}
	// A body of n bytes makes a payload of n + 6 bytes: the meta block's
	// length, then version, status (2 bytes), flags and header count.
	const allowance = 1000
	resp := func(n int) *idempotency.Response {
		return &idempotency.Response{Status: http.StatusCreated, Body: bytes.Repeat([]byte("x"), n-6)}
	}
	for _, tc := range []struct {
		name      string
		allowance int
		payload   int
		marked    bool
	}{
		{"AtAllowance", allowance, allowance, false},
		{"OverAllowance", allowance, allowance + 1, true},
		{"Zero", 0, 7, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newStore(t, c, redisstore.WithMaxmemoryAllowance(tc.allowance))
			key := randKey()
			mustAcquire(t, s, req(key, "t"), idempotency.Acquired)
			fillServer(t, c)
			if err := s.Complete(ctx, key, "t", resp(tc.payload), time.Hour); err != nil {
				t.Fatal(err)
			}
			want := resp(tc.payload)
			if tc.marked {
				// Without headers the status and headers make a payload of
				// 6 bytes: within any allowance but 0, which leaves the
				// status alone.
				want = &idempotency.Response{Status: want.Status, BodyOmitted: true, HeaderOmitted: tc.allowance == 0}
			}
			a := mustAcquire(t, s, req(key, "dup"), idempotency.Completed)
			if diff := diffReplay(a.Response, want); diff != "" {
				t.Fatalf("payload of %d bytes, allowance %d: replay %s", tc.payload, tc.allowance, diff)
			}
		})
	}
}

// TestMaxmemoryLargeResponseOverHTTP: a handler that was running when the
// server filled up and answers with a body too large to store there is
// still run once: its client gets the whole body, and a duplicate gets the
// status and headers, an empty body and Idempotent-Body-Omitted: true.
func TestMaxmemoryLargeResponseOverHTTP(t *testing.T) {
	c := newClient(t)
	if !privateServer() {
		t.Skip("changes maxmemory: needs a private server, not REDIS_ADDR")
	}
	s := newStore(t, c)
	var calls atomic.Int64
	entered, filled := make(chan struct{}), make(chan struct{})
	body := bytes.Repeat([]byte("r"), largeSize)
	srv := httptest.NewServer(idempotency.New(s)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if calls.Add(1) == 1 {
			close(entered)
			<-filled
		}
		w.Header().Set("Content-Type", "application/octet-stream")
		w.WriteHeader(http.StatusCreated)
		w.Write(body)
	})))
	defer srv.Close()
	var once sync.Once
	fill := func() { once.Do(func() { close(filled) }) }
	defer fill()

	first := make(chan postResult, 1)
	go func() { first <- postAsync(srv.URL, "k", "export") }()
	select {
	case <-entered:
	case res := <-first:
		t.Fatalf("first request answered before its handler ran: %d %v", res.status, res.err)
	}
	fillServer(t, c)
	fill()
	res := <-first
	if res.err != nil {
		t.Fatal(res.err)
	}
	if res.status != http.StatusCreated || !bytes.Equal(res.body, body) {
		t.Fatalf("first request: %d, %d bytes; want 201 and the whole body", res.status, len(res.body))
	}
	rkey := s.RecordKey(idempotency.StorageKey("", "k"))
	if !redistest.WaitFor(5*time.Second, func() bool { return recordState(c, rkey) == "complete" }) {
		t.Fatalf("record not completed on a full server: state %q", recordState(c, rkey))
	}
	resp, got := post(t, srv.URL, "k", "export")
	if resp.StatusCode != http.StatusCreated || len(got) != 0 ||
		resp.Header.Get("Content-Type") != "application/octet-stream" ||
		resp.Header.Get("Idempotent-Replayed") != "true" || resp.Header.Get("Idempotent-Body-Omitted") != "true" {
		t.Fatalf("duplicate: %d %v, %d bytes; want 201 with the stored headers, no body, Idempotent-Body-Omitted: true", resp.StatusCode, resp.Header, len(got))
	}
	if n := calls.Load(); n != 1 {
		t.Fatalf("handler ran %d times, want 1", n)
	}
}
