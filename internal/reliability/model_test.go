package reliability_test

import (
	"fmt"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/go-idempotency/idempotency"
)

// This file is a sequential specification of the idempotency.Store contract
// for one record, for porcupine's linearizability checker.
//
// Time: a store judges expiry on its own clock, which the test cannot read.
// Every operation carries the test's wall-clock times of its call and return
// (nanoseconds since the history began); a lease or TTL granted by an
// operation is kept as the interval in which its deadline must fall: from
// the call plus the duration minus skew, to the return plus the duration
// plus skew. An operation may then observe "expired" only if the deadline
// could have passed by its return, and "live" only if the deadline could
// still be ahead at its call. So the model never rejects a correct store
// for timing, and still rejects a store that grants a second lease while the
// first is certainly live, or keeps a lease certainly past its end.

// skew bounds the disagreement between the test's clock and the store's:
// Redis reads TIME in whole milliseconds and both run on the same machine.
const skew = int64(5 * time.Millisecond)

type opKind uint8

const (
	opAcquire opKind = iota + 1
	opComplete
	opRelease
	opExtend
)

var opNames = [...]string{"", "acquire", "complete", "release", "extend"}

// linIn is an operation's input, with its call and return times.
type linIn struct {
	key   string
	kind  opKind
	token string
	fp    string        // acquire
	lease time.Duration // acquire, extend
	ttl   time.Duration // acquire, complete
	body  string        // complete: the payload's identity
	call  int64
	ret   int64
}

type errKind uint8

const (
	errNone errKind = iota
	errLeaseLost
	errOther
)

// linOut is an operation's result.
type linOut struct {
	err       errKind
	outcome   idempotency.AcquireOutcome
	epoch     uint64
	remaining time.Duration
	body      string // the replayed payload, for Completed
}

// recState is the state of one record. The zero value is an absent record.
// Deadlines are intervals [lo, hi] on the test's clock.
type recState struct {
	present  bool
	complete bool
	token    string
	fp       string
	body     string
	epoch    uint64

	leaseLo, leaseHi int64
	ttlLo, ttlHi     int64
}

// deadline returns the interval of the instant d after an operation that
// ran within [call, ret].
func deadline(in linIn, d time.Duration) (lo, hi int64) {
	return in.call + int64(d) - skew, in.ret + int64(d) + skew
}

// expiry returns the interval of the instant the record becomes absent: a
// COMPLETE record at its TTL, an IN_PROGRESS one once TTL and lease passed.
func (s recState) expiry() (lo, hi int64) {
	if s.complete {
		return s.ttlLo, s.ttlHi
	}
	return max(s.ttlLo, s.leaseLo), max(s.ttlHi, s.leaseHi)
}

// mayBeGone reports whether the record may be absent during in.
func (s recState) mayBeGone(in linIn) bool {
	if !s.present {
		return true
	}
	lo, _ := s.expiry()
	return in.ret >= lo
}

// mayBeLive reports whether the record may still exist during in.
func (s recState) mayBeLive(in linIn) bool {
	if !s.present {
		return false
	}
	_, hi := s.expiry()
	return in.call < hi
}

// fresh is the record a lease on an absent key creates.
func fresh(in linIn) recState {
	s := recState{present: true, token: in.token, fp: in.fp, epoch: 1}
	s.leaseLo, s.leaseHi = deadline(in, in.lease)
	s.ttlLo, s.ttlHi = deadline(in, in.ttl)
	return s
}

