package statetest

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/go-idempotency/idempotency/state"
)

// The linearizability check: clients call a Store at once, each call
// recorded with when it was made and when it returned, and porcupine
// searches for an order of the calls, each at an instant between the two,
// in which a model of the records gives every answer the Store gave.

// The shape of a history.
const (
	linClients = 5
	linOps     = 60 // per client
)

var linIDs = []string{"lin_a", "lin_b"}
var linStates = []string{"a", "b", "c"}

type opKind uint8

const (
	opCreate opKind = iota + 1
	opGet
	opTransition
)

// linIn is a call.
type linIn struct {
	kind     opKind
	id       string
	from, to string // to: the state of a create
	expected int64
	data     string // "": none (nil)
}

type answer uint8

const (
	answerOK answer = iota + 1
	answerExists
	answerNotFound
	answerConflictVersion
	answerConflictState
)

// linOut is a call's answer: its kind and the record it carried (the one
// written, found, or in the way).
type linOut struct {
	answer  answer
	state   string
	version int64
	data    string
}

// linRecord is the model's record; the zero value is no record.
type linRecord struct {
	exists  bool
	state   string
	version int64
	data    string
}

func (r linRecord) is(out linOut) bool {
	return r.state == out.state && r.version == out.version && r.data == out.data
}

// step returns whether the model in r gives out to in, and the record
// after it.
func step(r linRecord, in linIn, out linOut) (bool, linRecord) {
	switch in.kind {
	case opCreate:
		if !r.exists {
			next := linRecord{true, in.to, 1, in.data}
			if in.data == "" {
				next.data = "{}"
			}
			return out.answer == answerOK && next.is(out), next
		}
		return out.answer == answerExists && r.is(out), r
	case opGet:
		if !r.exists {
			return out.answer == answerNotFound, r
		}
		return out.answer == answerOK && r.is(out), r
	}
	switch {
	case !r.exists:
		return out.answer == answerNotFound, r
	case r.version != in.expected:
		return out.answer == answerConflictVersion && r.is(out), r
	case r.state != in.from:
		return out.answer == answerConflictState && r.is(out), r
	}
	next := linRecord{true, in.to, r.version + 1, r.data}
	if in.data != "" {
		next.data = in.data
	}
	return out.answer == answerOK && next.is(out), next
}

// recordModel is the model of one record, the history partitioned by
// record.
var recordModel = porcupine.Model{
	Partition: func(history []porcupine.Operation) [][]porcupine.Operation {
		byID := map[string][]porcupine.Operation{}
		for _, op := range history {
			id := op.Input.(linIn).id
			byID[id] = append(byID[id], op)
		}
		var out [][]porcupine.Operation
		for _, ops := range byID {
			out = append(out, ops)
		}
		return out
	},
	Init: func() any { return linRecord{} },
	Step: func(st, in, out any) (bool, any) {
		return step(st.(linRecord), in.(linIn), out.(linOut))
	},
	Equal: func(a, b any) bool { return a.(linRecord) == b.(linRecord) },
	DescribeOperation: func(in, out any) string {
		i, o := in.(linIn), out.(linOut)
		var call string
		switch i.kind {
		case opCreate:
			call = fmt.Sprintf("create %s %s", i.to, i.data)
		case opGet:
			call = "get"
		default:
			call = fmt.Sprintf("%s→%s @%d %s", i.from, i.to, i.expected, i.data)
		}
		names := map[answer]string{answerOK: "ok", answerExists: "exists", answerNotFound: "not found",
			answerConflictVersion: "conflict version", answerConflictState: "conflict state"}
		return fmt.Sprintf("%s %s: %s %s v%d %s", i.id, call, names[o.answer], o.state, o.version, o.data)
	},
	DescribeState: func(st any) string {
		r := st.(linRecord)
		if !r.exists {
			return "none"
		}
		return fmt.Sprintf("%s v%d %s", r.state, r.version, r.data)
	},
}

// runHistory drives linClients clients of linOps random calls each on the
// records linIDs of scope sc, and returns the history. A client moves a
// record from what it last saw of it, most of the time; otherwise from a
// stale version or another state.
func runHistory(t *testing.T, s *state.Store, sc string, seed uint64) []porcupine.Operation {
	t.Helper()
	base := time.Now()
	now := func() int64 { return int64(time.Since(base)) }
	var mu sync.Mutex
	var ops []porcupine.Operation
	var wg sync.WaitGroup
	for c := range linClients {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(seed, uint64(c)))
			seen := map[string]linOut{}
			for i := range linOps {
				id := linIDs[rng.IntN(len(linIDs))]
				r := state.Ref{Scope: sc, Machine: "statetest.lin", ID: id}
				in := linIn{id: id}
				if rng.IntN(5) == 0 {
					in.data = fmt.Sprintf(`{"c":%d,"i":%d}`, c, i)
				}
				last, ok := seen[id]
				switch n := rng.IntN(100); {
				case n < 10 || !ok && n < 30:
					in.kind, in.to = opCreate, linStates[rng.IntN(len(linStates))]
				case n < 25:
					in.kind = opGet
				default:
					in.kind, in.from, in.to, in.expected = opTransition, last.state, linStates[rng.IntN(len(linStates))], last.version
					if in.expected == 0 || rng.IntN(6) == 0 {
						in.expected = max(1, last.version-1)
					}
					if in.from == "" || rng.IntN(6) == 0 {
						in.from = linStates[rng.IntN(len(linStates))]
					}
				}
				call := now()
				out, err := linCall(s, r, in)
				ret := now()
				if err != nil {
					t.Errorf("client %d: %v", c, err)
					return
				}
				if out.version > 0 {
					seen[id] = out
				}
				mu.Lock()
				ops = append(ops, porcupine.Operation{ClientId: c, Input: in, Call: call, Output: out, Return: ret})
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return ops
}

// linCall makes the call in on r and returns its answer, or an error that
// is none of the answers.
func linCall(s *state.Store, r state.Ref, in linIn) (linOut, error) {
	var data []byte
	if in.data != "" {
		data = []byte(in.data)
	}
	var rec state.Record
	var err error
	switch in.kind {
	case opCreate:
		rec, err = s.Create(ctx, r, in.to, data)
	case opGet:
		rec, err = s.Get(ctx, r)
	default:
		rec, err = s.Transition(ctx, r, state.Change{From: in.from, To: in.to, ExpectedVersion: in.expected, Data: data})
	}
	var (
		exists   *state.ExistsError
		conflict *state.ConflictError
	)
	switch {
	case err == nil:
		return linOut{answerOK, rec.State, rec.Version, string(rec.Data)}, nil
	case errors.As(err, &exists):
		c := exists.Current
		return linOut{answerExists, c.State, c.Version, string(c.Data)}, nil
	case errors.Is(err, state.ErrNotFound):
		return linOut{answer: answerNotFound}, nil
	case errors.As(err, &conflict):
		a := answerConflictState
		if conflict.Reason == state.ReasonVersion {
			a = answerConflictVersion
		}
		c := conflict.Current
		return linOut{a, c.State, c.Version, string(c.Data)}, nil
	}
	return linOut{}, err
}

// visualize draws an illegal history into a file and returns its path.
func visualize(info porcupine.LinearizationInfo) (string, error) {
	path := filepath.Join(os.TempDir(), fmt.Sprintf("statetest-linearizability-%d.html", time.Now().UnixNano()))
	return path, porcupine.VisualizePath(recordModel, info, path)
}
