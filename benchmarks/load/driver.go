package load

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Config describes one measured run.
type Config struct {
	// URL is the server's base URL; requests go to URL + "/payments".
	URL string
	// Duration bounds the measured part of the run.
	Duration time.Duration
	// Concurrency is the number of clients sending requests back to back.
	Concurrency int
	// Mix weighs the request kinds.
	Mix Mix
	// Warm is the number of requests with fresh keys sent before the
	// measurement, whose keys the Dup requests repeat.
	Warm int
	// Progress, when set, is called about once a second with the number
	// of requests completed so far and the time since the start.
	Progress func(done int64, elapsed time.Duration)
}

// Result is what a run measured.
type Result struct {
	Requests int64
	Errors   int64 // transport errors and unexpected statuses
	Elapsed  time.Duration
	// Status counts the responses by status code.
	Status map[int]int64
	// Latency summarises every request; ByKind only those of one kind (a
	// ConcDup pair counts as two requests of kind ConcDup).
	Latency Latency
	ByKind  [kinds]Latency
	// Replayed counts, by kind, the responses marked Idempotent-Replayed.
	Replayed [kinds]int64
	// FirstError is the first error seen, for the report.
	FirstError error
}

// Throughput is requests per second.
func (r *Result) Throughput() float64 {
	if r.Elapsed <= 0 {
		return 0
	}
	return float64(r.Requests) / r.Elapsed.Seconds()
}

// Latency summarises a set of request durations.
type Latency struct {
	N             int
	P50, P99, Max time.Duration
}

func summarise(d []time.Duration) Latency {
	if len(d) == 0 {
		return Latency{}
	}
	slices.Sort(d)
	at := func(q float64) time.Duration { return d[min(len(d)-1, int(q*float64(len(d))))] }
	return Latency{N: len(d), P50: at(0.50), P99: at(0.99), Max: d[len(d)-1]}
}

// NewClient returns an HTTP client keeping up to n idle connections to one
// host, so that n concurrent clients reuse their connections.
func NewClient(n int) *http.Client {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.MaxIdleConns = n
	t.MaxIdleConnsPerHost = n
	t.MaxConnsPerHost = 0
	t.DisableCompression = true
	return &http.Client{Transport: t, Timeout: 30 * time.Second}
}

// requestBody is the JSON body of every request; the fingerprint covers it.
const requestBody = `{"amount":"10.00","currency":"EUR"}`

type worker struct {
	client *http.Client
	url    string
	rng    *mrand.Rand
	lat    [kinds][]time.Duration
	replay [kinds]int64
	status map[int]int64
	errs   int64
	first  error
	mu     sync.Mutex // guards the fields above for the second request of a ConcDup pair
}

