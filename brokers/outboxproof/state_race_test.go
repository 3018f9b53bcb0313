package outboxproof_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/brokers/nats/natsink"
	"github.com/go-idempotency/idempotency/brokers/nats/natstest"
	"github.com/go-idempotency/idempotency/internal/pgtest"
	"github.com/go-idempotency/idempotency/outbox/relay"
	"github.com/go-idempotency/idempotency/pgstore"
	"github.com/go-idempotency/idempotency/state"
)

// The race state records exist for, on real servers: payments, each raced
// by a capture and a cancel sent at once over HTTP with two idempotency
// keys, each request sent twice at once and once more after; then each
// payment closed (a third request, and its duplicate), so that every
// payment has two events. The routes are transactional (the middleware
// on pgstore, WithTransaction(true)) and their handlers call Transition in
// the route's transaction. A relay publishes the outbox through natsink
// to a private nats-server. The proof: per payment exactly one of capture
// and cancel wins; the loser is answered 409 state_conflict with the
// winner's state and version; every duplicate is its original's answer
// replayed, status and body; the outbox holds exactly one event per
// committed transition, and the stream has each once, a payment's events
// in version order.

// racePayments is the number of payments raced.
func racePayments() int {
	if os.Getenv(longEnv) == "1" {
		return 5000
	}
	return 500
}

// raceMachine is the payments' machine.
const raceMachine = "payments.payment"

// raceActions are the racing routes' actions and the state each moves a
// payment to, from authorized; raceActionOf is the other way round.
var (
	raceActions  = map[string]string{"capture": "captured", "cancel": "canceled"}
	raceActionOf = map[string]string{"captured": "capture", "canceled": "cancel"}
)

// answerOf is what a client got.
type answerOf struct {
	status   int
	body     string
	replayed bool
}