// step returns every state the record can be in after in answered out,
// starting from s; none when the answer is impossible.
func step(s recState, in linIn, out linOut) []recState {
	if out.err == errOther {
		return nil // the scenarios inject no faults: any error is wrong
	}
	var next []recState
	switch in.kind {
	case opAcquire:
		if out.err != errNone {
			return nil
		}
		if s.mayBeGone(in) && out.outcome == idempotency.Acquired && out.epoch == 1 {
			next = append(next, fresh(in))
		}
		if !s.mayBeLive(in) {
			break
		}
		switch {
		case s.fp != in.fp:
			if out.outcome == idempotency.Mismatch {
				next = append(next, s)
			}
		case s.complete:
			if out.outcome == idempotency.Completed && out.body == s.body {
				next = append(next, s)
			}
		case s.token == in.token:
			// A retry by the holder: same epoch; the lease may be pushed
			// forward, never shortened.
			want := idempotency.Stolen
			if s.epoch == 1 {
				want = idempotency.Acquired
			}
			if out.outcome == want && out.epoch == s.epoch {
				n := s
				_, hi := deadline(in, in.lease)
				n.leaseHi = max(n.leaseHi, hi)
				next = append(next, n)
			}
		default:
			if in.call < s.leaseHi && out.outcome == idempotency.InFlight && out.epoch == s.epoch &&
				out.remaining > 0 && int64(out.remaining) <= s.leaseHi-in.call+int64(time.Millisecond) {
				next = append(next, s)
			}
			if in.ret >= s.leaseLo && out.outcome == idempotency.Stolen && out.epoch == s.epoch+1 {
				n := s
				n.token, n.epoch = in.token, s.epoch+1
				n.leaseLo, n.leaseHi = deadline(in, in.lease)
				n.ttlLo, n.ttlHi = deadline(in, in.ttl)
				next = append(next, n)
			}
		}

	case opComplete:
		switch out.err {
		case errLeaseLost:
			if s.mayBeGone(in) {
				next = append(next, recState{})
			}
			if s.mayBeLive(in) && s.token != in.token {
				next = append(next, s)
			}
		case errNone:
			if s.mayBeLive(in) && s.token == in.token {
				n := s
				if !s.complete {
					n.complete, n.body = true, in.body
					n.ttlLo, n.ttlHi = deadline(in, in.ttl)
					n.leaseLo, n.leaseHi = 0, 0
				}
				next = append(next, n)
			}
		}

	case opRelease:
		switch out.err {
		case errNone:
			if s.mayBeGone(in) || (s.mayBeLive(in) && !s.complete && s.token == in.token) {
				next = append(next, recState{})
			}
		case errLeaseLost:
			if s.mayBeLive(in) && (s.complete || s.token != in.token) {
				next = append(next, s)
			}
		}

	case opExtend:
		switch out.err {
		case errNone:
			if s.mayBeLive(in) && !s.complete && s.token == in.token {
				n := s
				n.leaseLo, n.leaseHi = deadline(in, in.lease)
				next = append(next, n)
			}
		case errLeaseLost:
			if s.mayBeGone(in) {
				next = append(next, recState{})
			}
			if s.mayBeLive(in) && (s.complete || s.token != in.token) {
				next = append(next, s)
			}
		}
	}
	return next
}

// storeModel is the porcupine model of one record, partitioned by key.
var storeModel = porcupine.NondeterministicModel{
	Partition: func(history []porcupine.Operation) [][]porcupine.Operation {
		byKey := map[string][]porcupine.Operation{}
		var keys []string
		for _, op := range history {
			k := op.Input.(linIn).key
			if _, ok := byKey[k]; !ok {
				keys = append(keys, k)
			}
			byKey[k] = append(byKey[k], op)
		}
		out := make([][]porcupine.Operation, 0, len(keys))
		for _, k := range keys {
			out = append(out, byKey[k])
		}
		return out
	},
	Init: func() []any { return []any{recState{}} },
	Step: func(state, input, output any) []any {
		next := step(state.(recState), input.(linIn), output.(linOut))
		out := make([]any, len(next))
		for i, n := range next {
			out[i] = n
		}
		return out
	},
	Equal: func(a, b any) bool { return a.(recState) == b.(recState) },
	DescribeOperation: func(input, output any) string {
		in, out := input.(linIn), output.(linOut)
		var res string
		switch {
		case out.err == errLeaseLost:
			res = "lease lost"
		case out.err == errOther:
			res = "error"
		case in.kind == opAcquire:
			res = fmt.Sprintf("%v epoch %d", out.outcome, out.epoch)
			if out.outcome == idempotency.Completed {
				res += " " + out.body
			}
		default:
			res = "ok"
		}
		return fmt.Sprintf("%s(%s %s) -> %s", opNames[in.kind], in.token, in.body, res)
	},
	DescribeState: func(state any) string {
		s := state.(recState)
		switch {
		case !s.present:
			return "absent"
		case s.complete:
			return fmt.Sprintf("COMPLETE %s by %s", s.body, s.token)
		}
		return fmt.Sprintf("IN_PROGRESS %s epoch %d fp %s", s.token, s.epoch, s.fp)
	},
}
