package redisstore_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/internal/redistest"
	"github.com/go-idempotency/idempotency/redisstore"
	"github.com/go-idempotency/idempotency/storetest"
	"github.com/redis/go-redis/v9"
)

// preRedis7CompileError is what Redis 6 and older answer to EVAL of a
// script whose first line is a flags line: they compile the script as the
// body of a function, where "#" cannot start a statement.
const preRedis7CompileError = "ERR Error compiling script (new function): user_script:1: unexpected symbol near '#'"

// serverError is an error reply, as go-redis reports one.
type serverError string

func (e serverError) Error() string { return string(e) }
func (serverError) RedisError()     {}

func TestFlagsLineRefused(t *testing.T) {
	for _, c := range []struct {
		err  error
		want bool
	}{
		{serverError(preRedis7CompileError), true},
		{fmt.Errorf("redisstore: complete k: %w", serverError(preRedis7CompileError)), true},
		{serverError("ERR Error compiling script (new function): @user_script:1: unexpected symbol near '#'"), true},
		// Redis 7 reports a script that does not compile with the same
		// prefix: that is a bug in the script, not an old server.
		{serverError("ERR Error compiling script (new function): user_script:12: '=' expected near 'x'"), false},
		{serverError("ERR Unexpected flag in script shebang: allow-oom"), false},
		{serverError("NOSCRIPT No matching script. Please use EVAL."), false},
		{serverError("OOM command not allowed when used memory > 'maxmemory'."), false},
		{errors.New(preRedis7CompileError), false}, // not a server reply
		{nil, false},
	} {
		if got := redisstore.FlagsLineRefused(c.err); got != c.want {
			t.Errorf("FlagsLineRefused(%v) = %v, want %v", c.err, got, c.want)
		}
	}
}

// TestFlagsLineRefusedByLua: the error text above is Lua's own. A server
// compiles a script that opens with "#" but not "#!" (so not a flags line
// for Redis 7) as plain Lua, which meets the "#" as a server before Redis 7
// meets a flags line, and the error is recognised.
func TestFlagsLineRefusedByLua(t *testing.T) {
	c := newClient(t)
	err := c.Eval(ctx, "#lua flags=allow-oom\nreturn 1", []string{"k"}).Err()
	if err == nil || !redisstore.FlagsLineRefused(err) {
		t.Fatalf("EVAL of a script opening with '#': %v; want an error FlagsLineRefused recognises", err)
	}
	t.Logf("the server answered: %v", err)
}

// preRedis7 is a go-redis hook that answers as a server before Redis 7
// does for the scripts that open with a flags line: EVALSHA of one gets
// NOSCRIPT (such a server never cached it) and EVAL the compile error.
// Every other command goes to the server.
type preRedis7 struct {
	flagged map[string]bool // SHA-1 digests of the flagged scripts
	refused atomic.Int64    // EVALs of a flagged script refused
}

func newPreRedis7() *preRedis7 {
	p := &preRedis7{flagged: map[string]bool{}}
	for _, sha := range redisstore.FlaggedScriptSHAs() {
		p.flagged[sha] = true
	}
	return p
}

// refuse sets the error an old server gives on cmd and reports whether it
// did.
func (p *preRedis7) refuse(cmd redis.Cmder) bool {
	args := cmd.Args()
	if len(args) < 2 {
		return false
	}
	arg, _ := args[1].(string)
	switch cmd.Name() {
	case "evalsha":
		if p.flagged[arg] {
			cmd.SetErr(serverError("NOSCRIPT No matching script. Please use EVAL."))
			return true
		}
	case "eval":
		if strings.HasPrefix(arg, "#!") {
			p.refused.Add(1)
			cmd.SetErr(serverError(preRedis7CompileError))
			return true
		}
	}
	return false
}

func (p *preRedis7) DialHook(next redis.DialHook) redis.DialHook { return next }

func (p *preRedis7) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if p.refuse(cmd) {
			return cmd.Err()
		}
		return next(ctx, cmd)
	}
}

func (p *preRedis7) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		var rest []redis.Cmder
		var err error
		for _, cmd := range cmds {
			if p.refuse(cmd) {
				err = firstErr(err, cmd.Err())
			} else {
				rest = append(rest, cmd)
			}
		}
		if len(rest) > 0 {
			err = firstErr(err, next(ctx, rest))
		}
		return err
	}
}

// firstErr returns the first non-nil error.
func firstErr(a, b error) error {
	if a != nil {
		return a
	}
	return b
}

