package reliability_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/internal/redisrecord"
	"github.com/go-idempotency/idempotency/internal/redistest"
	"github.com/go-idempotency/idempotency/internal/reliability"
)

// TestCorruptRecordsOverHTTP plants values under the record's Redis key that
// the store never wrote: every request answers 500 record_unreadable, the
// observer gets an EventStoreError wrapping ErrCorruptRecord, the handler
// never runs and nothing is replayed or overwritten.
func TestCorruptRecordsOverHTTP(t *testing.T) {
	ctx := context.Background()
	c := redis.NewClient(&redis.Options{Addr: redistest.Addr(t)})
	t.Cleanup(func() { c.Close() })
	prefix := redistest.Prefix()
	store := newRedisStoreWithPrefix(t, c, prefix)
	ev := &events{}
	ex := newExecutions()
	srv, client := serve(t, idempotency.New(store, idempotency.WithObserver(ev.observe))(echoHandler(ex, nil)))

	// A genuine record, to take real fields from.
	if a := postKey(client, srv.URL, "genuine", "b"); a.status != 201 {
		t.Fatal(a)
	}
	// It is written once its client has the response.
	waitUntil(t, 5*time.Second, "the genuine record", func() bool { return ev.count(idempotency.EventExecuted, "") == 1 })
	genuine := c.HGetAll(ctx, prefix+idempotency.StorageKey("", "genuine")).Val()
	// The head and the payload, decoded (see internal/redisrecord).
	head, err := redisrecord.ParseHead(genuine[redisrecord.HeadField])
	if err != nil {
		t.Fatalf("the genuine record's head: %v", err)
	}
	fp := head.Fingerprint
	payload, ok := genuine[redisrecord.PayloadField(fp)]
	if len(genuine) != 2 || !ok {
		t.Fatalf("the genuine record %q is not a head and its payload", genuine)
	}
	metaStart, metaEnd, err := redisrecord.MetaBounds(payload, len(payload))
	if err != nil {
		t.Fatalf("the genuine record's payload: %v", err)
	}
	meta := payload[metaStart:metaEnd]
	with := func(fields map[string]string, changes ...any) []any {
		m := map[string]any{}
		for k, v := range fields {
			m[k] = v
		}
		for i := 0; i+1 < len(changes); i += 2 {
			if changes[i+1] == nil {
				delete(m, changes[i].(string))
			} else {
				m[changes[i].(string)] = changes[i+1]
			}
		}
		var out []any
		for k, v := range m {
			out = append(out, k, v)
		}
		return out
	}
	// A head in progress, with the given epoch and lease end, and no payload.
	running := func(epoch, end string) []any { return []any{"h", "p1:t" + epoch + ":" + end + ":" + fp} }
	plants := map[string]func(rkey string){
		"string":       func(rkey string) { c.Set(ctx, rkey, "not a record", 0) },
		"list":         func(rkey string) { c.RPush(ctx, rkey, "a", "b") },
		"set":          func(rkey string) { c.SAdd(ctx, rkey, "a") },
		"sorted set":   func(rkey string) { c.ZAdd(ctx, rkey, redis.Z{Score: 1, Member: "a"}) },
		"stream":       func(rkey string) { c.XAdd(ctx, &redis.XAddArgs{Stream: rkey, Values: []string{"a", "b"}}) },
		"foreign hash": func(rkey string) { c.HSet(ctx, rkey, "user", "42", "name", "someone else's data") },
		"truncated meta": func(rkey string) {
			c.HSet(ctx, rkey, with(genuine, "c"+fp, payload[:metaEnd-2])...)
		},
		"empty payload":              func(rkey string) { c.HSet(ctx, rkey, with(genuine, "c"+fp, "")...) },
		"garbage payload":            func(rkey string) { c.HSet(ctx, rkey, with(genuine, "c"+fp, "\xff\xff\xff\xff")...) },
		"meta length past the end":   func(rkey string) { c.HSet(ctx, rkey, with(genuine, "c"+fp, "\x7f"+meta)...) },
		"missing payload":            func(rkey string) { c.HSet(ctx, rkey, with(genuine, "c"+fp, nil)...) },
		"missing head":               func(rkey string) { c.HSet(ctx, rkey, with(genuine, "h", nil, "c"+fp, nil, "x", "1")...) },
		"unknown state":              func(rkey string) { c.HSet(ctx, rkey, "h", "x"+genuine["h"][1:]) },
		"epoch not a number":         func(rkey string) { c.HSet(ctx, rkey, running("many", "1")...) },
		"epoch nan":                  func(rkey string) { c.HSet(ctx, rkey, running("nan", "1")...) },
		"epoch inf":                  func(rkey string) { c.HSet(ctx, rkey, running("inf", "1")...) },
		"epoch 2^63":                 func(rkey string) { c.HSet(ctx, rkey, running("9223372036854775808", "99999999999999")...) },
		"expired lease, epoch 2^63":  func(rkey string) { c.HSet(ctx, rkey, running("9223372036854775808", "1")...) },
		"lease end of 400 digits":    func(rkey string) { c.HSet(ctx, rkey, running("1", strings.Repeat("9", 400))...) },
		"lease end of 16 digits":     func(rkey string) { c.HSet(ctx, rkey, running("1", "1000000000000000")...) },
		"lease end 0":                func(rkey string) { c.HSet(ctx, rkey, running("1", "0")...) },
		"token longer than the head": func(rkey string) { c.HSet(ctx, rkey, "h", "p999:t1:1:"+fp) },
	}
	var ops, faults, violations int64
	for name, plant := range plants {
		key := "corrupt-" + strings.ReplaceAll(name, " ", "-")
		rkey := prefix + idempotency.StorageKey("", key)
		plant(rkey)
		c.PExpire(ctx, rkey, time.Hour)
		faults++
		// A hash is compared field by field: a read may move a hash table
		// on by a step of its incremental rehashing, which changes DUMP's
		// order but nothing stored.
		snapshot := func() string {
			if c.Type(ctx, rkey).Val() == "hash" {
				return fmt.Sprint(c.HGetAll(ctx, rkey).Val())
			}
			return c.Dump(ctx, rkey).Val()
		}
		before := snapshot()
		for i := 0; i < 2; i++ {
			ops++
			a := postKey(client, srv.URL, key, "b")
			if a.status != 500 || a.code != string(idempotency.CodeRecordUnreadable) || a.replayed {
				t.Errorf("%s: %v, want 500 record_unreadable", name, a)
				violations++
			}
		}
		if ex.of(key) != 0 {
			t.Errorf("%s: the handler ran on a corrupt record", name)
			violations++
		}
		if after := snapshot(); after != before || c.PTTL(ctx, rkey).Val() < 59*time.Minute {
			t.Errorf("%s: the corrupt value was changed", name)
			violations++
		}
	}
	n := 0
	for _, e := range ev.all {
		if e.Kind == idempotency.EventStoreError {
			if !errors.Is(e.Err, idempotency.ErrCorruptRecord) || e.Status != 500 {
				t.Errorf("store error event %+v does not wrap ErrCorruptRecord with status 500", e)
			}
			n++
		}
	}
	if n != 2*len(plants) {
		t.Errorf("%d store error events for %d corrupt requests", n, 2*len(plants))
	}
	reliability.Report(t, reliability.Result{Scenario: "bad input: corrupt records in Redis", Store: "redis",
		Operations: ops, Faults: faults, Violations: violations})
}

