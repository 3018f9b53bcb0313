package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/go-idempotency/idempotency/outbox/lifecycle"
	"github.com/go-idempotency/idempotency/state"
)

// The payments' state records: the capture and cancel routes are
// transitions of a payment's record from authorized, of which one wins;
// the scheduled capture is one too, and does nothing on a payment no
// longer authorized.

// conflictOf reports whether body is the problem state_conflict of a
// payment's record, carrying st and version.
func conflictOf(t *testing.T, body, st string, version int64) bool {
	t.Helper()
	var p state.Problem
	if err := json.Unmarshal([]byte(body), &p); err != nil {
		t.Errorf("%v: %s", err, body)
		return false
	}
	return p.Status == http.StatusConflict && string(p.Code) == state.CodeConflict && p.Machine == machinePayment &&
		p.State == st && p.Version == version
}

// answer is what a client got.
type answer struct {
	status      int
	body        string
	contentType string
	replayed    bool
}

// settleReq sends POST /payments/{id}/{action} as alice with key, and
// If-Match ifMatch unless it is "". It may run on any goroutine.
func (c *captures) settleReq(id, action, key, ifMatch string) (answer, error) {
	req, err := http.NewRequest(http.MethodPost, c.url+"/payments/"+id+"/"+action, nil)
	if err != nil {
		return answer{}, err
	}
	req.Header.Set("Authorization", "Bearer "+aliceToken)
	req.Header.Set("Idempotency-Key", key)
	if ifMatch != "" {
		req.Header.Set("If-Match", ifMatch)
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		return answer{}, err
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	return answer{res.StatusCode, string(b), res.Header.Get("Content-Type"), res.Header.Get("Idempotent-Replayed") == "true"}, err
}

// settle is settleReq on the test's goroutine.
func (c *captures) settle(id, action, key, ifMatch string) answer {
	c.t.Helper()
	a, err := c.settleReq(id, action, key, ifMatch)
	if err != nil {
		c.t.Fatal(err)
	}
	return a
}

// record returns alice's payment id's state record, read from the
// database.
func (c *captures) record(id string) state.Record {
	c.t.Helper()
	rec, err := c.b.states.Get(context.Background(), paymentRef("alice", id))
	if err != nil {
		c.t.Fatalf("the record of %s: %v", id, err)
	}
	return rec
}

// stateEvent is a state event as the outbox holds it.
type stateEvent struct {
	id, orderingKey string
	event           state.Event
}

// stateEvents returns the payments' state events in the outbox, by their
// ordering key: one list per payment's record.
func (c *captures) stateEvents() map[string][]stateEvent {
	c.t.Helper()
	rows, err := c.b.payments.db.Query(context.Background(),
		`SELECT storage_key || '/' || seq, ordering_key, payload FROM idempotency_outbox WHERE topic = $1 ORDER BY storage_key, seq`,
		c.b.states.Topic(machinePayment))
	if err != nil {
		c.t.Fatal(err)
	}
	events, err := lifecycle.Collect(rows, func(row lifecycle.Rows) (stateEvent, error) {
		var e stateEvent
		var payload []byte
		if err := row.Scan(&e.id, &e.orderingKey, &payload); err != nil {
			return e, err
		}
		return e, json.Unmarshal(payload, &e.event)
	})
	if err != nil {
		c.t.Fatal(err)
	}
	out := map[string][]stateEvent{}
	for _, e := range events {
		out[e.orderingKey] = append(out[e.orderingKey], e)
	}
	return out
}

// TestPostgresCaptureThenCancel: a capture with one key wins; a cancel
// with another key then answers 409 state_conflict with the record as the
// capture left it (captured, version 2), whether it sends the version it
// read (If-Match: 1, stale) or none; its duplicate replays the 409. The
// capture moved the row, canceled the scheduled capture and wrote one
// event. Another user's capture, and an unknown payment's, are 404.
func TestPostgresCaptureThenCancel(t *testing.T) { testCaptureThenCancel(t, postgresMode) }

func testCaptureThenCancel(t *testing.T, open opener) {
	c := serveCaptures(t, open(t), time.Hour)
	p := c.pay("order-1")
	if p.State != stateAuthorized || p.Version != 1 {
		t.Fatalf("made %+v, want its record authorized at version 1", p)
	}
	if rec := c.record(p.ID); rec.State != stateAuthorized || rec.Version != 1 || string(rec.Data) != `{"amount":1999,"currency":"EUR"}` {
		t.Fatalf("the record %+v, want authorized at version 1 with the amount", rec)
	}
	if res, body := c.post("/payments/"+p.ID+"/capture", bobToken, "capture-1", ""); res.StatusCode != http.StatusNotFound {
		t.Fatalf("bob's capture: %d %s, want 404", res.StatusCode, body)
	}
	if a := c.settle("pay_999999", "capture", "capture-0", ""); a.status != http.StatusNotFound {
		t.Fatalf("an unknown payment's capture: %d %s, want 404", a.status, a.body)
	}

	captured := c.settle(p.ID, "capture", "capture-1", "1")
	got := decode(t, captured.body)
	if captured.status != http.StatusOK || got.Status != stateCaptured || got.State != stateCaptured || got.Version != 2 || got.CaptureAt == nil {
		t.Fatalf("capture: %d %s", captured.status, captured.body)
	}
	for _, ifMatch := range []string{"1", ""} {
		canceled := c.settle(p.ID, "cancel", "cancel-"+ifMatch, ifMatch)
		if canceled.status != http.StatusConflict || canceled.contentType != "application/problem+json" || !conflictOf(t, canceled.body, stateCaptured, 2) {
			t.Errorf("cancel (If-Match %q) after the capture: %d %s, want 409 state_conflict, captured at version 2", ifMatch, canceled.status, canceled.body)
		}
		again := c.settle(p.ID, "cancel", "cancel-"+ifMatch, ifMatch)
		if again.status != canceled.status || again.body != canceled.body || !again.replayed {
			t.Errorf("the cancel's duplicate: %d %s (replayed %v), want %d %s replayed", again.status, again.body, again.replayed, canceled.status, canceled.body)
		}
	}

	if rec := c.record(p.ID); rec.State != stateCaptured || rec.Version != 2 {
		t.Errorf("the record %+v, want captured at version 2", rec)
	}
	if row := c.read(p.ID); row.Status != stateCaptured || row.State != stateCaptured || row.Version != 2 {
		t.Errorf("read %+v, want captured at version 2", row)
	}
	if st, _ := c.message(p.ID); st != lifecycle.Canceled {
		t.Errorf("the scheduled capture is %s, want canceled", st)
	}
	events := c.stateEvents()
	ref := paymentRef("alice", p.ID)
	if es := events[state.OrderingKey(ref)]; len(events) != 1 || len(es) != 1 || es[0].id != state.EventID(ref, 2) || es[0].event.From != stateAuthorized ||
		es[0].event.To != stateCaptured || es[0].event.Cause.Key != "capture-1" {
		t.Errorf("state events %+v, want the capture's alone", events)
	}
}

// TestPostgresCaptureRacesCancel: for each of 50 payments a capture and a
// cancel are sent at once with different keys (both If-Match: 1), then a
// duplicate of each. Per payment exactly one wins (200, its record at
// version 2 in its state); the other is 409 state_conflict with the
// winner's state and version 2; each duplicate replays its original's
// status and body. The record, the row and the outbox agree: exactly one
// state event per payment, the winner's, with its ID, ordering key and
// cause, and every scheduled capture canceled.
func TestPostgresCaptureRacesCancel(t *testing.T) { testCaptureRacesCancel(t, postgresMode) }

func testCaptureRacesCancel(t *testing.T, open opener) {
	const n = 50
	c := serveCaptures(t, open(t), time.Hour)
	ids := make([]string, n)
	for i := range ids {
		ids[i] = c.pay(fmt.Sprintf("order-%d", i)).ID
	}
	actions := [2]string{"capture", "cancel"}
	targets := map[string]string{"capture": stateCaptured, "cancel": stateCanceled}
	send := func(round int, answers [][2]answer) {
		var wg sync.WaitGroup
		for i, id := range ids {
			for j, action := range actions {
				wg.Go(func() {
					a, err := c.settleReq(id, action, action+"-"+id, "1")
					if err != nil {
						t.Errorf("round %d, %s %s: %v", round, action, id, err)
					}
					answers[i][j] = a
				})
			}
		}
		wg.Wait()
	}
	first, again := make([][2]answer, n), make([][2]answer, n)
	send(1, first)
	send(2, again)

	events := c.stateEvents()
	if len(events) != n {
		t.Errorf("%d payments have state events, want %d", len(events), n)
	}
	wins := map[string]int{}
	for i, id := range ids {
		ans := first[i]
		w := -1
		for j := range ans {
			if ans[j].status == http.StatusOK {
				if w >= 0 {
					t.Errorf("%s: both won: %s and %s", id, ans[0].body, ans[1].body)
				}
				w = j
			}
		}
		if w < 0 {
			t.Errorf("%s: none won: %d %s, %d %s", id, ans[0].status, ans[0].body, ans[1].status, ans[1].body)
			continue
		}
		winner, loser := actions[w], actions[1-w]
		to := targets[winner]
		wins[winner]++
		if p := decode(t, ans[w].body); p.State != to || p.Status != to || p.Version != 2 || ans[w].replayed {
			t.Errorf("%s: the %s answered %s", id, winner, ans[w].body)
		}
		if a := ans[1-w]; a.status != http.StatusConflict || a.replayed || !conflictOf(t, a.body, to, 2) {
			t.Errorf("%s: the %s answered %d %s, want 409 state_conflict with %s at version 2", id, loser, a.status, a.body, to)
		}
		for j := range ans {
			if d := again[i][j]; d.status != ans[j].status || d.body != ans[j].body || !d.replayed {
				t.Errorf("%s: the %s's duplicate answered %d %s (replayed %v), its original %d %s",
					id, actions[j], d.status, d.body, d.replayed, ans[j].status, ans[j].body)
			}
		}
		if rec := c.record(id); rec.State != to || rec.Version != 2 {
			t.Errorf("%s: the record %+v, want %s at version 2", id, rec, to)
		}
		if row := c.read(id); row.Status != to {
			t.Errorf("%s: the row %+v, want %s", id, row, to)
		}
		if st, _ := c.message(id); st != lifecycle.Canceled {
			t.Errorf("%s: the scheduled capture is %s, want canceled", id, st)
		}
		ref := paymentRef("alice", id)
		es := events[state.OrderingKey(ref)]
		if len(es) != 1 {
			t.Errorf("%s: %d state events, want 1", id, len(es))
			continue
		}
		if e := es[0]; e.id != state.EventID(ref, 2) || e.orderingKey != state.OrderingKey(ref) || e.event.Ref != ref ||
			e.event.From != stateAuthorized || e.event.To != to || e.event.Version != 2 || e.event.Cause.Key != winner+"-"+id {
			t.Errorf("%s: the state event %+v, want the %s's", id, e, winner)
		}
	}
	t.Logf("%d captures and %d cancels won", wins["capture"], wins["cancel"])
}

// TestPostgresScheduledCaptureOfCanceled: a payment canceled without its
// route (its record and row in one transaction, as another service
// would, its capture message left scheduled) is not captured when the
// message falls due: the run finds the record canceled, does nothing,
// and its message is done, not dead or retried. The record keeps its one
// transition and its one event.
func TestPostgresScheduledCaptureOfCanceled(t *testing.T) {
	c := serveCaptures(t, postgresMode(t), time.Hour)
	p := c.pay("order-1")
	ctx := context.Background()
	ref := paymentRef("alice", p.ID)
	err := pgx.BeginFunc(ctx, c.b.db, func(tx pgx.Tx) error {
		if _, err := state.New(tx).Transition(ctx, ref, state.Change{From: stateAuthorized, To: stateCanceled, ExpectedVersion: 1}); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `UPDATE payments SET status = 'canceled', capture_at = NULL WHERE id = $1`, mustPaymentID(t, p.ID))
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if st, _ := c.message(p.ID); st != lifecycle.Scheduled {
		t.Fatalf("the capture message is %s, want still scheduled", st)
	}
	bringForward(t, c.b)
	c.awaitCaptured(1, 10*time.Second)
	if st, lastError := c.message(p.ID); st != lifecycle.Done || lastError != "" {
		t.Errorf("the capture message is %s (%q), want done", st, lastError)
	}
	if rec := c.record(p.ID); rec.State != stateCanceled || rec.Version != 2 {
		t.Errorf("the record %+v, want canceled at version 2", rec)
	}
	history, err := c.b.states.History(ctx, ref, 0, 0)
	if err != nil || len(history) != 1 || history[0].To != stateCanceled {
		t.Errorf("history %+v (%v), want the cancel alone", history, err)
	}
	if row := c.read(p.ID); row.Status != stateCanceled || row.CaptureAt != nil {
		t.Errorf("the row %+v, want canceled", row)
	}
	if events := c.stateEvents(); len(events) != 1 || len(events[state.OrderingKey(ref)]) != 1 || events[state.OrderingKey(ref)][0].id != state.EventID(ref, 2) {
		t.Errorf("state events %+v, want the cancel's alone", events)
	}
}

// mustPaymentID returns the row id of the payment id.
func mustPaymentID(t *testing.T, id string) int64 {
	t.Helper()
	n, ok := parsePaymentID(id)
	if !ok {
		t.Fatalf("%q is no payment's id", id)
	}
	return n
}
