package load_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/benchmarks/load"
	"github.com/go-idempotency/idempotency/internal/redistest"
	"github.com/go-idempotency/idempotency/memstore"
	"github.com/redis/go-redis/v9"
)

func TestParseMix(t *testing.T) {
	m, err := load.ParseMix("new=70, dup=20,concdup=10")
	if err != nil {
		t.Fatal(err)
	}
	if m != (load.Mix{70, 20, 10}) || m.String() != "new=70,dup=20,concdup=10" {
		t.Fatalf("ParseMix = %v (%s)", m, m)
	}
	if m, err := load.ParseMix("dup=1"); err != nil || m != (load.Mix{0, 1, 0}) {
		t.Fatalf("ParseMix(dup=1) = %v, %v", m, err)
	}
	for _, bad := range []string{"", "new", "new=x", "new=-1", "old=1", "new=1,new=2", "new=0,dup=0", "new=99999999"} {
		if _, err := load.ParseMix(bad); err == nil {
			t.Errorf("ParseMix(%q) accepted", bad)
		}
	}
}

func TestPayload(t *testing.T) {
	for _, n := range []int{0, 10, 1024, 64 << 10} {
		p := load.Payload(n)
		if len(p) != n {
			t.Fatalf("Payload(%d) has %d bytes", n, len(p))
		}
		if n >= 64 && !json.Valid(p) {
			t.Fatalf("Payload(%d) is not JSON", n)
		}
	}
}

func TestLoopback(t *testing.T) {
	for addr, want := range map[string]bool{
		"127.0.0.1:6379": true, "[::1]:6379": true, "localhost:6379": true, "127.8.9.10:1": true,
		"10.0.0.1:6379": false, "example.com:6379": false, "127.0.0.1": false, "": false,
	} {
		if got := load.Loopback(addr); got != want {
			t.Errorf("Loopback(%q) = %v, want %v", addr, got, want)
		}
	}
}

// countingHandler counts the times the wrapped handler ran.
func countingHandler(n *atomic.Int64, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n.Add(1)
		next.ServeHTTP(w, r)
	})
}

func TestRunOverMemstore(t *testing.T) {
	s := memstore.New()
	defer s.Close()
	var runs atomic.Int64
	srv, err := load.Serve(idempotency.New(s)(countingHandler(&runs, load.Handler(load.Payload(100)))))
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	const conc, warm = 4, 20
	client := load.NewClient(2 * conc)
	defer client.CloseIdleConnections()
	var ticks atomic.Int64
	res, err := load.Run(context.Background(), client, load.Config{
		URL: srv.URL, Duration: 1200 * time.Millisecond, Concurrency: conc, Warm: warm,
		Mix:      load.Mix{50, 30, 20},
		Progress: func(done int64, _ time.Duration) { ticks.Add(1) },
	})
	if err != nil {
		t.Fatal(err)
	}
	if res.Errors != 0 {
		t.Fatalf("%d errors, first: %v", res.Errors, res.FirstError)
	}
	for k := load.New; k <= load.ConcDup; k++ {
		if res.ByKind[k].N == 0 {
			t.Fatalf("no %v requests measured", k)
		}
	}
	if got := res.ByKind[load.New].N + res.ByKind[load.Dup].N + res.ByKind[load.ConcDup].N; int64(got) != res.Requests || got != res.Latency.N {
		t.Fatalf("kinds add up to %d, Requests %d, latencies %d", got, res.Requests, res.Latency.N)
	}
	if res.Replayed[load.New] != 0 || res.Replayed[load.Dup] != int64(res.ByKind[load.Dup].N) {
		t.Fatalf("replayed %v, want none of new and all %d dup", res.Replayed, res.ByKind[load.Dup].N)
	}
	for code := range res.Status {
		if code != http.StatusCreated && code != http.StatusConflict {
			t.Fatalf("status %d in %v", code, res.Status)
		}
	}
	// The handler ran once per key: the warm-up's, the new requests' and
	// one per concurrent pair, plus at most one per request cut off when
	// the time was up.
	executed := int64(warm + res.ByKind[load.New].N + res.ByKind[load.ConcDup].N/2)
	if n := runs.Load(); n < executed || n > executed+2*conc {
		t.Fatalf("handler ran %d times for %d keys", n, executed)
	}
	if res.Latency.P50 <= 0 || res.Latency.P99 < res.Latency.P50 || res.Latency.Max < res.Latency.P99 {
		t.Fatalf("latency %+v", res.Latency)
	}
	if res.Throughput() <= 0 || ticks.Load() < 1 {
		t.Fatalf("throughput %v, %d progress calls", res.Throughput(), ticks.Load())
	}
}

