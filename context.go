package idempotency

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// handlerContext is the context a handler runs with: the request's context,
// cancelled with a cause wrapping ErrLeaseLost when the lease is lost, and
// cancelled when the handler returns. It is context.WithCancelCause of the
// request's context, made lazily.
//
// Deriving a cancellable context from a server request's context makes the
// server's context build a Done channel and a map of children, and the
// child and its cancel function are allocations of their own: six
// allocations per request over HTTP. A handler that never waits on its
// context needs none of them, so the derived context is made only when
// Done is first called (by the handler, or by a context derived from this
// one) or when the lease is lost. Until then Err, Value and Deadline are the
// request context's own, which is what the derived context would report.
// Once it is made, every method is the derived context's, so context.Cause
// finds its cause.
type handlerContext struct {
	parent context.Context
	state  atomic.Uint32 // ctxLazy, ctxMade or ctxEnded

	mu     sync.Mutex // serialises make and end
	ctx    context.Context
	cancel context.CancelCauseFunc
}

const (
	ctxLazy  = iota // not made; the handler runs
	ctxMade         // ctx and cancel are set
	ctxEnded        // not made; the handler returned
)

var _ context.Context = (*handlerContext)(nil)

// derived returns the derived context, making it on first use. Once the
// handler has returned, it is made cancelled.
func (hc *handlerContext) derived() context.Context {
	if hc.state.Load() == ctxMade {
		return hc.ctx
	}
	hc.mu.Lock()
	defer hc.mu.Unlock()
	if st := hc.state.Load(); st != ctxMade {
		hc.ctx, hc.cancel = context.WithCancelCause(hc.parent)
		if st == ctxEnded {
			hc.cancel(nil)
		}
		hc.state.Store(ctxMade)
	}
	return hc.ctx
}

// Deadline is the request context's: the derived context has no other.
func (hc *handlerContext) Deadline() (time.Time, bool) { return hc.parent.Deadline() }

// Done makes the derived context and returns its channel.
func (hc *handlerContext) Done() <-chan struct{} { return hc.derived().Done() }

// Err is the derived context's once made; before that, the request
// context's while the handler runs and, like a cancelled context's,
// context.Canceled once it has returned.
func (hc *handlerContext) Err() error {
	switch hc.state.Load() {
	case ctxMade:
		return hc.ctx.Err()
	case ctxEnded:
		if err := hc.parent.Err(); err != nil {
			return err
		}
		return context.Canceled
	}
	return hc.parent.Err()
}

// Value is the derived context's once made (so that context.Cause finds
// it), the request context's before.
func (hc *handlerContext) Value(key any) any {
	if hc.state.Load() == ctxMade {
		return hc.ctx.Value(key)
	}
	return hc.parent.Value(key)
}

func (hc *handlerContext) String() string { return "idempotency.handlerContext" }

// lose cancels the handler's context with cause.
func (hc *handlerContext) lose(cause error) {
	hc.derived()
	hc.cancel(cause)
}

// end cancels the handler's context when the handler has returned, as the
// deferred cancel of context.WithCancelCause would.
func (hc *handlerContext) end() {
	hc.mu.Lock()
	defer hc.mu.Unlock()
	if hc.state.Load() == ctxMade {
		hc.cancel(nil)
		return
	}
	hc.state.Store(ctxEnded)
}
