package outbox

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
)

// BatchSink publishes many envelopes in one call: a sink whose broker
// confirms publications asynchronously (JetStream's asynchronous publish,
// RabbitMQ's pipelined publisher confirms) keeps a window of them waiting
// for their confirms at once, instead of waiting for each confirm before
// it sends the next. A message then costs the broker's throughput rather
// than a round trip to it.
//
// PublishBatch publishes es and returns exactly one error per envelope, in
// the order of es: nil for an envelope the broker confirmed, as
// Sink.Publish's nil. The contract is Sink.Publish's, envelope by
// envelope: an error means that envelope may or may not have been
// published, and the relay presents it again later (at least once), unless
// it wraps ErrPermanent or ErrSuspend, which say what to do with that
// envelope instead; the envelopes of the same call that were confirmed are
// done all the same. PublishBatch returns once every envelope has its
// outcome, or soon after ctx ends (the relay ends it before its claim on
// the messages could be taken back): an envelope still waiting for its
// confirm then, or not sent yet, gets an error wrapping ctx's cause.
//
// The envelopes of one call never share an ordering key (a relay's claim
// holds at most one message of a key, and none while an earlier message
// of the key has not ended), so a sink may send and confirm them in any
// order.
//
// It is meant for a relay that presents each claimed batch in one call:
// the window of pending confirms is the sink's, and the relay marks done
// together the envelopes the call confirmed while it claims the next
// batch. AsBatchSink makes any Sink a BatchSink, so that such a relay
// presents every batch this way.
type BatchSink interface {
	PublishBatch(ctx context.Context, es []Envelope) []error
}

// ErrSinkPanicked is wrapped by the error that a BatchSink made by
// AsBatchSink gives an envelope whose Publish panicked. The panic is
// recovered in the goroutine that published, where nothing else could
// recover it; its value is in the error's text, and the batch's other
// envelopes keep their own outcomes.
var ErrSinkPanicked = errors.New("outbox: the sink panicked")

// AsBatchSink returns s as a BatchSink. When s is one already (it has a
// PublishBatch method, as natsink's and idemrabbit's sinks have), that is
// s itself, and concurrency is left to it. Otherwise PublishBatch calls
// s.Publish for each envelope, from up to concurrency goroutines at once,
// each with ctx: an envelope whose turn comes after ctx ended is not
// published, and its error wraps ctx's cause. A panic in Publish is
// recovered, and fails that envelope only (ErrSinkPanicked). AsBatchSink
// panics if s is nil or concurrency is below 1.
func AsBatchSink(s Sink, concurrency int) BatchSink {
	if s == nil {
		panic("outbox: AsBatchSink needs a sink")
	}
	if concurrency < 1 {
		panic("outbox: AsBatchSink needs a concurrency of at least 1")
	}
	if b, ok := s.(BatchSink); ok {
		return b
	}
	return eachSink{s, concurrency}
}

// eachSink is a Sink as a BatchSink: one Publish per envelope.
type eachSink struct {
	sink        Sink
	concurrency int
}

func (s eachSink) PublishBatch(ctx context.Context, es []Envelope) []error {
	errs := make([]error, len(es))
	// Each goroutine takes the next envelope not taken yet, so that
	// es is published in order as far as the goroutines' pace allows.
	var next atomic.Int64
	var wg sync.WaitGroup
	for range min(s.concurrency, len(es)) {
		wg.Go(func() {
			for i := int(next.Add(1)) - 1; i < len(es); i = int(next.Add(1)) - 1 {
				errs[i] = s.publish(ctx, es[i])
			}
		})
	}
	wg.Wait()
	return errs
}

// publish publishes e unless ctx has ended, recovering a panic as an
// error.
func (s eachSink) publish(ctx context.Context, e Envelope) (err error) {
	if ctx.Err() != nil {
		return fmt.Errorf("outbox: %s not published: %w", e.ID, context.Cause(ctx))
	}
	defer func() {
		if v := recover(); v != nil {
			err = fmt.Errorf("%w publishing %s: %v", ErrSinkPanicked, e.ID, v)
		}
	}()
	return s.sink.Publish(ctx, e)
}