func TestStateRace(t *testing.T) {
	n := racePayments()
	start := time.Now()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	url := pgtest.Database(t)
	pool := pgtest.PoolOn(t, url, func(c *pgxpool.Config) { c.MaxConns = 24 })
	if err := pgstore.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	idem := pgstore.New(pool)
	t.Cleanup(func() { _ = idem.Close() })

	srv := natstest.Start(t)
	_, js := natstest.Connect(t, srv.URL)
	id := randomID(t)
	stream, prefix := "STATE_"+strings.ToUpper(id), "proof."+id+".state"
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: stream, Subjects: []string{prefix + ".>"}}); err != nil {
		t.Fatal(err)
	}
	payments := state.New(pool, state.WithTopicPrefix(prefix))
	scope := "tenant-" + id
	ref := func(i int) state.Ref { return state.Ref{Scope: scope, Machine: raceMachine, ID: fmt.Sprint("pay_", i)} }
	for i := range n {
		if _, err := payments.Create(ctx, ref(i), "authorized", []byte(fmt.Sprintf(`{"amount":%d}`, 100+i))); err != nil {
			t.Fatal(err)
		}
	}

	// The relay, publishing while the clients race.
	r := relay.New(pool, natsink.New(js, natsink.WithStream(stream)),
		relay.WithClaimLease(2*time.Second), relay.WithPollInterval(200*time.Millisecond))
	relayDone := make(chan error, 1)
	go func() { relayDone <- r.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-relayDone; err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("relay: %v", err)
		}
	}()

	var runs atomic.Int64
	mux := http.NewServeMux()
	answer := func(w http.ResponseWriter, r *http.Request, rec state.Record, err error) {
		if err != nil {
			state.WriteError(w, r, err)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]any{"state": rec.State, "version": rec.Version})
	}
	for action, to := range raceActions {
		mux.HandleFunc("POST /payments/{id}/"+action, func(w http.ResponseWriter, r *http.Request) {
			runs.Add(1)
			ref := state.Ref{Scope: scope, Machine: raceMachine, ID: r.PathValue("id")}
			rec, err := payments.Transition(r.Context(), ref, state.Change{From: "authorized", To: to, ExpectedVersion: 1})
			answer(w, r, rec, err)
		})
	}
	mux.HandleFunc("POST /payments/{id}/close", func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		ref := state.Ref{Scope: scope, Machine: raceMachine, ID: r.PathValue("id")}
		rec, err := payments.Get(r.Context(), ref)
		if err == nil {
			rec, err = payments.Transition(r.Context(), ref, state.Change{From: rec.State, To: "closed", ExpectedVersion: rec.Version})
		}
		answer(w, r, rec, err)
	})
	api := httptest.NewServer(idempotency.New(idem, idempotency.WithTransaction(true), idempotency.WithWait(30*time.Second))(mux))
	t.Cleanup(api.Close)
	client := &http.Client{Timeout: time.Minute}
	post := func(path, key string) (answerOf, error) {
		req, err := http.NewRequest(http.MethodPost, api.URL+path, nil)
		if err != nil {
			return answerOf{}, err
		}
		req.Header.Set("Idempotency-Key", key)
		res, err := client.Do(req)
		if err != nil {
			return answerOf{}, err
		}
		defer res.Body.Close()
		body, err := io.ReadAll(res.Body)
		return answerOf{res.StatusCode, string(body), res.Header.Get("Idempotent-Replayed") == "true"}, err
	}

	// The clients: per payment, capture and cancel twice each at once,
	// then each once more; then close, twice at once.
	type raced struct {
		capture, cancel, close []answerOf
	}
	results := make([]raced, n)
	work := make(chan int)
	errs := make(chan error, 16)
	var wg sync.WaitGroup
	for range 16 {
		wg.Go(func() {
			for i := range work {
				if err := race(post, i, &results[i].capture, &results[i].cancel, &results[i].close); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	go func() {
		defer close(work)
		for i := range n {
			select {
			case work <- i:
			case <-ctx.Done():
				return
			}
		}
	}()
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	answered := time.Since(start)

	// Per payment: one winner, the loser refused with the winner's
	// record, every duplicate its original replayed.
	var captured, canceled, conflicts, replays int
	winners := make([]string, n)
	for i, res := range results {
		capture, cancel := original(t, i, "capture", res.capture), original(t, i, "cancel", res.cancel)
		closed := original(t, i, "close", res.close)
		replays += len(res.capture) + len(res.cancel) + len(res.close) - 3
		var win, lose answerOf
		switch {
		case capture.status == 200 && cancel.status == 409:
			win, lose, winners[i] = capture, cancel, "captured"
			captured++
		case cancel.status == 200 && capture.status == 409:
			win, lose, winners[i] = cancel, capture, "canceled"
			canceled++
		default:
			t.Fatalf("payment %d: capture %d %s, cancel %d %s: want one 200 and one 409", i, capture.status, capture.body, cancel.status, cancel.body)
		}
		var won struct {
			State   string `json:"state"`
			Version int64  `json:"version"`
		}
		var lost state.Problem
		if json.Unmarshal([]byte(win.body), &won) != nil || json.Unmarshal([]byte(lose.body), &lost) != nil ||
			won.Version != 2 || lost.Code != state.CodeConflict || lost.State != won.State || lost.Version != 2 || lost.Reason != state.ReasonVersion {
			t.Fatalf("payment %d: winner %s, loser %s: want the loser refused with the winner's state at version 2", i, win.body, lose.body)
		}
		conflicts++
		if closed.status != 200 || !strings.Contains(closed.body, `"version":3`) {
			t.Fatalf("payment %d: close %d %s", i, closed.status, closed.body)
		}
	}

	// The database: every payment closed at version 3, two history rows
	// each, and one outbox message per committed transition.
	transitions := 2 * n
	var closedRecords, history, events int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM idempotency_state WHERE scope = $1 AND state = 'closed' AND version = 3`, scope).Scan(&closedRecords); err != nil {
		t.Fatal(err)
	}
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM idempotency_state_history`).Scan(&history); err != nil {
		t.Fatal(err)
	}
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM idempotency_outbox WHERE topic = $1`, payments.Topic(raceMachine)).Scan(&events); err != nil {
		t.Fatal(err)
	}
	if closedRecords != n || history != transitions || events != transitions {
		t.Fatalf("%d records closed at version 3, %d history rows, %d outbox events; want %d, %d, %d",
			closedRecords, history, events, n, transitions, transitions)
	}

	// The stream: each event once, a payment's in version order, each
	// naming the request that committed it.
	got := drainStream(t, js, stream, transitions)
	published := map[string]bool{}    // event IDs
	lastVersion := map[string]int64{} // by payment: the version of its last event read
	for _, m := range got {
		var ev state.Event
		if err := json.Unmarshal(m.Data(), &ev); err != nil {
			t.Fatalf("event %s: %v", m.Headers().Get(jetstream.MsgIDHeader), err)
		}
		if msgID := m.Headers().Get(jetstream.MsgIDHeader); msgID != ev.ID || ev.ID != state.EventID(ev.Ref, ev.Version) {
			t.Fatalf("message %s holds event %s of version %d", msgID, ev.ID, ev.Version)
		}
		if published[ev.ID] {
			t.Fatalf("event %s twice in the stream", ev.ID)
		}
		published[ev.ID] = true
		if last := lastVersion[ev.Ref.ID]; last == 0 && ev.Version != 2 || last != 0 && ev.Version != last+1 {
			t.Fatalf("%s: event of version %d after version %d", ev.Ref.ID, ev.Version, last)
		}
		lastVersion[ev.Ref.ID] = ev.Version
		i, err := strconv.Atoi(strings.TrimPrefix(ev.Ref.ID, "pay_"))
		if err != nil || i >= n {
			t.Fatalf("an event of %q", ev.Ref.ID)
		}
		wantKey, wantTo := fmt.Sprint("close-", i), "closed"
		if ev.Version == 2 {
			wantKey, wantTo = fmt.Sprint(raceActionOf[winners[i]], "-", i), winners[i]
		}
		if ev.To != wantTo || ev.Cause.Key != wantKey || ev.Cause.Epoch != 1 {
			t.Fatalf("%s version %d: to %s, caused by %q epoch %d; want to %s by %s", ev.Ref.ID, ev.Version, ev.To, ev.Cause.Key, ev.Cause.Epoch, wantTo, wantKey)
		}
	}
	t.Logf("state race: %d payments raced by a capture and a cancel (%d requests, %d of them duplicates, all replayed; handlers ran %d times): %d captured, %d canceled, %d losers answered 409 with the winner's record; %d transitions committed, %d history rows, %d outbox events, %d in the stream, each once, in version order per payment; answered in %v, published in %v",
		n, 8*n, replays, runs.Load(), captured, canceled, conflicts, transitions, history, events, len(got), answered.Round(time.Millisecond), time.Since(start).Round(time.Millisecond))
}

// race sends payment i's requests and records their answers: capture and
// cancel twice each at once, then each once more; then close twice at
// once.
func race(post func(path, key string) (answerOf, error), i int, capture, cancel, closed *[]answerOf) error {
	var mu sync.Mutex
	var first error
	send := func(dst *[]answerOf, path, key string, times int) {
		var wg sync.WaitGroup
		for range times {
			wg.Go(func() {
				a, err := post(path, key)
				mu.Lock()
				defer mu.Unlock()
				if err != nil {
					first = cmpErr(first, fmt.Errorf("payment %d: POST %s: %w", i, path, err))
					return
				}
				*dst = append(*dst, a)
			})
		}
		wg.Wait()
	}
	base := fmt.Sprint("/payments/pay_", i, "/")
	var wg sync.WaitGroup
	wg.Go(func() { send(capture, base+"capture", fmt.Sprint("capture-", i), 2) })
	wg.Go(func() { send(cancel, base+"cancel", fmt.Sprint("cancel-", i), 2) })
	wg.Wait()
	send(capture, base+"capture", fmt.Sprint("capture-", i), 1)
	send(cancel, base+"cancel", fmt.Sprint("cancel-", i), 1)
	send(closed, base+"close", fmt.Sprint("close-", i), 2)
	return first
}

func cmpErr(a, b error) error {
	if a != nil {
		return a
	}
	return b
}

// original returns the one answer of as that ran the handler, and fails
// t unless there is exactly one and every other answer is it replayed.
func original(t *testing.T, i int, what string, as []answerOf) answerOf {
	t.Helper()
	var ran []answerOf
	for _, a := range as {
		if !a.replayed {
			ran = append(ran, a)
		}
	}
	if len(ran) != 1 {
		t.Fatalf("payment %d, %s: %d of %d answers not replayed, want 1: %+v", i, what, len(ran), len(as), as)
	}
	for _, a := range as {
		if a.status != ran[0].status || a.body != ran[0].body {
			t.Fatalf("payment %d, %s: a duplicate got %d %s, its original %d %s", i, what, a.status, a.body, ran[0].status, ran[0].body)
		}
	}
	return ran[0]
}

// drainStream waits until stream holds want messages (the relay has
// published every event), then reads them in stream order.
func drainStream(t *testing.T, js jetstream.JetStream, stream string, want int) []jetstream.Msg {
	t.Helper()
	ctx := context.Background()
	st, err := js.Stream(ctx, stream)
	if err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(time.Minute); ; {
		info, err := st.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if n := int(info.State.Msgs); n >= want {
			if n > want {
				t.Fatalf("%d messages in the stream, want %d", n, want)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d events in the stream after a minute", info.State.Msgs, want)
		}
		time.Sleep(50 * time.Millisecond) // no signal for the relay's progress
	}
	cons, err := st.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	out := make([]jetstream.Msg, 0, want)
	for range want {
		m, err := cons.Next(jetstream.FetchMaxWait(10 * time.Second))
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, m)
	}
	return out
}
