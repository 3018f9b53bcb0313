package outboxproof_test

import (
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency/outbox"
	"github.com/go-idempotency/idempotency/outbox/lifecycle"
)

// TestScheduledNeverEarly: messages whose NotBefore is spread over a few
// seconds (at nanosecond precision), with three relay processes polling
// every 20ms, are each presented to a sink (on the relay's clock) and
// stored by JetStream (on the server's clock) at or after their NotBefore,
// never earlier, and all are published, each once. A message enqueued
// without NotBefore behind a scheduled one of its ordering key waits for
// it: stored after it.
func TestScheduledNeverEarly(t *testing.T) {
	n, pairs, spread := 300, 20, 4*time.Second
	if os.Getenv(longEnv) == "1" {
		n, pairs, spread = 3000, 200, 20*time.Second
	}
	r := newRig(t, relayConfig{processes: 3, lease: 2 * time.Second, poll: 20 * time.Millisecond})
	r.startRelays()

	// NotBefore from a second after the enqueue is done (a millisecond a
	// message is ample), so that every message is scheduled when it
	// commits, to spread later.
	base := time.Now().Add(time.Second + time.Duration(n+2*pairs)*time.Millisecond)
	notBefore := map[string]time.Time{} // message ID -> its NotBefore
	at := func() time.Time { return base.Add(rand.N(spread)) }
	nbs := make(map[string]time.Time, n) // payload -> NotBefore
	for i := range n {
		nbs[fmt.Sprint("s-", i)] = at()
	}
	scheduled := r.enqueueMany("scheduled-", n, 10, func(i int) outbox.Message {
		p := fmt.Sprint("s-", i)
		return outbox.Message{Payload: []byte(p), OrderingKey: p, NotBefore: nbs[p]}
	})
	for id, p := range scheduled {
		notBefore[id] = nbs[p]
	}
	// Pairs on one ordering key: a scheduled message, then one due at once.
	behind := map[string]string{} // the ID of the message due at once -> the scheduled one before it
	for i := range pairs {
		key := fmt.Sprint("pair-", i)
		nb := at()
		ids := r.enqueue(key,
			outbox.Message{Payload: []byte(key + "-first"), OrderingKey: key, NotBefore: nb},
			outbox.Message{Payload: []byte(key + "-second"), OrderingKey: key})
		notBefore[ids[0]] = nb
		behind[ids[1]] = ids[0]
	}
	enqueued := time.Now()
	for id, w := range r.rows() {
		if _, ok := notBefore[id]; ok && w.Status != lifecycle.Scheduled && enqueued.Before(notBefore[id]) {
			t.Errorf("%s, due at %v, is %s once committed, want scheduled", id, notBefore[id], w.Status)
		}
	}

	r.awaitFinished(spread + time.Minute)
	r.stopRelays()

	got := r.storedMessages()
	rows := r.rows()
	presented := map[string]time.Time{}
	for _, l := range r.lines {
		if l.Kind != "PRESENT" {
			continue
		}
		ns, err := strconv.ParseInt(field(l, 2), 10, 64)
		if err != nil {
			t.Fatalf("PRESENT %q", l.Text)
		}
		if id, at := field(l, 0), time.Unix(0, ns); presented[id].IsZero() || at.Before(presented[id]) {
			presented[id] = at // the first presentation
		}
	}
	var late []time.Duration
	for id, nb := range notBefore {
		cs := got[id]
		if len(cs) != 1 {
			t.Errorf("%s is in the stream %d times, want once", id, len(cs))
			continue
		}
		if cs[0].at.Before(nb) {
			t.Errorf("%s was stored at %v, %v before its NotBefore %v", id, cs[0].at, nb.Sub(cs[0].at), nb)
		}
		if p := presented[id]; p.Before(nb) {
			t.Errorf("%s was presented at %v, %v before its NotBefore %v", id, p, nb.Sub(p), nb)
		}
		if rows[id].Status != lifecycle.Done {
			t.Errorf("%s is %s", id, rows[id].Status)
		}
		late = append(late, cs[0].at.Sub(nb))
	}
	for second, first := range behind {
		cs := got[second]
		if len(cs) != 1 {
			t.Errorf("%s is in the stream %d times, want once", second, len(cs))
			continue
		}
		if len(got[first]) == 1 && !cs[0].at.After(got[first][0].at) {
			t.Errorf("%s, due at once behind the scheduled %s on its key, was stored at %v, not after it (%v)", second, first, cs[0].at, got[first][0].at)
		}
	}
	if len(got) != n+2*pairs {
		t.Errorf("%d messages in the stream, want %d", len(got), n+2*pairs)
	}
	slices.Sort(late)
	if len(late) > 0 {
		t.Logf("%d scheduled messages over %v (and %d due at once behind one of them), 3 relays polling every 20ms: none stored before its NotBefore; stored after it by %v (median), %v (p99), %v (max); %d presentations",
			len(late), spread, pairs, late[len(late)/2].Round(time.Microsecond), late[len(late)*99/100].Round(time.Microsecond), late[len(late)-1].Round(time.Microsecond), r.lineCounts()["PRESENT"])
	}
}
