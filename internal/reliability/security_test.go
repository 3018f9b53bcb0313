package reliability_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/internal/redistest"
	"github.com/go-idempotency/idempotency/internal/reliability"
	"github.com/go-idempotency/idempotency/memstore"
)

// bothStores runs f on a memstore and on a Redis store.
func bothStores(t *testing.T, f func(t *testing.T, name string, s idempotency.Store)) {
	t.Run("memstore", func(t *testing.T) {
		s := memstore.New()
		t.Cleanup(func() { s.Close() })
		f(t, "memstore", s)
	})
	t.Run("redis", func(t *testing.T) {
		f(t, "redis", newRedisStore(t, fastClient(t, redistest.Addr(t))))
	})
}

// TestScopedKeysNeverCross: alice's key never replays to bob, whatever he
// sends with it.
func TestScopedKeysNeverCross(t *testing.T) {
	bothStores(t, func(t *testing.T, name string, s idempotency.Store) {
		ex := newExecutions()
		mw := idempotency.New(s, idempotency.WithKeyScope(func(r *http.Request) string { return r.Header.Get("X-User") }))
		srv, client := serve(t, mw(echoHandler(ex, nil)))
		var ops, violations int64
		post := func(user, key, body string) answer {
			ops++
			return postKey(client, srv.URL, key, body, "X-User", user)
		}
		alice := post("alice", "shared-key", "card=alice")
		// The same request under another scope, and another request under
		// a third: each runs fresh, neither sees alice's response.
		for user, body := range map[string]string{"bob": "card=alice", "carol": "card=carol"} {
			got := post(user, "shared-key", body)
			if got.status != 201 || got.replayed || got.body == alice.body {
				t.Errorf("%s with alice's key and %q got %v", user, body, got)
				violations++
			}
		}
		if again := post("alice", "shared-key", "card=alice"); !again.replayed || again.body != alice.body {
			t.Errorf("alice's own duplicate: %v", again)
			violations++
		}
		// A request without a principal is refused, never given a key
		// space shared by all such requests.
		if anon := post("", "shared-key", "card=alice"); anon.replayed || anon.status != http.StatusForbidden || anon.code != "scope_missing" {
			t.Errorf("a request without a user: %v, want 403 scope_missing", anon)
			violations++
		}
		reliability.Report(t, reliability.Result{Scenario: "security: scoped keys never cross", Store: name,
			Operations: ops, Violations: violations})
	})
}

