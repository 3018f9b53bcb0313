package load_test

import (
	"fmt"
	"io"
	"net/http"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/benchmarks/load"
	"github.com/go-idempotency/idempotency/memstore"
	"github.com/go-idempotency/idempotency/replaycache"
)

// BenchmarkLoopback measures whole HTTP requests over loopback (client and
// server in this process) with a 1 KiB response body: the bare handler,
// and the handler behind the middleware on memstore for first executions
// (a fresh key per request) and replays (one completed key), and replays
// with a replaycache in front of memstore (CachedReplay). clients=16 sends
// from 16 goroutines over kept-alive connections. Compare the rows of one
// run: ns/op is the inverse of throughput.
func BenchmarkLoopback(b *testing.B) {
	payload := load.Payload(1 << 10)
	for _, clients := range []int{1, 16} {
		for _, name := range []string{"Bare", "FirstExecution", "Replay", "CachedReplay"} {
			b.Run(fmt.Sprintf("%s/clients=%d", name, clients), func(b *testing.B) {
				h := load.Handler(payload)
				if name != "Bare" {
					s := memstore.New(memstore.WithMaxEntries(1<<26), memstore.WithMaxBytes(1<<40))
					b.Cleanup(func() { s.Close() })
					var store idempotency.Store = s
					if name == "CachedReplay" {
						store = replaycache.New(s)
					}
					h = idempotency.New(store)(h)
				}
				srv, err := load.Serve(h)
				if err != nil {
					b.Fatal(err)
				}
				b.Cleanup(func() { srv.Close() })
				client := load.NewClient(clients)
				b.Cleanup(client.CloseIdleConnections)
				url := srv.URL + "/payments"
				var seq atomic.Int64
				key := func() string { return "k" + strconv.FormatInt(seq.Add(1), 10) }
				if name == "Replay" || name == "CachedReplay" {
					key = func() string { return "replayed" }
					if err := seed(client, url, "replayed"); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportAllocs()
				b.ResetTimer()
				if clients == 1 {
					for i := 0; i < b.N; i++ {
						if err := post(client, url, key(), http.StatusCreated); err != nil {
							b.Fatal(err)
						}
					}
					return
				}
				b.SetParallelism((clients + runtime.GOMAXPROCS(0) - 1) / runtime.GOMAXPROCS(0))
				b.RunParallel(func(pb *testing.PB) {
					for pb.Next() {
						if err := post(client, url, key(), http.StatusCreated); err != nil {
							b.Error(err)
							return
						}
					}
				})
			})
		}
	}
}

func post(c *http.Client, url, key string, want int) error {
	status, _, err := send(c, url, key)
	if err == nil && status != want {
		err = fmt.Errorf("status %d, want %d", status, want)
	}
	return err
}

func send(c *http.Client, url, key string) (status int, replayed bool, err error) {
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(`{"amount":"10.00"}`))
	if err != nil {
		return 0, false, err
	}
	req.Header["Idempotency-Key"] = []string{key}
	resp, err := c.Do(req)
	if err != nil {
		return 0, false, err
	}
	_, err = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode, resp.Header.Get("Idempotent-Replayed") == "true", err
}

// seed completes key's record and returns once it is stored: the response
// comes before the record is written, so a duplicate right after it may
// still get 409.
func seed(c *http.Client, url, key string) error {
	deadline := time.Now().Add(5 * time.Second)
	for {
		status, replayed, err := send(c, url, key)
		switch {
		case err != nil:
			return err
		case replayed:
			return nil
		case status != http.StatusCreated && status != http.StatusConflict:
			return fmt.Errorf("seeding %s: status %d", key, status)
		case time.Now().After(deadline):
			return fmt.Errorf("seeding %s: not stored after 5s", key)
		}
		time.Sleep(time.Millisecond)
	}
}

