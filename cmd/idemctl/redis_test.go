package main

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/internal/redisrecord"
	"github.com/go-idempotency/idempotency/internal/redistest"
	"github.com/go-idempotency/idempotency/redisstore"
	"github.com/go-idempotency/idempotency/servercheck"
)

// testPrefix is not the default, so that every test shows -prefix works.
const testPrefix = "idemctl-test:"

// redisFixture is a private redis-server with a Store on it.
type redisFixture struct {
	addr   string
	client redis.UniversalClient
	store  *redisstore.Store
	// conn is the connection flags that reach the server.
	conn []string
}

func newRedisFixture(t *testing.T, args ...string) *redisFixture {
	t.Helper()
	srv := redistest.Start(t, args...)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr(), ContextTimeoutEnabled: true})
	t.Cleanup(func() { c.Close() })
	return fixtureOn(t, c, srv.Addr(), "-redis", srv.Addr())
}

func fixtureOn(t *testing.T, c redis.UniversalClient, addr string, conn ...string) *redisFixture {
	s := redisstore.New(c, redisstore.WithPrefix(testPrefix))
	t.Cleanup(func() { s.Close() })
	return &redisFixture{addr: addr, client: c, store: s, conn: append(conn, "-prefix", testPrefix)}
}

// waitRanOut waits until the lease of the record under storage key sk has
// run out on the server's clock.
func (f *redisFixture) waitRanOut(t *testing.T, sk string) {
	t.Helper()
	ctx := context.Background()
	if !redistest.WaitFor(5*time.Second, func() bool {
		hd, err := redisrecord.ParseHead(f.client.HGet(ctx, testPrefix+sk, redisrecord.HeadField).Val())
		now, terr := f.client.Time(ctx).Result()
		return err == nil && terr == nil && hd.LeaseEnd <= now.UnixMilli()
	}) {
		t.Fatalf("the lease of %s did not run out", sk)
	}
}

// run runs the idemctl command cmd against the fixture.
func (f *redisFixture) run(t *testing.T, cmd string, args ...string) result {
	t.Helper()
	return idemctl(t, nil, append(append([]string{cmd}, f.conn...), args...)...)
}

var tokens int

func newToken() string {
	tokens++
	return "tok-" + strconv.Itoa(tokens)
}

// hold acquires (scope, key) with a fresh token and returns the storage
// key and the token.
func hold(t *testing.T, s idempotency.Store, scope, key string, lease, ttl time.Duration) (string, string) {
	t.Helper()
	sk, tok := idempotency.StorageKey(scope, key), newToken()
	a, err := s.Acquire(context.Background(), idempotency.AcquireRequest{Key: sk, Token: tok, Fingerprint: "fp-" + key, Lease: lease, TTL: ttl})
	if err != nil || (a.Outcome != idempotency.Acquired && a.Outcome != idempotency.Stolen) {
		t.Fatalf("acquire %s: %+v, %v", key, a, err)
	}
	return sk, tok
}

// complete stores resp as the COMPLETE record of (scope, key).
func complete(t *testing.T, s idempotency.Store, scope, key string, resp *idempotency.Response, ttl time.Duration) string {
	t.Helper()
	sk, tok := hold(t, s, scope, key, 10*time.Second, ttl)
	if err := s.Complete(context.Background(), sk, tok, resp, ttl); err != nil {
		t.Fatalf("complete %s: %v", key, err)
	}
	return sk
}

// kib is a JSON body of 1024 bytes.
var kib = []byte(`{"id":"ch_1","amount":1999,"currency":"EUR","note":"` + strings.Repeat("x", 1024-54) + `"}`)

func jsonResponse(body []byte) *idempotency.Response {
	return &idempotency.Response{
		Status: http.StatusCreated,
		Header: http.Header{"Content-Type": {"application/json"}, "Location": {"/charges/ch_1"}},
		Body:   body,
	}
}