// rawRequest sends a hand-written HTTP/1.1 request to addr and returns the
// status code of the reply.
func rawRequest(t *testing.T, addr, head string, body []byte) int {
	t.Helper()
	conn, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	go func() {
		io.WriteString(conn, head)
		conn.Write(body)
	}()
	res, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("reading the response: %v", err)
	}
	res.Body.Close()
	return res.StatusCode
}

// TestOversizedInputThroughServer: oversized keys, bodies and header counts
// sent over a real connection get their documented 4xx, and the handler
// never runs.
func TestOversizedInputThroughServer(t *testing.T) {
	ex := newExecutions()
	srv, client := serve(t, idempotency.New(newMemstore(t), idempotency.WithMaxRequestBody(64<<10))(echoHandler(ex, nil)))
	addr := strings.TrimPrefix(srv.URL, "http://")
	manyKeys := strings.Repeat("Idempotency-Key: k\r\n", 1000)
	cases := []struct {
		name string
		head string
		body []byte
		want int
	}{
		{"1000 key lines", "POST / HTTP/1.1\r\nHost: x\r\n" + manyKeys + "Content-Length: 0\r\n\r\n", nil, 400},
		{"two key lines", "POST / HTTP/1.1\r\nHost: x\r\nIdempotency-Key: a\r\nIdempotency-Key: b\r\nContent-Length: 0\r\n\r\n", nil, 400},
		{"256-byte key", "POST / HTTP/1.1\r\nHost: x\r\nIdempotency-Key: " + strings.Repeat("k", 256) + "\r\nContent-Length: 0\r\n\r\n", nil, 400},
		{"256-byte quoted key", "POST / HTTP/1.1\r\nHost: x\r\nIdempotency-Key: \"" + strings.Repeat("k", 256) + "\"\r\nContent-Length: 0\r\n\r\n", nil, 400},
		{"64KiB key", "POST / HTTP/1.1\r\nHost: x\r\nIdempotency-Key: " + strings.Repeat("k", 64<<10) + "\r\nContent-Length: 0\r\n\r\n", nil, 400},
		{"body over the cap", "POST / HTTP/1.1\r\nHost: x\r\nIdempotency-Key: big\r\nContent-Length: 70000\r\n\r\n", bytes.Repeat([]byte("x"), 70000), 413},
		{"chunked body over the cap", "POST / HTTP/1.1\r\nHost: x\r\nIdempotency-Key: big2\r\nTransfer-Encoding: chunked\r\n\r\n",
			[]byte(fmt.Sprintf("%x\r\n%s\r\n0\r\n\r\n", 70000, strings.Repeat("y", 70000))), 413},
		{"control byte in key", "POST / HTTP/1.1\r\nHost: x\r\nIdempotency-Key: a\x01b\r\nContent-Length: 0\r\n\r\n", nil, 400},
	}
	var violations int64
	for _, tc := range cases {
		if got := rawRequest(t, addr, tc.head, tc.body); got != tc.want {
			t.Errorf("%s: status %d, want %d", tc.name, got, tc.want)
			violations++
		}
	}
	if ex.total() != 0 {
		t.Errorf("the handler ran %d times on refused input", ex.total())
		violations++
	}
	// The server still serves a good request afterwards.
	if a := postKey(client, srv.URL, "fine", "b"); a.status != 201 {
		t.Errorf("good request after bad input: %v", a)
	}
	reliability.Report(t, reliability.Result{Scenario: "bad input: oversized keys, bodies, header lines", Store: "memstore",
		Operations: int64(len(cases)) + 1, Faults: int64(len(cases)), Violations: violations})
}
