package httpbench

import (
	"errors"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/gofiber/fiber/v2"
	fiberidem "github.com/gofiber/fiber/v2/middleware/idempotency"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/benchmarks/load"
	"github.com/go-idempotency/idempotency/memstore"
)

// BenchmarkPeers puts each stack's idempotency middleware beside its own
// bare handler, for first executions and replays: stack=idempotency is
// this middleware on memstore (net/http), stack=fiber is fiber's
// middleware/idempotency with its in-memory storage and lock (fasthttp),
// configured for the Idempotency-Key header and any non-empty key. The
// stacks' HTTP servers differ, so each middleware's time over its own bare
// handler, not the absolute rate, compares them. Fiber's middleware does
// less: its lock works within one process, it keeps no request
// fingerprint, and it stores 5xx responses too.
func BenchmarkPeers(b *testing.B) {
	payload := load.Payload(1 << 10)
	ms := memstore.New(memstore.WithMaxEntries(1<<26), memstore.WithMaxBytes(1<<40))
	b.Cleanup(func() { ms.Close() })
	stacks := map[string][]*side{
		"idempotency": {
			newSide(b, "bare", serve(b, load.Handler(payload)), false),
			newSide(b, "mw", serve(b, idempotency.New(ms, idempotency.WithTTL(ttl))(load.Handler(payload))), true),
		},
		"fiber": {
			newSide(b, "bare", serveFiber(b, payload, false), false),
			newSide(b, "mw", serveFiber(b, payload, true), false),
		},
	}
	var gs []*group
	for _, stack := range []string{"idempotency", "fiber"} {
		gs = append(gs, groups("stack="+stack+"/", func(string) []*side { return stacks[stack] }, "first", "replay")...)
	}
	measure(b, gs)
}

// serveFiber serves payload from fiber, behind fiber's idempotency
// middleware when withMiddleware, until b ends, and returns its base URL.
func serveFiber(b *testing.B, payload []byte, withMiddleware bool) string {
	app := fiber.New(fiber.Config{DisableStartupMessage: true})
	if withMiddleware {
		app.Use(fiberidem.New(fiberidem.Config{
			Lifetime:  ttl,
			KeyHeader: "Idempotency-Key",
			KeyHeaderValidate: func(k string) error {
				if k == "" {
					return errors.New("empty key")
				}
				return nil
			},
		}))
	}
	app.Post("/payments", func(c *fiber.Ctx) error {
		c.Set(fiber.HeaderContentType, fiber.MIMEApplicationJSON)
		return c.Status(http.StatusCreated).Send(payload)
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	go func() { _ = app.Listener(ln) }()
	b.Cleanup(func() { _ = app.ShutdownWithTimeout(5 * time.Second) })
	return "http://" + ln.Addr().String()
}