func TestRedisInspect(t *testing.T) {
	if len(kib) != 1024 {
		t.Fatalf("kib is %d bytes", len(kib))
	}
	f := newRedisFixture(t)
	sk := complete(t, f.store, "user-42", "charge-1", jsonResponse(kib), time.Hour)

	r := f.run(t, "inspect", "-scope", "user-42", "-key", "charge-1").want(t, exitOK)
	r.contains(t, "storage key  "+sk, "location     "+testPrefix+sk, "state        complete", "epoch        1",
		"status       201 Created", "  Content-Type: application/json", "  Location: /charges/ch_1",
		"body         1024 bytes, first 512 shown", `  | {"id":"ch_1","amount":1999`, "watched      no")
	if !strings.Contains(r.stdout, "expires in   59m") && !strings.Contains(r.stdout, "expires in   1h0m\n") {
		t.Errorf("no TTL left shown:\n%s", r.stdout)
	}

	// The same record by storage key and by Redis key.
	byKey := f.run(t, "inspect", sk).want(t, exitOK)
	byRedisKey := f.run(t, "inspect", testPrefix+sk).want(t, exitOK)
	if strip(byKey.stdout) != strip(byRedisKey.stdout) || !strings.Contains(byKey.stdout, "state        complete") {
		t.Errorf("inspect by storage key and by Redis key differ:\n%s\n%s", byKey.stdout, byRedisKey.stdout)
	}

	var j recordJSON
	f.run(t, "inspect", "-scope", "user-42", "-key", "charge-1", "-json", "-body", "16").want(t, exitOK).decode(t, &j)
	if j.State != stateComplete || j.Status != 201 || j.BodyBytes != 1024 || j.Epoch != 1 ||
		j.Headers.Get("Location") != "/charges/ch_1" || j.BodyPreview == nil || *j.BodyPreview != string(kib[:16]) ||
		j.ExpiresInMS == nil || *j.ExpiresInMS <= 0 || j.StorageKey != sk || j.Fingerprint != fmt.Sprintf("%x", "fp-charge-1") {
		t.Errorf("inspect -json: %+v", j)
	}

	// A binary body is shown as a hex dump; control bytes in a header are
	// escaped.
	bin := &idempotency.Response{Status: 200, Header: http.Header{"X-Odd": {"a\x1b[2Jb"}}, Body: []byte{0, 1, 2, 0xff, 'A'}}
	complete(t, f.store, "", "binary", bin, time.Hour)
	f.run(t, "inspect", "-key", "binary").want(t, exitOK).
		contains(t, "  00000000  00 01 02 ff 41", `X-Odd: "a\x1b[2Jb"`, "body         5 bytes")
	j = recordJSON{}
	f.run(t, "inspect", "-key", "binary", "-json").want(t, exitOK).decode(t, &j)
	if j.BodyPreview != nil || j.BodyPreviewBase64 != "AAEC/0E=" {
		t.Errorf("binary body in JSON: preview %v, base64 %q", j.BodyPreview, j.BodyPreviewBase64)
	}

	// An omitted body.
	complete(t, f.store, "", "big", &idempotency.Response{Status: 200, BodyOmitted: true}, time.Hour)
	f.run(t, "inspect", "-key", "big").want(t, exitOK).contains(t, "body         omitted")

	// A record in progress shows its lease.
	hold(t, f.store, "user-42", "running", 30*time.Second, time.Hour)
	out := f.run(t, "inspect", "-scope", "user-42", "-key", "running").want(t, exitOK).
		contains(t, "state        in_progress", "on the server's clock")
	// Read within the same millisecond, the whole lease is left.
	if !regexp.MustCompile(`lease        live, (29\.\d+s|30s) left`).MatchString(out.stdout) {
		t.Errorf("lease line of a 30s lease just taken:\n%s", out.stdout)
	}

	// No record.
	f.run(t, "inspect", "-scope", "user-43", "-key", "charge-1").want(t, exitNotFound).contains(t, "no record at "+testPrefix)

	// The environment names the server.
	idemctl(t, map[string]string{"REDIS_URL": "redis://" + f.addr}, "inspect", "-prefix", testPrefix, sk).
		want(t, exitOK).contains(t, "state        complete")
	idemctl(t, map[string]string{"REDIS_ADDR": f.addr}, "inspect", "-prefix", testPrefix, sk).
		want(t, exitOK).contains(t, "state        complete")
}