// do sends one request and records its outcome; dup says whether the
// request repeats a completed key.
func (w *worker) do(ctx context.Context, key string, kind Kind, dup bool) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, w.url, strings.NewReader(requestBody))
	if err != nil {
		w.fail(err)
		return
	}
	req.Header["Content-Type"] = []string{"application/json"}
	req.Header["Idempotency-Key"] = []string{key}
	if dup {
		req.Header[HeaderKind] = []string{"dup"}
	} else {
		req.Header[HeaderKind] = []string{"new"}
	}
	start := time.Now()
	resp, err := w.client.Do(req)
	if err == nil {
		_, err = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	d := time.Since(start)
	if err != nil {
		if ctx.Err() == nil {
			w.fail(err)
		}
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.lat[kind] = append(w.lat[kind], d)
	w.status[resp.StatusCode]++
	if resp.Header.Get("Idempotent-Replayed") == "true" {
		w.replay[kind]++
	}
	ok := resp.StatusCode == http.StatusCreated ||
		(kind == ConcDup && resp.StatusCode == http.StatusConflict)
	if !ok {
		w.errs++
		if w.first == nil {
			w.first = fmt.Errorf("%s request answered %d", kind, resp.StatusCode)
		}
	}
}

func (w *worker) fail(err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.errs++
	if w.first == nil {
		w.first = err
	}
}

// Run warms the server up, then drives it for cfg.Duration and returns what
// it measured. Requests still in flight when the time is up are cut off and
// not counted. Run returns early, with what it measured, when ctx ends.
func Run(ctx context.Context, client *http.Client, cfg Config) (*Result, error) {
	if cfg.Concurrency < 1 || cfg.Duration <= 0 || cfg.Mix.total() == 0 {
		return nil, errors.New("load: Run needs Concurrency >= 1, Duration > 0 and a mix")
	}
	var prefix [8]byte
	_, _ = rand.Read(prefix[:])
	keyPrefix := "load-" + hex.EncodeToString(prefix[:]) + "-"
	var seq atomic.Int64
	freshKey := func() string { return keyPrefix + strconv.FormatInt(seq.Add(1), 10) }
	url := cfg.URL + "/payments"

	// Warm-up: fills the connection pool and the keys the duplicates repeat.
	warm := max(cfg.Warm, cfg.Concurrency)
	keys := make([]string, warm)
	warmer := &worker{client: client, url: url, status: map[int]int64{}}
	var wg sync.WaitGroup
	next := atomic.Int64{}
	for range cfg.Concurrency {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := next.Add(1) - 1; i < int64(warm); i = next.Add(1) - 1 {
				keys[i] = freshKey()
				warmer.do(ctx, keys[i], New, false)
			}
		}()
	}
	wg.Wait()
	if warmer.errs > 0 {
		return nil, fmt.Errorf("load: warm-up: %d of %d requests failed, first: %v", warmer.errs, warm, warmer.first)
	}
	if err := Settle(ctx, client, url, keys...); err != nil {
		return nil, fmt.Errorf("load: warm-up: %w", err)
	}

	runCtx, cancel := context.WithTimeout(ctx, cfg.Duration)
	defer cancel()
	var done atomic.Int64
	workers := make([]*worker, cfg.Concurrency)
	start := time.Now()
	for i := range workers {
		w := &worker{client: client, url: url, status: map[int]int64{}, rng: mrand.New(mrand.NewPCG(uint64(i), uint64(start.UnixNano())))}
		workers[i] = w
		wg.Add(1)
		go func() {
			defer wg.Done()
			total := cfg.Mix.total()
			for runCtx.Err() == nil {
				switch kind := cfg.Mix.pick(w.rng.IntN(total)); kind {
				case New:
					w.do(runCtx, freshKey(), New, false)
					done.Add(1)
				case Dup:
					w.do(runCtx, keys[w.rng.IntN(len(keys))], Dup, true)
					done.Add(1)
				case ConcDup:
					key := freshKey()
					var pair sync.WaitGroup
					pair.Add(1)
					go func() { defer pair.Done(); w.do(runCtx, key, ConcDup, true) }()
					w.do(runCtx, key, ConcDup, false)
					pair.Wait()
					done.Add(2)
				}
			}
		}()
	}
	stopProgress := make(chan struct{})
	progressDone := make(chan struct{})
	go func() {
		defer close(progressDone)
		if cfg.Progress == nil {
			return
		}
		t := time.NewTicker(time.Second)
		defer t.Stop()
		for {
			select {
			case <-stopProgress:
				return
			case <-t.C:
				cfg.Progress(done.Load(), time.Since(start))
			}
		}
	}()
	wg.Wait()
	elapsed := time.Since(start)
	close(stopProgress)
	<-progressDone

	res := &Result{Elapsed: elapsed, Status: map[int]int64{}}
	var all []time.Duration
	for k := range kinds {
		var lat []time.Duration
		for _, w := range workers {
			lat = append(lat, w.lat[k]...)
		}
		all = append(all, lat...)
		res.ByKind[k] = summarise(lat)
	}
	for _, w := range workers {
		for code, n := range w.status {
			res.Status[code] += n
		}
		res.Errors += w.errs
		for k := range kinds {
			res.Replayed[k] += w.replay[k]
		}
		if res.FirstError == nil {
			res.FirstError = w.first
		}
	}
	res.Latency = summarise(all)
	res.Requests = int64(res.Latency.N)
	return res, nil
}

// Settle waits until each key's record is stored: the middleware answers a
// first request before it writes the record, so a duplicate sent right
// after it may still get 409. Settle repeats each key's request while it is
// answered 409, for at most five seconds in all.
func Settle(ctx context.Context, client *http.Client, url string, keys ...string) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	for _, key := range keys {
		for {
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(requestBody))
			if err != nil {
				return err
			}
			req.Header["Content-Type"] = []string{"application/json"}
			req.Header["Idempotency-Key"] = []string{key}
			resp, err := client.Do(req)
			if err != nil {
				return fmt.Errorf("settling %s: %w", key, err)
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusCreated {
				break // replayed, or a bare handler that keeps no records
			}
			if resp.StatusCode != http.StatusConflict {
				return fmt.Errorf("settling %s: answered %d", key, resp.StatusCode)
			}
			time.Sleep(time.Millisecond) // the record is one store call away
		}
	}
	return nil
}
