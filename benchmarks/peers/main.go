// Command peers measures the idempotency middleware beside the other Go
// idempotency middleware the Go module proxy serves, side by side in one
// run: each stack serves its bare handler and the same handler behind its
// idempotency middleware on loopback HTTP, the same client drives both with
// first executions (a new key each) and with replays (keys already
// completed), and the result is each middleware's throughput as a fraction
// of its own bare handler's. Stacks differ in their HTTP servers, so the
// fraction, not the absolute rate, is what compares the middleware.
//
// Peers measured: github.com/gofiber/fiber/v2/middleware/idempotency (on
// fasthttp, with its in-memory storage and locker). The net/http
// idempotency libraries found in public code (for example
// AnandSundar/go-idempotency, dhanapala-id/go-kit, pwnedgod/idemgotent)
// are not served by the module proxy this runs against, so they are not
// measured.
//
// It belongs to the benchmarks module, so that the peers stay out of the
// library's dependencies:
//
//	cd benchmarks && go run ./peers [-duration 2s] [-rounds 3] [-concurrency 16] [-body 1024]
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"slices"
	"sync/atomic"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/benchmarks/load"
	"github.com/go-idempotency/idempotency/memstore"
	"github.com/gofiber/fiber/v2"
	fiberidem "github.com/gofiber/fiber/v2/middleware/idempotency"
)

// target is one server: a base URL and the number of times its handler
// ran.
type target struct {
	url   string
	runs  *atomic.Int64
	close func()
}

// stack builds the bare and the middleware targets of one HTTP stack.
type stack struct {
	name  string
	start func(payload []byte) (bare, mw target, err error)
}

var stacks = []stack{
	{"net/http + idempotency (memstore)", startNetHTTP},
	{"fasthttp + fiber/v2 middleware/idempotency (memory)", startFiber},
}

func main() {
	duration := flag.Duration("duration", 2*time.Second, "measured time per target, mix and round")
	rounds := flag.Int("rounds", 3, "rounds; the median is reported")
	concurrency := flag.Int("concurrency", 16, "concurrent clients")
	body := flag.Int("body", 1024, "response body size in bytes")
	flag.Parse()
	if err := run(os.Stdout, *duration, *rounds, *concurrency, *body); err != nil {
		fmt.Fprintln(os.Stderr, "peers:", err)
		os.Exit(1)
	}
}

func run(w io.Writer, duration time.Duration, rounds, concurrency, body int) error {
	if rounds < 1 || concurrency < 1 || duration <= 0 || body < 0 {
		return errors.New("needs rounds >= 1, concurrency >= 1, duration > 0 and body >= 0")
	}
	d := &driver{client: load.NewClient(concurrency), duration: duration, concurrency: concurrency}
	payload := load.Payload(body)
	fmt.Fprintf(w, "peers: %d client(s), %d B body, %v per run, %d round(s), median\n\n", concurrency, body, duration, rounds)
	fmt.Fprintf(w, "%-52s %-16s %12s %12s %8s %10s %10s\n", "stack", "requests", "bare req/s", "mw req/s", "ratio", "mw p50", "mw p99")
	for _, st := range stacks {
		bare, mw, err := st.start(payload)
		if err != nil {
			return fmt.Errorf("%s: %w", st.name, err)
		}
		err = func() error {
			defer bare.close()
			defer mw.close()
			for _, name := range []string{"first execution", "replay"} {
				m, err := d.compare(bare, mw, rounds, name == "replay")
				if err != nil {
					return fmt.Errorf("%s, %s: %w", st.name, name, err)
				}
				fmt.Fprintf(w, "%-52s %-16s %12.0f %12.0f %7.2fx %10v %10v\n", st.name, name,
					m.bare, m.mw, m.ratio, m.p50.Round(time.Microsecond), m.p99.Round(time.Microsecond))
			}
			return nil
		}()
		if err != nil {
			return err
		}
	}
	return nil
}

// driver sends the same load to every target.
type driver struct {
	client      *http.Client
	duration    time.Duration
	concurrency int
}

// comparison is the median of rounds of one stack and one kind of request.
type comparison struct {
	bare, mw, ratio float64       // requests per second, and mw/bare
	p50, p99        time.Duration // of the middleware, in its last round
}