// TestReplayAnswersOnlyItsRoute: a key sent to another route, whether the
// fingerprint is the default or a custom one that ignores the route, and
// whether the routes are told apart by their paths or only by a prefix
// that http.StripPrefix removed, is refused with 422 and never answered
// with the other route's response; headers that middleware in front set
// for a request are never replaced by those of the request that made the
// record.
func TestReplayAnswersOnlyItsRoute(t *testing.T) {
	bothStores(t, func(t *testing.T, name string, s idempotency.Store) {
		const keys = 20
		var ops, violations int64
		check := func(ok bool, format string, args ...any) {
			if !ok {
				t.Errorf(format, args...)
				violations++
			}
		}
		var seq atomic.Int64
		outer := func(next http.Handler) http.Handler {
			return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("X-Request-Id", fmt.Sprint("req-", seq.Add(1)))
				w.Header().Set("Access-Control-Allow-Origin", r.Header.Get("Origin"))
				next.ServeHTTP(w, r)
			})
		}
		ex := newExecutions()
		bodyOnly := idempotency.WithFingerprint(func(_ *http.Request, body []byte) string { return string(body) })
		mux := http.NewServeMux()
		mux.Handle("POST /payments", idempotency.New(s, bodyOnly)(echoHandler(ex, nil)))
		mux.Handle("POST /refunds", idempotency.New(s, bodyOnly)(echoHandler(ex, nil)))
		mux.Handle("/v1/", http.StripPrefix("/v1", idempotency.New(s)(echoHandler(ex, nil))))
		mux.Handle("/v2/", http.StripPrefix("/v2", idempotency.New(s)(echoHandler(ex, nil))))
		srv, client := serve(t, outer(mux))
		for i := range keys {
			for _, pair := range [][2]string{{"/payments", "/refunds"}, {"/v1/payments", "/v2/payments"}} {
				key := fmt.Sprintf("%s-%d", pair[0], i)
				ops += 3
				first := postKey(client, srv.URL+pair[0], key, "amount=10", "Origin", "https://a.example")
				check(first.status == http.StatusCreated, "%s %s: %v", pair[0], key, first)
				other := postKey(client, srv.URL+pair[1], key, "amount=10")
				check(!other.replayed && other.status == http.StatusUnprocessableEntity && other.code == "fingerprint_mismatch",
					"%s with %s's key: %v, want 422 fingerprint_mismatch", pair[1], pair[0], other)
				req, _ := http.NewRequest(http.MethodPost, srv.URL+pair[0], strings.NewReader("amount=10"))
				req.Header.Set(idempotency.HeaderKey, key)
				req.Header.Set("Origin", "https://evil.example")
				res, err := client.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				body, _ := io.ReadAll(res.Body)
				res.Body.Close()
				check(res.Header.Get(idempotency.HeaderReplayed) == "true" && string(body) == first.body,
					"%s duplicate: %d %q, want the replay of %q", pair[0], res.StatusCode, body, first.body)
				check(len(res.Header.Values("X-Request-Id")) == 1 && res.Header.Get("X-Request-Id") == fmt.Sprint("req-", seq.Load()),
					"%s duplicate carries X-Request-Id %q, not its own", pair[0], res.Header.Values("X-Request-Id"))
				check(res.Header.Get("Access-Control-Allow-Origin") == "https://evil.example",
					"%s duplicate carries Access-Control-Allow-Origin %q, not its own", pair[0], res.Header.Values("Access-Control-Allow-Origin"))
				check(ex.of(key) == 1, "%s ran %d times", key, ex.of(key))
			}
		}
		reliability.Report(t, reliability.Result{Scenario: "security: a replay answers only its route and request", Store: name,
			Operations: ops, Violations: violations})
	})
}

// TestSetCookieNotReplayed: Set-Cookie reaches the first client only,
// unless WithStoreSetCookie opts in.
func TestSetCookieNotReplayed(t *testing.T) {
	bothStores(t, func(t *testing.T, name string, s idempotency.Store) {
		for _, optIn := range []bool{false, true} {
			h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				http.SetCookie(w, &http.Cookie{Name: "session", Value: "secret-session"})
				w.WriteHeader(201)
			})
			srv, client := serve(t, idempotency.New(s, idempotency.WithStoreSetCookie(optIn))(h))
			key := fmt.Sprintf("cookie-%v", optIn)
			send := func() *http.Response {
				req, _ := http.NewRequest(http.MethodPost, srv.URL, nil)
				req.Header.Set(idempotency.HeaderKey, key)
				res, err := client.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				io.Copy(io.Discard, res.Body)
				res.Body.Close()
				return res
			}
			if first := send(); first.Header.Get("Set-Cookie") == "" {
				t.Fatal("the first client did not get its cookie")
			}
			replay := send()
			if replay.Header.Get(idempotency.HeaderReplayed) != "true" {
				t.Fatal("no replay")
			}
			if got := replay.Header.Get("Set-Cookie") != ""; got != optIn {
				t.Errorf("opt-in %v: replay carries Set-Cookie = %v", optIn, got)
			}
		}
		reliability.Report(t, reliability.Result{Scenario: "security: Set-Cookie replayed only by opt-in", Store: name, Operations: 4})
	})
}

// captureHandler is a slog.Handler that keeps every record, with all its
// attributes and groups, at every level.
type captureHandler struct {
	mu    *sync.Mutex
	out   *strings.Builder
	attrs []slog.Attr
}

func (h captureHandler) Enabled(context.Context, slog.Level) bool { return true }

func (h captureHandler) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	fmt.Fprintf(h.out, "%s %s", r.Level, r.Message)
	for _, a := range h.attrs {
		fmt.Fprintf(h.out, " %s=%v", a.Key, a.Value)
	}
	r.Attrs(func(a slog.Attr) bool {
		fmt.Fprintf(h.out, " %s=%v", a.Key, a.Value)
		return true
	})
	h.out.WriteString("\n")
	return nil
}