func TestRunRejectsBadConfig(t *testing.T) {
	for _, cfg := range []load.Config{
		{URL: "http://127.0.0.1:1", Duration: time.Second, Mix: load.Mix{1}},
		{URL: "http://127.0.0.1:1", Concurrency: 1, Mix: load.Mix{1}},
		{URL: "http://127.0.0.1:1", Concurrency: 1, Duration: time.Second},
	} {
		if _, err := load.Run(context.Background(), http.DefaultClient, cfg); err == nil {
			t.Errorf("Run(%+v) accepted", cfg)
		}
	}
}

// commandCounter counts the EVALSHA commands a client sends.
type commandCounter struct{ evalsha atomic.Int64 }

func (c *commandCounter) DialHook(next redis.DialHook) redis.DialHook { return next }
func (c *commandCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if cmd.Name() == "evalsha" {
			c.evalsha.Add(1)
		}
		return next(ctx, cmd)
	}
}
func (c *commandCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// TestRecordFloorHandler: a first execution creates the record, answers
// and stores the payload (two EVALSHA); a duplicate reads the stored
// payload back in one and answers with it, without running the handler.
func TestRecordFloorHandler(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: redistest.Addr(t)})
	defer c.Close()
	counter := &commandCounter{}
	c.AddHook(counter)
	payload := load.Payload(100)
	srv, err := load.Serve(load.RecordFloorHandler(c, "test:recordfloor:", payload, time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	t.Cleanup(func() { c.Del(context.Background(), "test:recordfloor:k1", "test:recordfloor:k0") })
	post := func(key, kind string) string {
		t.Helper()
		req, _ := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader("{}"))
		req.Header.Set(load.HeaderKind, kind)
		req.Header.Set("Idempotency-Key", key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusCreated {
			t.Fatalf("%s: status %d", kind, resp.StatusCode)
		}
		return string(body)
	}
	// The response goes out before the record is stored: stored waits
	// for the record's body (there is nothing else to wait on).
	stored := func(key string) {
		for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
			if c.HGet(context.Background(), key, "body").Val() != "" {
				return
			}
		}
	}
	post("k0", "new") // loads the scripts
	stored("test:recordfloor:k0")
	counter.evalsha.Store(0)
	if got := post("k1", "new"); got != string(payload) {
		t.Fatalf("new: body %q", got)
	}
	stored("test:recordfloor:k1")
	if n := counter.evalsha.Load(); n != 2 {
		t.Errorf("new: %d EVALSHA, want 2", n)
	}
	if ttl := c.PTTL(context.Background(), "test:recordfloor:k1").Val(); ttl <= 0 || ttl > time.Minute {
		t.Errorf("record's PTTL %v, want at most 1m", ttl)
	}
	if body := c.HGet(context.Background(), "test:recordfloor:k1", "body").Val(); body != string(payload) {
		t.Fatalf("stored body %q", body)
	}
	post("k0", "dup") // loads the read script
	c.HSet(context.Background(), "test:recordfloor:k1", "body", "stored")
	counter.evalsha.Store(0)
	if got := post("k1", "dup"); got != "stored" {
		t.Fatalf("dup: body %q, want the stored payload", got)
	}
	if n := counter.evalsha.Load(); n != 1 {
		t.Errorf("dup: %d EVALSHA, want 1", n)
	}
}