// compare drives bare and mw in turn for rounds rounds, with new keys or,
// when replay is set, with keys already completed. Each round alternates
// which target goes first, so that drift in the machine's speed during a
// round favours neither.
func (d *driver) compare(bare, mw target, rounds int, replay bool) (comparison, error) {
	mix := load.Mix{load.New: 100}
	if replay {
		mix = load.Mix{load.Dup: 100}
	}
	var bareRates, mwRates, ratios []float64
	var last *load.Result
	for round := range rounds {
		order := []*target{&bare, &mw}
		if round%2 == 1 {
			order[0], order[1] = order[1], order[0]
		}
		rates := map[*target]float64{}
		for _, t := range order {
			before := t.runs.Load()
			res, err := load.Run(context.Background(), d.client, load.Config{URL: t.url, Duration: d.duration, Concurrency: d.concurrency, Mix: mix})
			if err != nil {
				return comparison{}, err
			}
			if res.Errors > 0 {
				return comparison{}, fmt.Errorf("%d errors, first: %v", res.Errors, res.FirstError)
			}
			// A replay must not run the handler: the warm-up's new keys are
			// the only executions a replay run may cause.
			if ran := t.runs.Load() - before; replay && t == &mw && ran > int64(d.concurrency) {
				return comparison{}, fmt.Errorf("the handler ran %d times during a replay run", ran)
			}
			rates[t] = res.Throughput()
			if t == &mw {
				last = res
			}
		}
		bareRates = append(bareRates, rates[&bare])
		mwRates = append(mwRates, rates[&mw])
		ratios = append(ratios, rates[&mw]/rates[&bare])
	}
	return comparison{
		bare: median(bareRates), mw: median(mwRates), ratio: median(ratios),
		p50: last.Latency.P50, p99: last.Latency.P99,
	}, nil
}

func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2]
}

// startNetHTTP serves load.Handler bare and behind idempotency.New over a
// memstore.
func startNetHTTP(payload []byte) (bare, mw target, err error) {
	serve := func(wrap func(http.Handler) http.Handler) (target, error) {
		runs := new(atomic.Int64)
		next := load.Handler(payload)
		srv, err := load.Serve(wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			runs.Add(1)
			next.ServeHTTP(w, r)
		})))
		if err != nil {
			return target{}, err
		}
		return target{url: srv.URL, runs: runs, close: func() { srv.Close() }}, nil
	}
	if bare, err = serve(func(h http.Handler) http.Handler { return h }); err != nil {
		return
	}
	// Bounds far above what a run stores: the defaults (256 MiB) fill up
	// within a few seconds of first executions, and a full store answers 503.
	store := memstore.New(memstore.WithMaxEntries(1<<26), memstore.WithMaxBytes(1<<40))
	if mw, err = serve(idempotency.New(store)); err != nil {
		store.Close()
		bare.close()
		return
	}
	closeServer := mw.close
	mw.close = func() { closeServer(); store.Close() }
	return bare, mw, nil
}

// startFiber serves the same response from fiber, bare and behind fiber's
// idempotency middleware configured for the Idempotency-Key header and any
// non-empty key.
func startFiber(payload []byte) (bare, mw target, err error) {
	serve := func(withMiddleware bool) (target, error) {
		app := fiber.New(fiber.Config{DisableStartupMessage: true})
		if withMiddleware {
			app.Use(fiberidem.New(fiberidem.Config{
				Lifetime:  24 * time.Hour,
				KeyHeader: "Idempotency-Key",
				KeyHeaderValidate: func(k string) error {
					if k == "" {
						return errors.New("empty key")
					}
					return nil
				},
			}))
		}
		runs := new(atomic.Int64)
		app.Post("/payments", func(c *fiber.Ctx) error {
			runs.Add(1)
			c.Set(fiber.HeaderContentType, fiber.MIMEApplicationJSON)
			return c.Status(fiber.StatusCreated).Send(payload)
		})
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return target{}, err
		}
		go func() { _ = app.Listener(ln) }()
		return target{url: "http://" + ln.Addr().String(), runs: runs, close: func() { _ = app.Shutdown() }}, nil
	}
	if bare, err = serve(false); err != nil {
		return
	}
	if mw, err = serve(true); err != nil {
		bare.close()
	}
	return
}