func (h captureHandler) WithAttrs(as []slog.Attr) slog.Handler {
	h.attrs = append(append([]slog.Attr(nil), h.attrs...), as...)
	return h
}

func (h captureHandler) WithGroup(name string) slog.Handler {
	return h.WithAttrs([]slog.Attr{slog.String("group", name)})
}

// TestLogsAndEventsCarryNoClientBytes runs every kind of outcome (executed,
// replayed, conflict, mismatch, released, panic, rejected, lease lost,
// store error) with a secret key and body, and checks that neither reaches
// the logs (captured at Debug) or the observer's events.
func TestLogsAndEventsCarryNoClientBytes(t *testing.T) {
	const secretKey = "sk_live_SECRETKEY"
	const secretBody = "card=4242424242424242"
	var mu sync.Mutex
	var logs strings.Builder
	ev := &events{}
	base := memstore.New()
	t.Cleanup(func() { base.Close() })
	store := &pausingStore{Store: base, mode: "fail"}
	g := newGate()
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		switch {
		case strings.Contains(string(body), "panic"):
			panic("handler failed on " + "a bug")
		case strings.Contains(string(body), "fail"):
			w.WriteHeader(500)
			return
		case strings.Contains(string(body), "hold"):
			g.wait(r.Context())
		}
		w.WriteHeader(201)
	})
	mw := idempotency.New(store, idempotency.WithLease(150*time.Millisecond),
		idempotency.WithLogger(slog.New(captureHandler{mu: &mu, out: &logs})),
		idempotency.WithObserver(ev.observe))
	srv, client := serve(t, mw(h))
	post := func(key, body string) answer { return postKey(client, srv.URL, key, body) }

	post(secretKey, secretBody)                  // executed
	post(secretKey, secretBody)                  // replayed
	post(secretKey, secretBody+"x")              // mismatch
	post(secretKey+"-fail", secretBody+"fail")   // released
	post(secretKey+"-panic", secretBody+"panic") // released (panic)
	post(secretKey+" with space", secretBody)    // rejected
	post(strings.Repeat("k", 300), secretBody)   // rejected
	held := make(chan answer, 1)                 // lease lost, conflict
	go func() { held <- post(secretKey+"-hold", secretBody+"hold") }()
	g.waitEntered(t)
	post(secretKey+"-hold", secretBody+"hold") // conflict
	store.pause()
	<-held
	store.wake()
	// The client hears before the record is written, so the held request's
	// outcome (lease lost) is reported after its answer arrived: Close
	// waits for the server's handlers to return.
	srv.Close()
	// A store error at acquire: a store whose Acquire fails.
	failing := idempotency.New(&unreachableStore{}, idempotency.WithLogger(slog.New(captureHandler{mu: &mu, out: &logs})), idempotency.WithObserver(ev.observe))
	srv2, client2 := serve(t, failing(h))
	postKey(client2, srv2.URL, secretKey, secretBody)

	mu.Lock()
	out := logs.String()
	mu.Unlock()
	var seen []string
	for _, kind := range []idempotency.EventKind{idempotency.EventExecuted, idempotency.EventReplayed, idempotency.EventConflict,
		idempotency.EventMismatch, idempotency.EventReleased, idempotency.EventRejected, idempotency.EventLeaseLost, idempotency.EventStoreError} {
		if ev.count(kind, "") == 0 {
			t.Errorf("no %v event: the workload missed an outcome", kind)
		}
		seen = append(seen, kind.String())
	}
	var violations int64
	all := out + ev.dump()
	for _, secret := range []string{"SECRETKEY", "4242", strings.Repeat("k", 40)} {
		if strings.Contains(all, secret) {
			t.Errorf("logs or events carry client bytes %q:\n%s", secret, all)
			violations++
		}
	}
	if !strings.Contains(out, "DEBUG") || !strings.Contains(out, "ERROR") {
		t.Errorf("the logger saw too little:\n%s", out)
	}
	reliability.Report(t, reliability.Result{Scenario: "security: no client bytes in logs or events", Store: "memstore",
		Operations: 11, Violations: violations, Note: strings.Join(seen, ", ")})
}

