package lifecycle

import "slices"

// State is a message's state: the status column of the outbox table.
type State string

// The states of a message (see the package documentation for what each
// means and the edges between them).
const (
	Scheduled State = "scheduled"
	Ready     State = "ready"
	Claimed   State = "claimed"
	RetryWait State = "retry_wait"
	Suspended State = "suspended"
	Done      State = "done"
	Dead      State = "dead"
	Canceled  State = "canceled"
)

// nonTerminal and terminal partition the states; claimable are the states
// a claim takes a message from once its due_at has passed.
var (
	nonTerminal = []State{Scheduled, Ready, Claimed, RetryWait, Suspended}
	terminal    = []State{Done, Dead, Canceled}
	claimable   = []State{Scheduled, Ready, RetryWait}
)

// States returns every state, the non-terminal ones first, in the order
// of the package documentation's table.
func States() []State { return append(slices.Clone(nonTerminal), terminal...) }

// Terminal returns the terminal states: done, dead and canceled.
func Terminal() []State { return slices.Clone(terminal) }

// NonTerminal returns the states of a message not finished yet: scheduled,
// ready, claimed, retry_wait and suspended. An earlier message of an
// ordering key in one of them holds the later ones back.
func NonTerminal() []State { return slices.Clone(nonTerminal) }

// IsTerminal reports whether s is done, dead or canceled: a state that no
// edge leaves but an operator's requeue (and the purge, which deletes).
func (s State) IsTerminal() bool { return slices.Contains(terminal, s) }

// Valid reports whether s is one of the states.
func (s State) Valid() bool { return slices.Contains(nonTerminal, s) || s.IsTerminal() }

// Edge is one move of the state machine: the states it takes a message
// from, those it may leave it in, and who takes it. The methods of Table
// named after the edges render these states into their statements, and
// idemctl checks an operator's request against them, so that the states
// an edge acts on are written once, here.
type Edge struct {
	name string
	from []State
	to   []State
	by   string
}

// Name returns the edge's name, as the package documentation's table
// gives it.
func (e Edge) Name() string { return e.name }

// From returns the states the edge moves a message from (none for
// enqueue, which creates it).
func (e Edge) From() []State { return slices.Clone(e.from) }

// To returns the states the edge may leave a message in (none for purge,
// which deletes it).
func (e Edge) To() []State { return slices.Clone(e.to) }

// By says who takes the edge.
func (e Edge) By() string { return e.by }

// Allows reports whether the edge moves a message in state s.
func (e Edge) Allows(s State) bool { return slices.Contains(e.from, s) }

// The edges, as the package documentation's table lists them.
var (
	EdgeEnqueue     = Edge{"enqueue", nil, []State{Ready, Scheduled}, "a handler's transaction (outbox.Enqueue)"}
	EdgeClaim       = Edge{"claim", claimable, []State{Claimed}, "relay"}
	EdgeExtend      = Edge{"extend", []State{Claimed}, []State{Claimed}, "relay"}
	EdgeRelease     = Edge{"release", []State{Claimed}, []State{Ready}, "relay"}
	EdgeDone        = Edge{"done", []State{Claimed}, []State{Done}, "relay, or a local run's transaction"}
	EdgeRetry       = Edge{"retry", []State{Claimed}, []State{RetryWait, Dead}, "relay"}
	EdgeRefuse      = Edge{"refuse", []State{Claimed}, []State{Dead}, "relay, for the sink's permanent refusal"}
	EdgeUnreadable  = Edge{"unreadable", []State{Claimed}, []State{Dead}, "relay"}
	EdgeSinkSuspend = Edge{"sink-suspend", []State{Claimed}, []State{Suspended}, "relay, for the sink"}
	EdgeReclaim     = Edge{"reclaim", []State{Claimed}, []State{RetryWait, Dead}, "any relay"}
	EdgeSuspend     = Edge{"suspend", []State{Scheduled, Ready, RetryWait, Claimed}, []State{Suspended}, "operator"}
	EdgeResume      = Edge{"resume", []State{Suspended}, []State{Ready, Scheduled}, "operator"}
	EdgeSchedule    = Edge{"schedule", claimable, []State{Scheduled, Ready}, "operator"}
	EdgeCancel      = Edge{"cancel", nonTerminal, []State{Canceled}, "application or operator"}
	EdgeRequeue     = Edge{"requeue", terminal, []State{Ready}, "operator"}
	EdgePurge       = Edge{"purge", terminal, nil, "relay or operator"}
)

// Edges returns every edge, in the order of the package documentation's
// table.
func Edges() []Edge {
	return []Edge{EdgeEnqueue, EdgeClaim, EdgeExtend, EdgeRelease, EdgeDone, EdgeRetry, EdgeRefuse, EdgeUnreadable,
		EdgeSinkSuspend, EdgeReclaim, EdgeSuspend, EdgeResume, EdgeSchedule, EdgeCancel, EdgeRequeue, EdgePurge}
}