// BenchmarkLoopbackPaired is BenchmarkLoopback made robust to a busy
// machine: every client alternates a request to the bare server with one to
// the middleware's, so both see the same background load, and the
// benchmark reports the mean latency of each and their ratio
// (bare/middleware: the middleware's throughput relative to the bare
// handler's for one client). An op is one request of each. It runs one
// client only: with many, every request waits behind all the others and
// the latencies of both kinds converge to the same queueing delay.
//
// CachedReplay puts a replaycache in front of memstore, and each op sends
// a third request, a replay by the middleware on memstore alone, before or
// after the cached one in turn: it also reports that replay's mean latency
// and the cached replay's throughput relative to it (vs-replay), the two
// measured side by side.
func BenchmarkLoopbackPaired(b *testing.B) {
	payload := load.Payload(1 << 10)
	for _, clients := range []int{1} {
		for _, name := range []string{"FirstExecution", "Replay", "CachedReplay"} {
			b.Run(fmt.Sprintf("%s/clients=%d", name, clients), func(b *testing.B) {
				bare, err := load.Serve(load.Handler(payload))
				if err != nil {
					b.Fatal(err)
				}
				b.Cleanup(func() { bare.Close() })
				s := memstore.New(memstore.WithMaxEntries(1<<26), memstore.WithMaxBytes(1<<40))
				b.Cleanup(func() { s.Close() })
				var store idempotency.Store = s
				if name == "CachedReplay" {
					store = replaycache.New(s)
				}
				mw, err := load.Serve(idempotency.New(store)(load.Handler(payload)))
				if err != nil {
					b.Fatal(err)
				}
				b.Cleanup(func() { mw.Close() })
				// ref, for CachedReplay: the middleware on memstore alone,
				// over the same records.
				var ref *load.Server
				if name == "CachedReplay" {
					if ref, err = load.Serve(idempotency.New(s)(load.Handler(payload))); err != nil {
						b.Fatal(err)
					}
					b.Cleanup(func() { ref.Close() })
				}
				client := load.NewClient(3 * clients)
				b.Cleanup(client.CloseIdleConnections)
				var seq atomic.Int64
				key := func() string { return "k" + strconv.FormatInt(seq.Add(1), 10) }
				if name != "FirstExecution" {
					key = func() string { return "replayed" }
					if err := seed(client, mw.URL, "replayed"); err != nil {
						b.Fatal(err)
					}
				}
				var bareNs, mwNs, refNs, turn atomic.Int64
				// timed sends one request and adds its time to ns.
				timed := func(url, k string, ns *atomic.Int64) error {
					start := time.Now()
					if err := post(client, url, k, http.StatusCreated); err != nil {
						return err
					}
					ns.Add(int64(time.Since(start)))
					return nil
				}
				pair := func() error {
					k := key()
					if err := timed(bare.URL, k, &bareNs); err != nil {
						return err
					}
					if ref == nil {
						return timed(mw.URL, k, &mwNs)
					}
					first, second := mw.URL, ref.URL
					firstNs, secondNs := &mwNs, &refNs
					if turn.Add(1)%2 == 0 {
						first, second, firstNs, secondNs = second, first, secondNs, firstNs
					}
					if err := timed(first, k, firstNs); err != nil {
						return err
					}
					return timed(second, k, secondNs)
				}
				b.ReportAllocs()
				b.ResetTimer()
				if clients == 1 {
					for i := 0; i < b.N; i++ {
						if err := pair(); err != nil {
							b.Fatal(err)
						}
					}
				} else {
					b.SetParallelism((clients + runtime.GOMAXPROCS(0) - 1) / runtime.GOMAXPROCS(0))
					b.RunParallel(func(pb *testing.PB) {
						for pb.Next() {
							if err := pair(); err != nil {
								b.Error(err)
								return
							}
						}
					})
				}
				b.StopTimer()
				b.ReportMetric(float64(bareNs.Load())/float64(b.N)/1e3, "bare-µs/req")
				b.ReportMetric(float64(mwNs.Load())/float64(b.N)/1e3, "mw-µs/req")
				b.ReportMetric(float64(bareNs.Load())/float64(mwNs.Load()), "throughput-ratio")
				if ref != nil {
					b.ReportMetric(float64(refNs.Load())/float64(b.N)/1e3, "replay-µs/req")
					b.ReportMetric(float64(refNs.Load())/float64(mwNs.Load()), "vs-replay")
				}
			})
		}
	}
}