// TestPreRedis7Fallback: on a server that refuses flags lines (simulated by
// the preRedis7 hook), a Store switches to the scripts without them, once,
// and passes the conformance suite.
func TestPreRedis7Fallback(t *testing.T) {
	c := hookedClient(t, redistest.Addr(t))
	old := newPreRedis7()
	c.AddHook(old)

	t.Run("OncePerStore", func(t *testing.T) {
		s := newStore(t, c)
		before := old.refused.Load()
		k1, k2 := randKey(), randKey()
		mustAcquire(t, s, req(k1, "t"), idempotency.Acquired)
		mustAcquire(t, s, req(k2, "t"), idempotency.Acquired)
		if redisstore.PlainScripts(s) {
			t.Fatal("the store switched before a flagged script was sent")
		}
		if err := s.Extend(ctx, k1, "t", 20*time.Second); err != nil {
			t.Fatalf("Extend: %v", err)
		}
		if !redisstore.PlainScripts(s) {
			t.Fatal("the store did not switch to the plain scripts")
		}
		a := mustAcquire(t, s, req(k1, "other"), idempotency.InFlight)
		if a.LeaseRemaining <= 10*time.Second {
			t.Fatalf("LeaseRemaining %v after Extend(20s)", a.LeaseRemaining)
		}
		if err := s.Complete(ctx, k1, "t", sampleResponse(), time.Hour); err != nil {
			t.Fatalf("Complete: %v", err)
		}
		if err := s.Release(ctx, k2, "t"); err != nil {
			t.Fatalf("Release: %v", err)
		}
		a = mustAcquire(t, s, req(k1, "other"), idempotency.Completed)
		if string(a.Response.Body) != string(sampleResponse().Body) {
			t.Fatalf("replayed body %q", a.Response.Body)
		}
		mustAcquire(t, s, req(k2, "other"), idempotency.Acquired)
		if n := old.refused.Load() - before; n != 1 {
			t.Fatalf("%d flagged scripts refused, want 1: the store switches once", n)
		}
	})

	t.Run("WAIT", func(t *testing.T) {
		// Complete with WAIT sends its script in a pipeline, and switches
		// the same way. The server has no replica: WAIT reaches none.
		var shortfalls atomic.Int64
		s := newStore(t, c, redisstore.WithWAIT(1, 10*time.Millisecond),
			redisstore.WithWAITErrorHandler(func(ctx context.Context, err *redisstore.WAITError) { shortfalls.Add(1) }))
		before := old.refused.Load()
		for i := range 2 {
			key := randKey()
			mustAcquire(t, s, req(key, "t"), idempotency.Acquired)
			if err := s.Complete(ctx, key, "t", sampleResponse(), time.Hour); err != nil {
				t.Fatalf("Complete #%d with WAIT: %v", i+1, err)
			}
			mustAcquire(t, s, req(key, "other"), idempotency.Completed)
		}
		if !redisstore.PlainScripts(s) {
			t.Fatal("the store did not switch to the plain scripts")
		}
		if n := old.refused.Load() - before; n != 1 {
			t.Fatalf("%d flagged scripts refused, want 1", n)
		}
		if n := shortfalls.Load(); n != 2 {
			t.Fatalf("%d WAIT shortfalls reported, want 2 (one per Complete)", n)
		}
	})

	// The suite's subtests run in parallel, after the function given to
	// t.Run returned: the counts are checked once t.Run has returned.
	before := old.refused.Load()
	t.Run("Conformance", func(t *testing.T) {
		storetest.Run(t, func(t *testing.T) idempotency.Store {
			return newStore(t, c)
		})
	})
	if old.refused.Load() == before {
		t.Fatal("Conformance: no flagged script was refused: the hook did not act")
	}

	// A Store already switched sends no flagged script.
	before = old.refused.Load()
	t.Run("ConformanceStartingPlain", func(t *testing.T) {
		storetest.Run(t, func(t *testing.T) idempotency.Store {
			s := newStore(t, c)
			redisstore.UsePlainScripts(s)
			return s
		})
	})
	if n := old.refused.Load() - before; n != 0 {
		t.Fatalf("ConformanceStartingPlain: %d flagged scripts sent by stores using the plain scripts", n)
	}
}

// TestWithoutFlag: the complete script for large payloads is complete.lua
// with "allow-oom" taken out of its flags line and nothing else changed, so
// both have the same line numbers and the same plain script.
func TestWithoutFlag(t *testing.T) {
	for _, c := range []struct{ src, flag, want string }{
		{"#!lua flags=allow-oom\nreturn 1", "allow-oom", "#!lua\nreturn 1"},
		{"#!lua flags=allow-oom,no-cluster\nreturn 1", "allow-oom", "#!lua flags=no-cluster\nreturn 1"},
		{"#!lua flags=no-cluster,allow-oom\n", "allow-oom", "#!lua flags=no-cluster\n"},
	} {
		if got := redisstore.WithoutFlag(c.src, c.flag); got != c.want {
			t.Errorf("WithoutFlag(%q, %q) = %q, want %q", c.src, c.flag, got, c.want)
		}
	}
	for _, src := range []string{"#!lua\nreturn 1", "#!lua flags=no-writes\nreturn 1", "return 1", ""} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("WithoutFlag(%q, allow-oom) did not panic", src)
				}
			}()
			redisstore.WithoutFlag(src, "allow-oom")
		}()
	}

	denyOOM := redisstore.WithoutFlag(redisstore.CompleteSrc, "allow-oom")
	line, rest, _ := strings.Cut(denyOOM, "\n")
	_, want, _ := strings.Cut(redisstore.CompleteSrc, "\n")
	if line != "#!lua" || rest != want {
		t.Fatalf("complete.lua without allow-oom opens with %q and differs after its first line", line)
	}
}
