package relay

import (
	"context"
	"sync"
	"time"
)

// batch is one claim's messages on their way through the relay: claimed,
// presented to the sink, marked.
type batch struct {
	c *claim
	// msgs are the messages of the claim that the relay could read, in id
	// order; results holds the outcome of each, once presented.
	msgs    []message
	results []result
}

// result is the outcome of one message's presentation.
type result struct {
	// presented is false for a message that was not handed to the sink:
	// its claim lost, too little of it left, or Run's context ended.
	presented bool
	err       error
	took      time.Duration // the sink's call
	at        time.Time     // when the sink's call returned
}

// pipeline carries the claimed batches through the relay's other two
// stages, each a goroutine of its own: the presentation of a batch to the
// sink, and the marks of its outcomes. While the sink presents batch N, the
// marks of batch N-1 are written and batch N+1 is claimed, so that the
// sink, which mostly waits for the broker, and the database work at once
// rather than in turn. Each stage holds one batch at most, and the hand-offs
// wait for the next stage to be free: a relay holds three batches at most
// (see WithBatchSize).
//
// Order is kept by the claim, not by the pipeline: a batch in flight holds
// its messages claimed, a state that is not finished, so the claim of the
// next batch takes no message of their ordering keys; the next message of
// a key is claimed only once the done mark (or another mark) of the
// previous one has committed.
type pipeline struct {
	present chan *batch
	mark    chan *batch
	ended   chan struct{} // closed once both stages ended

	mu       sync.Mutex
	inFlight int           // batches handed and not yet marked
	drained  chan struct{} // closed when inFlight falls to 0
}

// startPipeline starts the stages that present and mark the batches given
// to hand, until close.
func (r *Relay) startPipeline(ctx context.Context) *pipeline {
	p := &pipeline{
		present: make(chan *batch),
		mark:    make(chan *batch),
		ended:   make(chan struct{}),
		drained: make(chan struct{}),
	}
	go func() {
		defer close(p.mark)
		for b := range p.present {
			r.present(ctx, b)
			p.mark <- b
		}
	}()
	go func() {
		defer close(p.ended)
		for b := range p.mark {
			r.mark(ctx, b)
			p.finished()
		}
	}()
	return p
}

// hand gives b to the presentation, waiting until it has presented the
// batch before, and returns false, without b, when ctx ended first.
func (p *pipeline) hand(ctx context.Context, b *batch) bool {
	p.mu.Lock()
	p.inFlight++
	p.mu.Unlock()
	select {
	case p.present <- b:
		return true
	case <-ctx.Done():
		p.finished()
		return false
	}
}

// finished records that a batch handed has left the pipeline.
func (p *pipeline) finished() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.inFlight--; p.inFlight == 0 {
		close(p.drained)
		p.drained = make(chan struct{})
	}
}

// busy reports whether a batch is in flight.
func (p *pipeline) busy() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.inFlight > 0
}

// await waits until no batch is in flight, or ctx ends.
func (p *pipeline) await(ctx context.Context) {
	p.mu.Lock()
	if p.inFlight == 0 {
		p.mu.Unlock()
		return
	}
	drained := p.drained
	p.mu.Unlock()
	select {
	case <-drained:
	case <-ctx.Done():
	}
}

// close lets the stages end once the batches in flight are presented and
// marked, and waits for them.
func (p *pipeline) close() {
	close(p.present)
	<-p.ended
}