// dump renders every event with all its fields.
func (e *events) dump() string {
	e.mu.Lock()
	defer e.mu.Unlock()
	var b strings.Builder
	for _, ev := range e.all {
		fmt.Fprintf(&b, "%+v\n", ev)
	}
	return b.String()
}

// unreachableStore fails every call as a store that cannot be reached.
type unreachableStore struct{ idempotency.Store }

func (unreachableStore) Acquire(context.Context, idempotency.AcquireRequest) (idempotency.Acquisition, error) {
	return idempotency.Acquisition{}, fmt.Errorf("dial tcp 127.0.0.1:1: connection refused")
}

// TestNoClientBytesInRedisNames sends hostile keys and scopes through the
// middleware into a private Redis server, holds waiters on some of them,
// then lists every key and pub/sub channel of the server: each is the
// prefix and 64 hex digits (channels: plus ":changed"), and none contains
// a client's bytes.
func TestNoClientBytesInRedisNames(t *testing.T) {
	srv := redistest.Start(t) // private: the whole server is listed
	c := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	t.Cleanup(func() { c.Close() })
	const prefix = "idem:"
	store := newRedisStoreWithPrefix(t, c, prefix)
	hostile := []string{
		"../x", "../../etc/passwd", "{slot}", "{idem:}x", `"with \"quotes\" and spaces"`, "*", "?", "[a-z]",
		"idem:" + strings.Repeat("a", 64), "key:changed", strings.Repeat("z", 255), `"` + strings.Repeat("q", 255) + `"`,
		"%0d%0aSET", "$-1", "\\", "k;DEL", "__keyspace@0__:x",
	}
	g := newGate()
	ex := newExecutions()
	mw := idempotency.New(store,
		idempotency.WithKeyScope(func(r *http.Request) string { return r.Header.Get("X-Tenant") }),
		idempotency.WithWait(5*time.Second))
	hs, client := serve(t, mw(echoHandler(ex, func(r *http.Request) {
		if r.Header.Get("X-Hold") != "" {
			g.wait(r.Context())
		}
	})))
	var ops int64
	for _, k := range hostile {
		ops++
		if a := postKey(client, hs.URL, k, "b", "X-Tenant", "{tenant}../"+k); a.status != 201 && a.status != 400 {
			t.Errorf("key %q: %v", k, a)
		}
	}
	// A held request and a waiter on it keep a channel subscribed.
	held := make(chan answer, 2)
	go func() { held <- postKey(client, hs.URL, "{held}", "b", "X-Hold", "1", "X-Tenant", "{t}") }()
	g.waitEntered(t)
	go func() { held <- postKey(client, hs.URL, "{held}", "b", "X-Tenant", "{t}") }()
	var channels []string
	waitUntil(t, 5*time.Second, "a waiter's subscription", func() bool {
		channels, _ = c.PubSubChannels(context.Background(), "*").Result()
		return len(channels) > 0
	})
	keys, err := c.Keys(context.Background(), "*").Result()
	g.open()
	<-held
	<-held
	ops += 2
	if err != nil {
		t.Fatal(err)
	}
	name := regexp.MustCompile(`^idem:[0-9a-f]{64}$`)
	channel := regexp.MustCompile(`^idem:[0-9a-f]{64}:changed$`)
	var violations int64
	for _, k := range keys {
		if !name.MatchString(k) {
			t.Errorf("Redis key %q is not the prefix and a hash", k)
			violations++
		}
	}
	for _, ch := range channels {
		if !channel.MatchString(ch) {
			t.Errorf("channel %q is not the prefix, a hash and :changed", ch)
			violations++
		}
	}
	for _, n := range append(keys, channels...) {
		for _, k := range hostile {
			if core := strings.Trim(k, `"`); len(core) >= 3 && strings.Contains(n, core) {
				t.Errorf("name %q contains client bytes %q", n, core)
				violations++
			}
		}
	}
	if len(keys) < len(hostile)/2 || len(channels) == 0 {
		t.Fatalf("too few names to check: %d keys, %d channels", len(keys), len(channels))
	}
	reliability.Report(t, reliability.Result{Scenario: "security: no client bytes in Redis names", Store: "redis",
		Operations: ops, Faults: int64(len(hostile)), Violations: violations})
}