// strip drops the lines that change between two reads of a record.
func strip(s string) string {
	var keep []string
	for _, l := range strings.Split(s, "\n") {
		if !strings.HasPrefix(l, "expires in") && !strings.HasPrefix(l, "lease") {
			keep = append(keep, l)
		}
	}
	return strings.Join(keep, "\n")
}

func TestRedisCorruptRecords(t *testing.T) {
	f := newRedisFixture(t)
	ctx := context.Background()
	str := idempotency.StorageKey("", "a-string")
	nan := idempotency.StorageKey("", "nan-epoch")
	if err := f.client.Set(ctx, testPrefix+str, "hello", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if err := f.client.HSet(ctx, testPrefix+nan, "h", "c1:xnan:5:fp").Err(); err != nil {
		t.Fatal(err)
	}
	f.run(t, "inspect", str).want(t, exitOK).contains(t, "state        corrupt: the key holds a string, not a hash", "expires in   never")
	f.run(t, "inspect", nan).want(t, exitOK).contains(t, "corrupt: field h: malformed epoch or lease end")

	rows := f.run(t, "list", "-state", "corrupt").want(t, exitOK).rows()
	if len(rows) != 2 {
		t.Errorf("list -state corrupt: %d rows, want 2: %q", len(rows), rows)
	}

	f.run(t, "delete", str).want(t, exitRefused).contains(t, "unreadable")
	f.run(t, "release", "-force", str).want(t, exitRefused).contains(t, "IN_PROGRESS records only")
	f.run(t, "delete", "-force", str).want(t, exitOK).contains(t, "deleted "+testPrefix+str+" (corrupt)")
	f.run(t, "delete", "-force", nan).want(t, exitOK)
	if n := f.client.Exists(ctx, testPrefix+str, testPrefix+nan).Val(); n != 0 {
		t.Errorf("%d corrupt keys left", n)
	}
}

func TestRedisDeleteAndRelease(t *testing.T) {
	f := newRedisFixture(t)
	ctx := context.Background()
	exists := func(sk string) bool { return f.client.Exists(ctx, testPrefix+sk).Val() == 1 }

	// COMPLETE: release never, delete only with -force.
	done := complete(t, f.store, "", "done", jsonResponse([]byte("{}")), time.Hour)
	f.run(t, "release", "-force", done).want(t, exitRefused).contains(t, "this one is complete")
	f.run(t, "delete", done).want(t, exitRefused).contains(t, "COMPLETE", "-force")
	if !exists(done) {
		t.Fatal("a refused delete deleted the record")
	}
	var out struct {
		Action string     `json:"action"`
		Record recordJSON `json:"record"`
	}
	f.run(t, "delete", "-force", "-json", done).want(t, exitOK).decode(t, &out)
	if out.Action != "deleted" || out.Record.State != stateComplete || exists(done) {
		t.Errorf("delete -force: %+v, record left %v", out, exists(done))
	}
	f.run(t, "delete", done).want(t, exitNotFound)

	// IN_PROGRESS with a live lease: refused without -force, and -epoch
	// pins the attempt.
	live, _ := hold(t, f.store, "", "live", time.Minute, time.Hour)
	f.run(t, "release", live).want(t, exitRefused).contains(t, "lease is live")
	f.run(t, "delete", live).want(t, exitRefused).contains(t, "lease is live")
	f.run(t, "release", "-force", "-epoch", "2", live).want(t, exitRefused).contains(t, "epoch 1, not 2")
	if !exists(live) {
		t.Fatal("a refused release deleted the record")
	}
	f.run(t, "release", "-force", "-epoch", "1", live).want(t, exitOK).
		contains(t, "released "+testPrefix+live+" (in_progress, epoch 1, lease live")
	a, err := f.store.Acquire(ctx, idempotency.AcquireRequest{Key: live, Token: newToken(), Fingerprint: "other", Lease: time.Second, TTL: time.Hour})
	if err != nil || a.Outcome != idempotency.Acquired || a.Epoch != 1 {
		t.Errorf("acquire after release: %+v, %v; want a fresh record", a, err)
	}

	// IN_PROGRESS whose lease ran out: no -force needed.
	out1, _ := hold(t, f.store, "", "ran-out-1", 20*time.Millisecond, time.Hour)
	out2, _ := hold(t, f.store, "", "ran-out-2", 20*time.Millisecond, time.Hour)
	f.waitRanOut(t, out1)
	f.waitRanOut(t, out2)
	f.run(t, "release", out1).want(t, exitOK).contains(t, "lease ran out")
	f.run(t, "delete", out2).want(t, exitOK).contains(t, "deleted")
	if exists(out1) || exists(out2) {
		t.Error("records whose lease ran out are still there")
	}
	f.run(t, "release", "-scope", "", "-key", "never-was").want(t, exitNotFound).contains(t, "no record")

	// A record a waiter watches: the release wakes it.
	watched, _ := hold(t, f.store, "", "watched", time.Minute, time.Hour)
	if a, err := f.store.Acquire(ctx, idempotency.AcquireRequest{Key: watched, Token: newToken(), Fingerprint: "fp-watched", Lease: time.Minute, TTL: time.Hour}); err != nil || a.Outcome != idempotency.InFlight {
		t.Fatalf("duplicate: %+v, %v", a, err)
	}
	sub := f.client.Subscribe(ctx, f.store.Channel(watched))
	defer sub.Close()
	if _, err := sub.Receive(ctx); err != nil { // the confirmation
		t.Fatal(err)
	}
	f.run(t, "inspect", watched).want(t, exitOK).contains(t, "watched      yes")
	f.run(t, "release", "-force", watched).want(t, exitOK)
	select {
	case m := <-sub.Channel():
		if m.Payload != "released" {
			t.Errorf("message %q, want released", m.Payload)
		}
	case <-time.After(5 * time.Second):
		t.Error("no message on the record's channel after release")
	}
}

func TestRedisDeleteRefusesChangedRecord(t *testing.T) {
	f := newRedisFixture(t)
	ctx := context.Background()
	sk, tok := hold(t, f.store, "", "k", time.Minute, time.Hour)
	b := &redisBackend{client: f.client, where: "test", prefix: testPrefix}
	rec, raw, err := b.read(ctx, sk, 0)
	if err != nil || rec == nil {
		t.Fatal(rec, err)
	}
	// A heartbeat after the read changes the lease (a minute longer): the
	// delete judged on the read must not land.
	if err := f.store.Extend(ctx, sk, tok, 2*time.Minute); err != nil {
		t.Fatal(err)
	}
	n, err := deleteScript.Run(ctx, f.client, []string{testPrefix + sk}, b.deleteArgs(sk, raw, rec)...).Int()
	if err != nil || n != 0 {
		t.Errorf("delete of a changed record: %d, %v; want 0", n, err)
	}
	if f.client.Exists(ctx, testPrefix+sk).Val() != 1 {
		t.Error("the changed record was deleted")
	}
}

func TestRedisList(t *testing.T) {
	f := newRedisFixture(t)
	ctx := context.Background()
	var completes, running []string
	for i := range 3 {
		completes = append(completes, complete(t, f.store, "", fmt.Sprint("done-", i), jsonResponse(kib), time.Hour))
	}
	for i := range 2 {
		sk, _ := hold(t, f.store, "", fmt.Sprint("run-", i), time.Minute, time.Hour)
		running = append(running, sk)
	}
	// One record acquired 40 minutes ago, by its TTL: 20 minutes are left.
	old, _ := hold(t, f.store, "", "old", time.Minute, time.Hour)
	if err := f.client.PExpire(ctx, testPrefix+old, 20*time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	running = append(running, old)
	// Keys that are not records of this prefix.
	other := redisstore.New(f.client, redisstore.WithPrefix("other:"))
	defer other.Close()
	complete(t, other, "", "elsewhere", jsonResponse(kib), time.Hour)
	f.client.Set(ctx, testPrefix+"config", "x", 0)

	rows := f.run(t, "list").want(t, exitOK).contains(t, "STORAGE KEY", "idemctl list: 6 records").rows()
	if len(rows) != 6 {
		t.Fatalf("list: %d rows, want 6:\n%s", len(rows), strings.Join(rows, "\n"))
	}
	r := f.run(t, "list", "-state", "in_progress", "-ttl", "1h").want(t, exitOK)
	if got := keysOf(r.rows()); !sameSet(got, running) {
		t.Errorf("list -state in_progress: %v, want %v", got, running)
	}
	r = f.run(t, "list", "-state", "in-progress", "-ttl", "1h", "-older", "30m").want(t, exitOK)
	if got := keysOf(r.rows()); len(got) != 1 || got[0] != old {
		t.Errorf("list -older 30m: %v, want %s", got, old)
	}
	if row := r.rows()[0]; !strings.Contains(row, "in_progress") || !strings.Contains(row, " 40m") {
		t.Errorf("row %q", row)
	}

	lines := f.run(t, "list", "-state", "complete", "-json").want(t, exitOK).jsonLines(t)
	var got []string
	for _, j := range lines {
		got = append(got, j.StorageKey)
		if j.State != stateComplete || j.Status != 201 || j.BodyBytes != 1024 || j.AgeMS == nil {
			t.Errorf("list -json line %+v", j)
		}
	}
	if !sameSet(got, completes) {
		t.Errorf("list -state complete -json: %v, want %v", got, completes)
	}

	f.run(t, "list", "-limit", "2").want(t, exitOK).contains(t, "stopped at -limit 2")
	if n := len(f.run(t, "list", "-limit", "2", "-q").rows()); n != 2 {
		t.Errorf("list -limit 2: %d rows", n)
	}

	// Small batches, with progress reported at every one.
	defer func(d time.Duration) { progressEvery = d }(progressEvery)
	progressEvery = 0
	r = f.run(t, "list", "-batch", "1", "-pause", "1ms").want(t, exitOK).contains(t, "idemctl: scanned ", "scan done")
	if n := len(r.rows()); n != 6 {
		t.Errorf("list -batch 1: %d rows, want 6", n)
	}
	if r = f.run(t, "list", "-batch", "1", "-q"); r.stderr != "" {
		t.Errorf("list -q wrote to stderr: %s", r.stderr)
	}
}

func keysOf(rows []string) []string {
	var out []string
	for _, r := range rows {
		if f := strings.Fields(r); len(f) > 0 {
			out = append(out, f[0])
		}
	}
	return out
}

func sameSet(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	m := map[string]int{}
	for _, x := range a {
		m[x]++
	}
	for _, x := range b {
		if m[x]--; m[x] < 0 {
			return false
		}
	}
	return true
}

func TestRedisStats(t *testing.T) {
	f := newRedisFixture(t, "--maxmemory", "64mb")
	for i := range 20 {
		complete(t, f.store, "tenant-1", fmt.Sprint("charge-", i), jsonResponse(kib), 24*time.Hour)
	}
	hold(t, f.store, "", "live", time.Minute, time.Hour)
	ranOut, _ := hold(t, f.store, "", "ran-out", 10*time.Millisecond, time.Hour)
	f.waitRanOut(t, ranOut)

	var res statsResult
	f.run(t, "stats", "-json", "-sample", "5").want(t, exitOK).decode(t, &res)
	cats := map[string]*category{}
	for _, c := range res.Categories {
		cats[c.State] = c
	}
	if c := cats[stateComplete]; c == nil || c.Records != 20 || c.BodyBytes != 20*1024 || c.Sampled != 5 || c.EstimatedBytes != 20*c.BytesPerRecord {
		t.Fatalf("complete: %+v", c)
	}
	perRecord := cats[stateComplete].BytesPerRecord
	if perRecord < 1024 || perRecord > 4096 {
		t.Errorf("a complete record with a 1 KiB body takes %d bytes, want 1–4 KiB", perRecord)
	}
	t.Logf("MEMORY USAGE of a COMPLETE record with a 1 KiB body: %d bytes", perRecord)
	if c := cats[catLive]; c == nil || c.Records != 1 || c.BytesPerRecord <= 0 {
		t.Errorf("in progress, live: %+v", c)
	} else {
		t.Logf("MEMORY USAGE of an IN_PROGRESS record: %d bytes", c.BytesPerRecord)
	}
	if c := cats[catRanOut]; c == nil || c.Records != 1 {
		t.Errorf("in progress, ran out: %+v", c)
	}
	if res.Records != 22 || len(res.Servers) != 1 || res.Servers[0].MaxMemory != 64<<20 || res.Servers[0].Policy != "noeviction" {
		t.Errorf("stats: %d records, servers %+v", res.Records, res.Servers)
	}
	f.run(t, "stats").want(t, exitOK).contains(t, "STATE", "complete", "in_progress_live", "maxmemory-policy noeviction", "total")
}

// safeRedis is a configuration check passes.
var safeRedis = []string{"--maxmemory-policy", "noeviction", "--maxmemory", "64mb", "--appendonly", "yes", "--appendfsync", "everysec"}

func TestRedisCheck(t *testing.T) {
	t.Run("evicting policy fails", func(t *testing.T) {
		f := newRedisFixture(t, "--maxmemory-policy", "allkeys-lru", "--maxmemory", "64mb")
		r := f.run(t, "check").want(t, exitFailure)
		r.lines(t, [][]string{{"FAIL", "maxmemory-policy", "allkeys-lru"}}).contains(t, "an evicting policy", "UNSAFE: 1 FAIL")
	})
	t.Run("safe config passes", func(t *testing.T) {
		f := newRedisFixture(t, safeRedis...)
		r := f.run(t, "check").want(t, exitOK)
		r.lines(t, [][]string{{"OK", "maxmemory-policy", "noeviction"}, {"OK", "persistence", "appendonly yes, appendfsync everysec"},
			{"OK", "version"}, {"INFO", "clock"}}).contains(t, "safe: 0 FAIL, 0 WARN")
		if strings.Contains(r.stdout, "\nWARN") || strings.Contains(r.stdout, "\nFAIL") {
			t.Errorf("warnings on a safe server:\n%s", r.stdout)
		}
		f.run(t, "check", "-strict").want(t, exitOK)
		f.run(t, "check", "-v").want(t, exitOK).contains(t, "records are never evicted")
		// A managed service's server stops the same way.
		t.Cleanup(func() { redistest.Do(f.addr, "CONFIG", "SET", "appendonly", "no") })
	})
	t.Run("replicated master without min-replicas-to-write warns", func(t *testing.T) {
		master := redistest.Start(t, "--maxmemory", "64mb")
		redistest.StartReplica(t, master, "--maxmemory", "64mb")
		r := idemctl(t, nil, "check", "-redis", master.Addr()).want(t, exitOK)
		r.lines(t, [][]string{{"WARN", "replication", "min-replicas-to-write 0, 1 replicas"}}).contains(t, "min-replicas-to-write 1", "safe, with warnings")
		idemctl(t, nil, "check", "-redis", master.Addr(), "-strict").want(t, exitFailure)
		var out struct {
			Verdict  servercheck.Verdict   `json:"verdict"`
			Findings []servercheck.Finding `json:"findings"`
		}
		idemctl(t, nil, "check", "-redis", master.Addr(), "-json").want(t, exitOK).decode(t, &out)
		if out.Verdict != servercheck.Warn {
			t.Errorf("check -json verdict %v, want WARN", out.Verdict)
		}
		found := false
		for _, f := range out.Findings {
			found = found || (f.Item == "replication" && f.Verdict == servercheck.Warn && f.Node == master.Addr())
		}
		if !found {
			t.Errorf("no WARN replication finding in %+v", out.Findings)
		}
	})
	t.Run("sentinel", func(t *testing.T) {
		st := redistest.StartSentinel(t)
		sk := complete(t, sentinelStore(t, st), "", "via-sentinel", jsonResponse([]byte("{}")), time.Hour)
		conn := []string{"-sentinel", st.Sentinel.Addr(), "-master", st.MasterName, "-prefix", testPrefix}
		idemctl(t, nil, append([]string{"inspect", sk}, conn...)...).want(t, exitOK).contains(t, "state        complete")
		idemctl(t, nil, append([]string{"check"}, conn...)...).want(t, exitOK).
			lines(t, [][]string{{"WARN", "replication", "min-replicas-to-write 0, 1 replicas", "[" + st.Master.Addr() + "]"}}).
			contains(t, `redis sentinel master "`+st.MasterName+`"`)
	})
}

func sentinelStore(t *testing.T, st *redistest.Sentinel) *redisstore.Store {
	c := redis.NewFailoverClient(&redis.FailoverOptions{MasterName: st.MasterName, SentinelAddrs: st.SentinelAddrs()})
	t.Cleanup(func() { c.Close() })
	s := redisstore.New(c, redisstore.WithPrefix(testPrefix))
	t.Cleanup(func() { s.Close() })
	return s
}

func TestRedisCluster(t *testing.T) {
	cl := redistest.StartCluster(t, 3)
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cl.Addrs(), ContextTimeoutEnabled: true})
	t.Cleanup(func() { c.Close() })
	f := fixtureOn(t, c, "", "-redis", strings.Join(cl.Addrs(), ","), "-cluster")

	var keys []string
	for i := range 12 {
		keys = append(keys, complete(t, f.store, "", fmt.Sprint("k-", i), jsonResponse([]byte("{}")), time.Hour))
	}
	// The keys are spread over the masters, and list finds them all.
	perNode := map[string]int{}
	for _, k := range keys {
		n, err := c.MasterForKey(context.Background(), testPrefix+k)
		if err != nil {
			t.Fatal(err)
		}
		perNode[n.Options().Addr]++
	}
	if len(perNode) < 2 {
		t.Fatalf("the keys sit on %d masters", len(perNode))
	}
	rows := f.run(t, "list", "-batch", "2").want(t, exitOK).rows()
	if got := keysOf(rows); !sameSet(got, keys) {
		t.Errorf("list on a Cluster: %d keys, want %d", len(got), len(keys))
	}
	f.run(t, "inspect", keys[0]).want(t, exitOK).contains(t, "state        complete")
	f.run(t, "delete", "-force", keys[1]).want(t, exitOK)
	f.run(t, "inspect", keys[1]).want(t, exitNotFound)
	var res statsResult
	f.run(t, "stats", "-json").want(t, exitOK).decode(t, &res)
	if res.Records != 11 || len(res.Servers) != 3 {
		t.Errorf("stats on a Cluster: %d records, %d servers", res.Records, len(res.Servers))
	}
	if !slices.IsSortedFunc(res.Servers, func(a, b serverMemory) int { return strings.Compare(a.Node, b.Node) }) {
		t.Errorf("stats on a Cluster: masters not in address order: %+v", res.Servers)
	}
	f.run(t, "check").want(t, exitOK).lines(t, [][]string{{"OK", "cluster-slots", "16384 of 16384 slots"},
		{"WARN", "cluster-replicas", "3 of 3 masters without a live replica"}, {"OK", "clock-spread"}})

	// The -cluster URL form reaches the same records.
	u := "redis://" + cl.Addrs()[0] + "?addr=" + cl.Addrs()[1]
	idemctl(t, nil, "inspect", "-redis", u, "-cluster", "-prefix", testPrefix, keys[0]).want(t, exitOK)
}

func TestRedisProgressStaysQuietOnShortScans(t *testing.T) {
	f := newRedisFixture(t)
	complete(t, f.store, "", "one", jsonResponse([]byte("{}")), time.Hour)
	r := f.run(t, "list").want(t, exitOK)
	if strings.Contains(r.stderr, "scanned") {
		t.Errorf("a short scan reported progress: %s", r.stderr)
	}
	var b bytes.Buffer
	p := newProgress(&cli{stderr: &b}, false, "keys")
	p.tick()
	if b.Len() != 0 {
		t.Errorf("progress reported before %v: %q", progressEvery, b.String())
	}
}

// TestRedisHeads: records of the current layout as redisstore leaves them
// in each state, and heads acquire.lua would refuse.
func TestRedisHeads(t *testing.T) {
	f := newRedisFixture(t)
	ctx := context.Background()

	// A steal: epoch 2, held by the new token.
	sk, _ := hold(t, f.store, "", "stolen", 20*time.Millisecond, time.Hour)
	f.waitRanOut(t, sk)
	tok := newToken()
	a, err := f.store.Acquire(ctx, idempotency.AcquireRequest{Key: sk, Token: tok, Fingerprint: "fp-stolen", Lease: time.Minute, TTL: time.Hour})
	if err != nil || a.Outcome != idempotency.Stolen {
		t.Fatalf("steal: %+v, %v", a, err)
	}
	var j recordJSON
	f.run(t, "inspect", sk, "-json").want(t, exitOK).decode(t, &j)
	if j.State != stateInProgress || j.Epoch != 2 || j.Token != tok || j.LeaseLeftMS == nil || *j.LeaseLeftMS < 50_000 || j.Watched {
		t.Errorf("stolen record: %+v", j)
	}
	// The lease end inspect shows is the one in the head, in Unix ms.
	h := f.client.HGet(ctx, testPrefix+sk, "h").Val()
	if j.LeaseEnd == nil || !strings.Contains(h, fmt.Sprintf("2:%d:", j.LeaseEnd.UnixMilli())) {
		t.Errorf("lease end %v, head %q", j.LeaseEnd, h)
	}

	// Headers larger than what list reads of a value: list counts the
	// record without its status; inspect reads it whole.
	big := jsonResponse([]byte("{}"))
	big.Header.Set("X-Big", strings.Repeat("b", scanReadLimit))
	bigKey := complete(t, f.store, "", "big-headers", big, time.Hour)
	lines := f.run(t, "list", "-json", "-state", "complete").want(t, exitOK).jsonLines(t)
	if len(lines) != 1 || lines[0].State != stateComplete || lines[0].Status != 0 || lines[0].Unread == "" || lines[0].BodyBytes != 2 {
		t.Errorf("list of a record with large headers: %+v", lines)
	}
	f.run(t, "inspect", bigKey).want(t, exitOK).contains(t, "status       201 Created", "X-Big: bbbb", "body         2 bytes")

	corrupt := []struct {
		problem string
		fields  []any
	}{
		{"field h: malformed state or token length", []any{"h", "x3:abc1:5:fp"}},
		{"field h: malformed epoch or lease end", []any{"h", "p3:abc01:5:fp"}},
		{"field h: malformed epoch or lease end", []any{"h", "p3:abc1:0:fp"}},
		{`field "cfp" (the payload) is missing`, []any{"h", "c3:abc1:5:fp"}},
		{"payload: malformed meta length", []any{"h", "c3:abc1:5:fp", "cfp", "\x7f"}},
		{"field h is missing", []any{"other", "x"}},
	}
	for i, c := range corrupt {
		k := idempotency.StorageKey("", fmt.Sprint("corrupt-", i))
		if err := f.client.HSet(ctx, testPrefix+k, c.fields...).Err(); err != nil {
			t.Fatal(err)
		}
		f.client.PExpire(ctx, testPrefix+k, time.Hour)
		f.run(t, "inspect", k).want(t, exitOK).contains(t, "state        corrupt: "+c.problem)
	}
	if n := len(f.run(t, "list", "-state", "corrupt").want(t, exitOK).rows()); n != len(corrupt) {
		t.Errorf("list -state corrupt: %d rows, want %d", n, len(corrupt))
	}
}
