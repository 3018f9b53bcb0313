package main

import (
	"context"
	"errors"
	"fmt"
	"os/user"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/internal/outboxtest"
	"github.com/go-idempotency/idempotency/internal/pgtest"
	"github.com/go-idempotency/idempotency/outbox"
	"github.com/go-idempotency/idempotency/outbox/lifecycle"
	"github.com/go-idempotency/idempotency/outbox/relay"
	"github.com/go-idempotency/idempotency/pgstore"
)

// outboxFixture is a database of its own with an outbox table, into which
// the tests write messages in every status directly.
type outboxFixture struct {
	url   string
	pool  *pgxpool.Pool
	table string // as given to -table
	n     int    // messages added
}

// newOutboxFixture creates the database with pgstore's tables, and the
// outbox table named table when it is not the default one.
func newOutboxFixture(t *testing.T, table string) *outboxFixture {
	t.Helper()
	url := pgtest.Database(t)
	pool := pgtest.PoolOn(t, url)
	ctx := context.Background()
	if err := pgstore.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	if table != pgstore.DefaultOutboxTable {
		if schema, _, ok := strings.Cut(table, "."); ok {
			if _, err := pool.Exec(ctx, "CREATE SCHEMA "+pgx.Identifier{schema}.Sanitize()); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := pool.Exec(ctx, pgstore.OutboxSchema(table)); err != nil {
			t.Fatal(err)
		}
	}
	return &outboxFixture{url: url, pool: pool, table: table}
}

// run runs idemctl outbox with args on f's table.
func (f *outboxFixture) run(t *testing.T, args ...string) result {
	t.Helper()
	return idemctl(t, nil, append([]string{"outbox", "-postgres", f.url, "-table", f.table}, args...)...)
}

// quoted is f's table quoted for SQL.
func (f *outboxFixture) quoted() string {
	return pgx.Identifier(strings.Split(f.table, ".")).Sanitize()
}

// msg is a message row as a test writes it. The durations are from the
// server's clock at the insert.
type msg struct {
	topic       string
	status      string
	attempts    int
	enqueued    time.Duration // ago
	due         time.Duration // due_at from now (negative: past)
	claimedBy   string        // claimed: the relay
	claimLeft   time.Duration // claimed: claim_until from now (negative: ran out)
	finished    time.Duration // done, dead and canceled: ago
	lastError   *string
	orderingKey string // default: the storage key
	reason      string // suspended: suspended_reason
}

// add writes m and returns its ID.
func (f *outboxFixture) add(t *testing.T, m msg) string {
	t.Helper()
	f.n++
	key := idempotency.StorageKey("", fmt.Sprint("k-", f.n))
	if m.topic == "" {
		m.topic = "orders.created"
	}
	if m.orderingKey == "" {
		m.orderingKey = key
	}
	var claimedBy, reason *string
	if m.claimedBy != "" {
		claimedBy = &m.claimedBy
	}
	if m.reason != "" {
		reason = &m.reason
	}
	_, err := f.pool.Exec(context.Background(), `
INSERT INTO `+f.quoted()+` (storage_key, seq, topic, payload, headers, ordering_key, status, attempts,
	enqueued_at, due_at, claim_token, claimed_by, claim_until, finished_at, last_error, suspended_reason)
SELECT $1, 1, $2, '\x7b7d'::bytea, '{}'::jsonb, $3, $4::text, $5,
	n - $6::interval, n + $7::interval,
	CASE WHEN $4::text = 'claimed' THEN 'token-' || $1 END, $8,
	CASE WHEN $4::text = 'claimed' THEN n + $9::interval END,
	CASE WHEN $4::text IN ('done', 'dead', 'canceled') THEN n - $10::interval END, $11, $12
FROM (SELECT clock_timestamp() AS n) now`,
		key, m.topic, m.orderingKey, m.status, m.attempts, m.enqueued, m.due, claimedBy, m.claimLeft, m.finished, m.lastError, reason)
	if err != nil {
		t.Fatalf("insert %+v: %v", m, err)
	}
	return outbox.ID(key, 1)
}

// row returns the row of the message id as JSON text (every column), and
// "" when there is none.
func (f *outboxFixture) row(t *testing.T, id string) string {
	t.Helper()
	key, seq, err := outbox.ParseID(id)
	if err != nil {
		t.Fatal(err)
	}
	var s string
	err = f.pool.QueryRow(context.Background(), `SELECT to_jsonb(o)::text FROM `+f.quoted()+` o WHERE storage_key = $1 AND seq = $2`, key, seq).Scan(&s)
	if errors.Is(err, pgx.ErrNoRows) {
		return ""
	}
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// statuses counts f's rows by status.
func (f *outboxFixture) statuses(t *testing.T) map[string]int {
	t.Helper()
	rows, err := f.pool.Query(context.Background(), `SELECT status, count(*) FROM `+f.quoted()+` GROUP BY status`)
	if err != nil {
		t.Fatal(err)
	}
	got, err := pgx.CollectRows(rows, pgx.RowToStructByPos[struct {
		Status string
		N      int
	}])
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]int{}
	for _, r := range got {
		m[r.Status] = r.N
	}
	return m
}

// listen returns a connection LISTENing on the channel of f's table.
func (f *outboxFixture) listen(t *testing.T) *pgx.Conn {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, f.url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	name := f.table[strings.LastIndexByte(f.table, '.')+1:]
	if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{outbox.Channel(name)}.Sanitize()); err != nil {
		t.Fatal(err)
	}
	return conn
}

// notified waits up to d for a notification on conn, and returns it or
// nil.
func notified(t *testing.T, conn *pgx.Conn, d time.Duration) *pgconn.Notification {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	n, err := conn.WaitForNotification(ctx)
	if err != nil {
		if ctx.Err() == nil {
			t.Fatal(err)
		}
		return nil
	}
	return n
}

func ptr(s string) *string { return &s }

// field returns the column col of the message id's row as text ("" for
// NULL).
func (f *outboxFixture) field(t *testing.T, id, col string) string {
	t.Helper()
	key, seq, err := outbox.ParseID(id)
	if err != nil {
		t.Fatal(err)
	}
	var s *string
	err = f.pool.QueryRow(context.Background(), `SELECT (`+pgx.Identifier{col}.Sanitize()+`)::text FROM `+f.quoted()+` WHERE storage_key = $1 AND seq = $2`, key, seq).Scan(&s)
	if err != nil {
		t.Fatal(err)
	}
	if s == nil {
		return ""
	}
	return *s
}

func TestOutboxStatus(t *testing.T) {
	f := newOutboxFixture(t, pgstore.DefaultOutboxTable)

	// An empty outbox.
	r := f.run(t).want(t, exitOK)
	r.lines(t, [][]string{{"ready", "0", "due"}, {"total", "0"}})
	r.contains(t, "table idempotency_outbox: 0 messages", "oldest due: none", "relays: none holds a claim")

	oldest := f.add(t, msg{status: "retry_wait", attempts: 2, enqueued: 10 * time.Minute, due: -5 * time.Minute, topic: "payments.settled"})
	f.add(t, msg{status: "ready", enqueued: time.Hour, due: -time.Minute}) // enqueued earlier, due later
	f.add(t, msg{status: "retry_wait", attempts: 1, due: time.Hour, lastError: ptr("publish_failed: nak")})
	f.add(t, msg{status: "scheduled", due: time.Hour})
	f.add(t, msg{status: "scheduled", due: -time.Second})
	f.add(t, msg{status: "claimed", claimedBy: "relay-a", claimLeft: 20 * time.Second})
	f.add(t, msg{status: "claimed", claimedBy: "relay-a", claimLeft: -time.Second})
	f.add(t, msg{status: "claimed", claimedBy: "relay-b", claimLeft: 20 * time.Second})
	f.add(t, msg{status: "suspended", reason: "orders service down (by ops)"})
	f.add(t, msg{status: "suspended", reason: "orders service down (by ops)"})
	f.add(t, msg{status: "suspended", reason: "sink: budget exhausted"})
	for range 3 {
		f.add(t, msg{status: "done", attempts: 1, finished: time.Minute})
	}
	f.add(t, msg{status: "dead", attempts: 25, finished: time.Minute, lastError: ptr("publish_failed: no route")})
	f.add(t, msg{status: "canceled", finished: time.Minute, lastError: ptr("canceled: by ops with idemctl")})

	for _, args := range [][]string{nil, {"status"}} {
		r := f.run(t, args...).want(t, exitOK)
		r.lines(t, [][]string{
			{"STATE", "MESSAGES", "DETAIL"},
			{"scheduled", "2", "1 due now, 1 later"},
			{"ready", "1", "due, waiting for a relay"},
			{"claimed", "3", "1 with a claim that ran out"},
			{"retry_wait", "2", "1 due again, 1 waiting for their backoff"},
			{"suspended", "3", "held until resumed"},
			{"done", "3", "published"},
			{"dead", "1", "out of attempts, refused or unreadable: idemctl outbox dead lists them"},
			{"canceled", "1", "by an application or an operator"},
			{"total", "16"},
			{"SUSPENDED", "REASON"},
			{"2", "orders service down (by ops)"},
			{"1", "sink: budget exhausted"},
			{"RELAY", "CLAIMED", "RAN OUT"},
			{"relay-a", "2", "1"},
			{"relay-b", "1", "0"},
		})
		r.contains(t, "table idempotency_outbox: 16 messages",
			"oldest due: "+oldest+" (topic payments.settled, 2 attempts so far): due for 5m", ", enqueued 10m",
			"waiting for a retry: 1 message, by last error", "dead: 1 message, by last error")
	}

	var res outboxStatus
	f.run(t, "-json").want(t, exitOK).decode(t, &res)
	want := map[lifecycle.State]int64{"scheduled": 2, "ready": 1, "claimed": 3, "retry_wait": 2, "suspended": 3, "done": 3, "dead": 1, "canceled": 1}
	if fmt.Sprint(res.States) != fmt.Sprint(want) || res.Due != 3 || res.ScheduledLater != 1 || res.RetryWaiting != 1 ||
		res.ClaimedRanOut != 1 || res.Total != 16 || res.Table != "idempotency_outbox" {
		t.Errorf("status -json: %+v", res)
	}
	o := res.OldestDue
	if o == nil || o.ID != oldest || o.Topic != "payments.settled" || o.Attempts != 2 || o.State != lifecycle.RetryWait ||
		o.DueForMS < 300_000 || o.DueForMS > 330_000 || o.AgeMS < 600_000 || o.AgeMS > 630_000 {
		t.Errorf("oldest_due %+v, want %s due for 5m, enqueued 10m ago", o, oldest)
	}
	relays := []relayClaims{{"relay-a", 2, 1}, {"relay-b", 1, 0}}
	if fmt.Sprint(res.Relays) != fmt.Sprint(relays) {
		t.Errorf("relays %+v, want %+v", res.Relays, relays)
	}
	suspended := []suspendedReason{{"orders service down (by ops)", 2}, {"sink: budget exhausted", 1}}
	if fmt.Sprint(res.Suspended) != fmt.Sprint(suspended) {
		t.Errorf("suspended %+v, want %+v", res.Suspended, suspended)
	}
	if len(res.DeadErrors) != 1 || res.DeadErrors[0].Error != "publish_failed: no route" || res.DeadMessages != 1 {
		t.Errorf("dead errors %+v", res.DeadErrors)
	}

	// DATABASE_URL names the database as for the other commands.
	idemctl(t, map[string]string{"DATABASE_URL": f.url}, "outbox").want(t, exitOK).lines(t, [][]string{{"total", "16"}})
}

// TestOutboxStatusFailures: status shows why the messages waiting for a
// retry failed, and why the dead ones died: their last errors grouped by
// text, with each message's own ID in it as <id> (a sink's error names the
// message), the group of the most recently enqueued message first, at most
// 5 groups; done messages, and messages that never failed, are not
// counted.
func TestOutboxStatusFailures(t *testing.T) {
	f := newOutboxFixture(t, pgstore.DefaultOutboxTable)
	if r := f.run(t).want(t, exitOK); strings.Contains(r.stdout, "by last error") {
		t.Errorf("an empty outbox shows failures:\n%s", r.stdout)
	}

	// The error a JetStream sink gives when no stream captures the
	// subject, naming the message; kept as the relay keeps it.
	noStream := func(id string) {
		t.Helper()
		key, seq, err := outbox.ParseID(id)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.pool.Exec(context.Background(), `UPDATE idempotency_outbox
			SET last_error = 'publish_failed: natsink: publishing ' || storage_key || '/' || seq || ' to payment.created: nats: no response from stream'
			WHERE storage_key = $1 AND seq = $2`, key, seq); err != nil {
			t.Fatal(err)
		}
	}
	const grouped = "publish_failed: natsink: publishing <id> to payment.created: nats: no response from stream"
	for _, due := range []time.Duration{time.Second, time.Minute, -time.Second} { // two waiting, one due again
		noStream(f.add(t, msg{status: "retry_wait", attempts: 1, due: due}))
	}
	f.add(t, msg{status: "retry_wait", attempts: 3, due: time.Minute, lastError: ptr("publish_failed: nats: timeout")})
	f.add(t, msg{status: "ready", due: -time.Second})                                                             // never failed
	f.add(t, msg{status: "done", attempts: 2, finished: time.Minute, lastError: ptr("publish_failed: done")})     // published in the end
	f.add(t, msg{status: "dead", attempts: 25, finished: time.Minute, lastError: ptr("publish_failed: dead")})    // dead: its own groups
	f.add(t, msg{status: "dead", attempts: 1, finished: time.Minute, lastError: ptr("refused: invalid subject")}) // refused

	r := f.run(t).want(t, exitOK)
	r.contains(t, "waiting for a retry: 4 messages, by last error", "dead: 2 messages, by last error")
	r.lines(t, [][]string{{"MESSAGES", "LAST ERROR"}, {"3", grouped}, {"1", "publish_failed: nats: timeout"},
		{"1", "refused: invalid subject"}, {"1", "publish_failed: dead"}})
	if i, j := strings.Index(r.stdout, "nats: timeout"), strings.Index(r.stdout, grouped); i < 0 || j < 0 || i > j {
		t.Errorf("the group of the latest message is not first:\n%s", r.stdout)
	}
	if strings.Contains(r.stdout, "publish_failed: done") || strings.Contains(r.stdout, "other error") {
		t.Errorf("status shows a done message's error, or more groups:\n%s", r.stdout)
	}

	// A later message of the first group puts it first.
	latest := f.add(t, msg{status: "retry_wait", attempts: 1, due: time.Minute})
	noStream(latest)
	var res outboxStatus
	f.run(t, "-json").want(t, exitOK).decode(t, &res)
	want := []failureGroup{{grouped, 4, latest}, {"publish_failed: nats: timeout", 1, ""}}
	if len(res.Failures) != 2 || res.Failures[0] != want[0] || res.Failures[1].Error != want[1].Error || res.Failures[1].Messages != 1 ||
		res.FailureGroups != 2 || res.FailedMessages != 5 {
		t.Errorf("status -json failures %+v (%d groups, %d messages), want %+v", res.Failures, res.FailureGroups, res.FailedMessages, want)
	}
	if len(res.DeadErrors) != 2 || res.DeadErrors[0].Error != "refused: invalid subject" || res.DeadErrorGroups != 2 || res.DeadMessages != 2 {
		t.Errorf("status -json dead errors %+v", res.DeadErrors)
	}

	// At most 5 groups; the rest counted. Error text is shown escaped.
	for i := range 5 {
		f.add(t, msg{status: "retry_wait", attempts: 1, due: time.Minute, lastError: ptr(fmt.Sprintf("publish_failed: cause %d\x1b[2J", i))})
	}
	r = f.run(t).want(t, exitOK)
	checkShown(t, r.stdout)
	r.contains(t, "waiting for a retry: 10 messages", `"publish_failed: cause 4\x1b[2J"`, "and 5 more messages with 2 other errors")
	if strings.Contains(r.stdout, grouped) || !strings.Contains(r.stdout, "cause 0") {
		t.Errorf("not the 5 latest groups:\n%s", r.stdout)
	}
}

func TestOutboxDead(t *testing.T) {
	f := newOutboxFixture(t, pgstore.DefaultOutboxTable)
	first := f.add(t, msg{status: "dead", attempts: 25, finished: 3 * time.Hour, lastError: ptr("publish_failed: nats: no responders available for request")})
	hostileTopic, hostileError := "orders\x1b[31m.created\t", "publish_failed: broker said:\nno\x1b[2J\u202e"
	second := f.add(t, msg{status: "dead", attempts: 3, finished: 2 * time.Hour, topic: hostileTopic, lastError: &hostileError})
	third := f.add(t, msg{status: "dead", attempts: 1, finished: time.Hour, topic: "payments.settled"}) // no error kept
	f.add(t, msg{status: "retry_wait", attempts: 2, lastError: ptr("publish_failed: pending")})
	f.add(t, msg{status: "done", attempts: 1, finished: time.Minute, lastError: ptr("publish_failed: done")})
	f.add(t, msg{status: "canceled", finished: time.Minute, lastError: ptr("canceled: by ops")})

	r := f.run(t, "dead").want(t, exitOK)
	checkShown(t, r.stdout+r.stderr)
	rows := r.rows()
	if len(rows) != 3 || !strings.HasPrefix(rows[0], first+"  ") || !strings.HasPrefix(rows[1], second+"  ") || !strings.HasPrefix(rows[2], third+"  ") {
		t.Fatalf("dead: rows not the three dead messages, earliest to die first:\n%s", r.stdout)
	}
	r.lines(t, [][]string{
		{"ID", "TOPIC", "ATTEMPTS", "FINISHED", "LAST ERROR"},
		{first, "orders.created", "25"},
		{second, `"orders\x1b[31m.created\t"`, "3"},
		{third, "payments.settled", "1"},
	})
	r.contains(t, `"publish_failed: broker said:\nno\x1b[2J\u202e"`, "nats: no responders available for request")
	if got := columns.Split(rows[2], -1); got[len(got)-1] != "-" {
		t.Errorf("a dead message without last_error: %q, want - last", rows[2])
	}
	if strings.Contains(r.stdout, "pending") || strings.Contains(r.stdout, "publish_failed: done") || strings.Contains(r.stdout, "canceled") {
		t.Errorf("dead lists other messages:\n%s", r.stdout)
	}
	var finished time.Time
	if err := f.pool.QueryRow(context.Background(), `SELECT finished_at FROM idempotency_outbox WHERE status = 'dead' ORDER BY finished_at LIMIT 1`).Scan(&finished); err != nil {
		t.Fatal(err)
	}
	r.lines(t, [][]string{{first, "orders.created", "25", finished.UTC().Format(time.RFC3339)}})

	r = f.run(t, "dead", "-topic", "payments.settled").want(t, exitOK)
	if rows := r.rows(); len(rows) != 1 || !strings.HasPrefix(rows[0], third+"  ") {
		t.Errorf("dead -topic payments.settled:\n%s", r.stdout)
	}
	r = f.run(t, "dead", "-limit", "1").want(t, exitOK).contains(t, "stopped at -limit 1")
	if rows := r.rows(); len(rows) != 1 || !strings.HasPrefix(rows[0], first+"  ") {
		t.Errorf("dead -limit 1:\n%s", r.stdout)
	}
	if r := f.run(t, "dead", "-limit", "3").want(t, exitOK); strings.Contains(r.stderr, "stopped") {
		t.Errorf("dead -limit 3 of 3 says it stopped: %s", r.stderr)
	}

	// -json: one object per line, the text as stored, escaped.
	r = f.run(t, "dead", "-json").want(t, exitOK)
	checkShown(t, r.stdout)
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	if len(lines) != 3 {
		t.Fatalf("dead -json: %d lines, want 3:\n%s", len(lines), r.stdout)
	}
	var m deadMessage
	result{stdout: lines[1]}.decode(t, &m)
	if m.ID != second || m.Topic != hostileTopic || m.LastError == nil || *m.LastError != hostileError || m.Attempts != 3 ||
		m.FinishedAt == nil || m.DeadForMS == nil || *m.DeadForMS < 7_200_000 || *m.DeadForMS > 7_300_000 {
		t.Errorf("dead -json line %+v", m)
	}
	result{stdout: lines[2]}.decode(t, &m)
	if m.ID != third || m.LastError != nil {
		t.Errorf("dead -json line %+v, want %s without last_error", m, third)
	}
}

// TestOutboxRequeue: requeue makes finished messages (dead, done or
// canceled) ready again, due now, their attempts reset, and records who
// requeued them, when and how many times; a message not finished is
// refused, all or nothing, and nothing is notified then.
func TestOutboxRequeue(t *testing.T) {
	f := newOutboxFixture(t, pgstore.DefaultOutboxTable)
	why := "publish_failed: nats: maximum payload exceeded"
	dead := f.add(t, msg{status: "dead", attempts: 25, finished: time.Hour, due: -time.Hour, lastError: &why, claimedBy: "relay-z"})
	waiting := f.add(t, msg{status: "retry_wait", attempts: 3, due: time.Minute, lastError: ptr("publish_failed: x")})
	ready := f.add(t, msg{status: "ready"})
	scheduled := f.add(t, msg{status: "scheduled", due: time.Hour})
	suspended := f.add(t, msg{status: "suspended", reason: "held"})
	claimed := f.add(t, msg{status: "claimed", attempts: 1, claimedBy: "relay-a", claimLeft: 30 * time.Second})
	done := f.add(t, msg{status: "done", attempts: 1, finished: time.Minute})
	canceled := f.add(t, msg{status: "canceled", finished: time.Minute, lastError: ptr("canceled: by ops")})
	unknown := idempotency.StorageKey("", "never") + "/1"
	listener := f.listen(t)

	before := map[string]string{}
	for _, id := range []string{dead, waiting, ready, scheduled, suspended, claimed, done, canceled} {
		before[id] = f.row(t, id)
	}
	unchanged := func(what string) {
		t.Helper()
		for id, row := range before {
			if got := f.row(t, id); got != row {
				t.Errorf("%s changed %s:\n%s\nwas\n%s", what, id, got, row)
			}
		}
	}
	const acts = "requeue acts on done, dead or canceled messages only"
	f.run(t, "requeue", waiting).want(t, exitRefused).contains(t, waiting+" is retry_wait: "+acts+", and this one is not finished", "nothing requeued")
	f.run(t, "requeue", ready).want(t, exitRefused).contains(t, ready+" is ready: "+acts)
	f.run(t, "requeue", scheduled).want(t, exitRefused).contains(t, scheduled+" is scheduled: "+acts)
	f.run(t, "requeue", suspended).want(t, exitRefused).contains(t, suspended+" is suspended: ", "resume it first")
	f.run(t, "requeue", claimed).want(t, exitRefused).contains(t, claimed+" is claimed by relay relay-a: ", "a relay is publishing this one")
	f.run(t, "requeue", unknown).want(t, exitNotFound).contains(t, "no message "+unknown+" in idempotency_outbox")
	// All or nothing: the dead message named with them stays dead.
	f.run(t, "requeue", dead, waiting).want(t, exitRefused).contains(t, waiting+" is retry_wait")
	f.run(t, "requeue", dead, waiting, unknown).want(t, exitNotFound).contains(t, waiting+" is retry_wait", "no message "+unknown)
	unchanged("a refused requeue")
	if n := notified(t, listener, 200*time.Millisecond); n != nil {
		t.Errorf("a refused requeue notified: %+v", n)
	}

	r := f.run(t, "requeue", "-by", "alice", dead, dead, done, canceled).want(t, exitOK)
	r.contains(t, "requeued 3 messages in idempotency_outbox by alice: ready, due now, attempts reset to 0; relays notified", "  "+dead, "  "+done, "  "+canceled)
	if n := notified(t, listener, 5*time.Second); n == nil || n.Channel != "idempotency_outbox" || n.Payload != "" {
		t.Errorf("notification after requeue: %+v, want one on idempotency_outbox", n)
	}
	var (
		status, lastError          string
		attempts, requeues         int
		finished, claimedBy, by    *string
		noToken, noClaim           bool
		dueNow, dueSinceTheRequeue bool
		requeuedNow                bool
	)
	err := f.pool.QueryRow(context.Background(), `
SELECT status, attempts, finished_at::text, last_error, claimed_by, claim_token IS NULL, claim_until IS NULL,
	due_at <= clock_timestamp(), due_at > clock_timestamp() - interval '1 minute',
	requeues, requeued_by, requeued_at > clock_timestamp() - interval '1 minute'
FROM idempotency_outbox WHERE storage_key || '/' || seq = $1`, dead).
		Scan(&status, &attempts, &finished, &lastError, &claimedBy, &noToken, &noClaim, &dueNow, &dueSinceTheRequeue, &requeues, &by, &requeuedNow)
	if err != nil {
		t.Fatal(err)
	}
	if status != "ready" || attempts != 0 || finished != nil || !noToken || !noClaim || !dueNow || !dueSinceTheRequeue {
		t.Errorf("requeued row: status %s, attempts %d, finished_at %v, no claim %v %v, due now %v, due since the requeue %v",
			status, attempts, finished, noToken, noClaim, dueNow, dueSinceTheRequeue)
	}
	if requeues != 1 || by == nil || *by != "alice" || !requeuedNow {
		t.Errorf("requeued row: requeues %d, requeued_by %v, requeued now %v; want 1 by alice", requeues, by, requeuedNow)
	}
	// What says why and where it died is kept.
	if lastError != why || claimedBy == nil || *claimedBy != "relay-z" {
		t.Errorf("requeued row: last_error %q, claimed_by %v; want %q and relay-z kept", lastError, claimedBy, why)
	}
	for _, id := range []string{dead, done, canceled} {
		delete(before, id)
	}
	unchanged("requeue of other messages")

	// Requeued, the message is ready: requeued again, it is refused.
	f.run(t, "requeue", dead).want(t, exitRefused).contains(t, "is ready")

	// -all, of a state and a topic; -by defaults to the OS user.
	a1 := f.add(t, msg{status: "dead", attempts: 5, finished: time.Minute, topic: "a"})
	a2 := f.add(t, msg{status: "dead", attempts: 5, finished: time.Minute, topic: "a"})
	f.add(t, msg{status: "canceled", finished: time.Minute, topic: "a"})
	b1 := f.add(t, msg{status: "dead", attempts: 5, finished: time.Minute, topic: "b"})
	var ch outboxChange
	f.run(t, "requeue", "-all", "-topic", "a", "-json").want(t, exitOK).decode(t, &ch)
	if ch.Action != "requeued" || ch.Count != 2 || fmt.Sprint(ch.IDs) != fmt.Sprint([]string{a1, a2}) ||
		fmt.Sprint(ch.States) != "[ready ready]" {
		t.Errorf("requeue -all -topic a -json: %+v, want %s and %s ready", ch, a1, a2)
	}
	if u, err := user.Current(); err == nil {
		if got := f.field(t, a1, "requeued_by"); got != u.Username {
			t.Errorf("requeued_by %q, want the OS user %q", got, u.Username)
		}
	}
	if n := notified(t, listener, 5*time.Second); n == nil {
		t.Error("no notification after requeue -all")
	}
	if st := f.statuses(t); st["dead"] != 1 || st["canceled"] != 1 {
		t.Errorf("after requeue -all -topic a: %v, want b's message dead alone and a's canceled one kept", st)
	}
	f.run(t, "requeue", "-all").want(t, exitOK).contains(t, "requeued 1 dead message", "  "+b1)
	f.run(t, "requeue", "-all", "-state", "canceled").want(t, exitOK).contains(t, "requeued 1 canceled message")
	f.run(t, "requeue", "-all").want(t, exitOK).contains(t, "requeued 0 dead messages")
	for range 2 {
		if n := notified(t, listener, 5*time.Second); n == nil {
			t.Error("no notification after requeue -all")
		}
	}
	if n := notified(t, listener, 200*time.Millisecond); n != nil {
		t.Errorf("requeue -all of nothing notified: %+v", n)
	}
	// Requeued twice, recorded twice.
	f.add(t, msg{status: "dead", finished: time.Minute})
	if _, err := f.pool.Exec(context.Background(), `UPDATE idempotency_outbox SET status = 'done', finished_at = clock_timestamp() WHERE storage_key || '/' || seq = $1`, dead); err != nil {
		t.Fatal(err)
	}
	f.run(t, "requeue", "-by", "bob", dead).want(t, exitOK)
	if n, who := f.field(t, dead, "requeues"), f.field(t, dead, "requeued_by"); n != "2" || who != "bob" {
		t.Errorf("requeued twice: requeues %s by %s, want 2 by bob", n, who)
	}
	f.run(t).want(t, exitOK).contains(t, "requeued by an operator at least once: 7 messages")
}

func TestOutboxPurge(t *testing.T) {
	f := newOutboxFixture(t, pgstore.DefaultOutboxTable)
	ready := f.add(t, msg{status: "ready"})
	waiting := f.add(t, msg{status: "retry_wait", attempts: 2, due: time.Hour})
	suspended := f.add(t, msg{status: "suspended"})
	claimed := f.add(t, msg{status: "claimed", claimedBy: "relay-a", claimLeft: time.Minute})
	ranOut := f.add(t, msg{status: "claimed", claimedBy: "relay-b", claimLeft: -time.Hour})
	done := f.add(t, msg{status: "done", attempts: 1, finished: time.Minute})
	dead := f.add(t, msg{status: "dead", attempts: 25, finished: time.Minute, lastError: ptr("publish_failed: x")})
	canceled := f.add(t, msg{status: "canceled", finished: time.Minute})
	unknown := idempotency.StorageKey("", "never") + "/7"

	for _, id := range []string{ready, waiting, suspended, claimed, ranOut} {
		f.run(t, "purge", id).want(t, exitRefused).contains(t, "purge deletes finished messages only", "nothing purged")
		f.run(t, "purge", done, id).want(t, exitRefused)
	}
	f.run(t, "purge", claimed).want(t, exitRefused).contains(t, claimed+" is claimed by relay relay-a")
	f.run(t, "purge", done, unknown).want(t, exitNotFound).contains(t, "no message "+unknown)
	if st := f.statuses(t); st["ready"] != 1 || st["claimed"] != 2 || st["done"] != 1 || st["dead"] != 1 || st["canceled"] != 1 {
		t.Fatalf("a refused purge deleted: %v", st)
	}

	r := f.run(t, "purge", done, dead, canceled).want(t, exitOK).contains(t, "purged 3 messages from idempotency_outbox", "  "+done, "  "+dead, "  "+canceled)
	checkShown(t, r.stdout)
	if f.row(t, done) != "" || f.row(t, dead) != "" || f.row(t, canceled) != "" {
		t.Error("purge left a named message")
	}
	f.run(t, "purge", done).want(t, exitNotFound)

	// Bulk purges, by age.
	var oldDone []string
	for i := range 5 {
		oldDone = append(oldDone, f.add(t, msg{status: "done", attempts: 1, finished: time.Duration(2+i) * time.Hour, topic: fmt.Sprint("t", i%2)}))
	}
	newDone := f.add(t, msg{status: "done", attempts: 1, finished: time.Minute})
	oldDead := f.add(t, msg{status: "dead", attempts: 25, finished: 3 * time.Hour})
	oldCanceled := f.add(t, msg{status: "canceled", finished: 3 * time.Hour})
	f.run(t, "purge", "-done").want(t, exitUsage).contains(t, "needs -older")
	f.run(t, "purge", "-done", "-older", "1h", "-topic", "t1").want(t, exitOK).contains(t, "purged 2 done messages of topic t1 from idempotency_outbox that finished at least 1h0m ago")
	if f.row(t, oldDone[1]) != "" || f.row(t, oldDone[3]) != "" || f.row(t, oldDone[0]) == "" {
		t.Error("purge -done -topic t1 deleted the wrong messages")
	}
	f.run(t, "purge", "-done", "-older", "1h", "-batch", "2", "-json").want(t, exitOK).decode(t, new(outboxChange))
	if st := f.statuses(t); st["done"] != 1 || st["dead"] != 1 || st["canceled"] != 1 || f.row(t, newDone) == "" || f.row(t, oldDead) == "" {
		t.Errorf("after purge -done -older 1h: %v, want the young done message, the dead and the canceled one kept", st)
	}
	f.run(t, "purge", "-canceled", "-older", "1h").want(t, exitOK).contains(t, "purged 1 canceled message")
	if f.row(t, oldCanceled) != "" {
		t.Error("purge -canceled left the canceled message")
	}
	var ch outboxChange
	f.run(t, "purge", "-done", "-dead", "-older", "0", "-batch", "1", "-json").want(t, exitOK).decode(t, &ch)
	if ch.Action != "purged" || ch.Count != 2 || ch.IDs != nil {
		t.Errorf("purge -done -dead -older 0 -json: %+v, want 2 purged", ch)
	}
	// Never a message not finished.
	if st := f.statuses(t); len(st) != 4 || st["ready"] != 1 || st["retry_wait"] != 1 || st["suspended"] != 1 || st["claimed"] != 2 {
		t.Errorf("after purge -done -dead -older 0: %v, want the 5 messages not finished alone", st)
	}
	for _, id := range []string{ready, waiting, suspended, claimed, ranOut} {
		if f.row(t, id) == "" {
			t.Errorf("purge deleted %s", id)
		}
	}
}

// TestOutboxSchedule: schedule makes scheduled, ready and waiting messages
// fall due at a time (-at) or after a duration (-in): scheduled until then,
// ready when that time has passed; claimed, suspended and finished ones
// are refused.
func TestOutboxSchedule(t *testing.T) {
	f := newOutboxFixture(t, pgstore.DefaultOutboxTable)
	ready := f.add(t, msg{status: "ready"})
	waiting := f.add(t, msg{status: "retry_wait", attempts: 1, due: time.Minute})
	scheduled := f.add(t, msg{status: "scheduled", due: time.Hour})
	claimed := f.add(t, msg{status: "claimed", claimedBy: "relay-a", claimLeft: time.Minute})
	suspended := f.add(t, msg{status: "suspended"})
	dead := f.add(t, msg{status: "dead", finished: time.Minute})
	listener := f.listen(t)

	f.run(t, "schedule", "-in", "1h", ready, claimed).want(t, exitRefused).contains(t, claimed+" is claimed by relay relay-a: schedule acts on scheduled, ready or retry_wait messages only, and a relay is publishing this one", "nothing scheduled")
	f.run(t, "schedule", "-in", "1h", suspended).want(t, exitRefused).contains(t, "resume it first")
	f.run(t, "schedule", "-in", "1h", dead).want(t, exitRefused).contains(t, "requeue it first")
	if got := f.field(t, ready, "status"); got != "ready" {
		t.Fatalf("a refused schedule changed %s to %s", ready, got)
	}

	r := f.run(t, "schedule", "-in", "2h", ready, waiting).want(t, exitOK)
	r.contains(t, "scheduled 2 messages in idempotency_outbox: due in 2h0m; relays notified").lines(t, [][]string{{ready, "scheduled"}, {waiting, "scheduled"}})
	var in2h bool
	if err := f.pool.QueryRow(context.Background(), `SELECT bool_and(due_at BETWEEN clock_timestamp() + interval '119 minutes' AND clock_timestamp() + interval '2 hours')
		FROM idempotency_outbox WHERE status = 'scheduled' AND storage_key || '/' || seq IN ($1, $2)`, ready, waiting).Scan(&in2h); err != nil || !in2h {
		t.Errorf("due_at of the scheduled messages not in 2h: %v", err)
	}
	if n := notified(t, listener, 5*time.Second); n == nil {
		t.Error("no notification after schedule")
	}

	// A time in the past: ready, due since then.
	at := time.Now().Add(-time.Hour).UTC().Truncate(time.Second)
	var ch outboxChange
	f.run(t, "schedule", "-at", at.Format(time.RFC3339), scheduled, "-json").want(t, exitOK).decode(t, &ch)
	if ch.Action != "scheduled" || ch.Count != 1 || fmt.Sprint(ch.States) != "[ready]" {
		t.Errorf("schedule -at an hour ago: %+v, want ready", ch)
	}
	if got := f.field(t, scheduled, "due_at"); !strings.HasPrefix(got, at.Format("2006-01-02 15:04:05")) {
		t.Errorf("due_at %s, want %v", got, at)
	}
}

// TestOutboxCancel: cancel finishes any message not finished, claimed ones
// included (the relay's marks are then refused), with the reason and who
// canceled it in last_error; finished ones are refused.
func TestOutboxCancel(t *testing.T) {
	f := newOutboxFixture(t, pgstore.DefaultOutboxTable)
	var open []string
	for _, m := range []msg{
		{status: "scheduled", due: time.Hour}, {status: "ready"}, {status: "retry_wait", due: time.Minute},
		{status: "suspended"}, {status: "claimed", claimedBy: "relay-a", claimLeft: time.Minute},
	} {
		open = append(open, f.add(t, m))
	}
	done := f.add(t, msg{status: "done", finished: time.Minute})
	dead := f.add(t, msg{status: "dead", finished: time.Minute})

	f.run(t, "cancel", open[0], done).want(t, exitRefused).contains(t, done+" is done: cancel acts on scheduled, ready, claimed, retry_wait or suspended messages only, and this one is finished")
	f.run(t, "cancel", dead).want(t, exitRefused)
	if got := f.field(t, open[0], "status"); got != "scheduled" {
		t.Fatalf("a refused cancel changed %s to %s", open[0], got)
	}

	r := f.run(t, append([]string{"cancel", "-by", "carol", "-reason", "refunded by hand"}, open...)...).want(t, exitOK)
	r.contains(t, "canceled 5 messages in idempotency_outbox: never presented again; relays notified")
	for _, id := range open {
		if st, why, token, fin := f.field(t, id, "status"), f.field(t, id, "last_error"), f.field(t, id, "claim_token"), f.field(t, id, "finished_at"); st != "canceled" ||
			why != "canceled: by carol with idemctl: refunded by hand" || token != "" || fin == "" {
			t.Errorf("%s: %s, %q, token %q, finished %q", id, st, why, token, fin)
		}
	}
	f.run(t, "cancel", open[1]).want(t, exitRefused).contains(t, "is canceled")
}

// TestOutboxSuspendResume: suspend holds messages by ID, topic or ordering
// key (claimed ones lose their claim), counting no attempt; resume makes
// them ready and due now, or scheduled when their due time is later.
func TestOutboxSuspendResume(t *testing.T) {
	f := newOutboxFixture(t, pgstore.DefaultOutboxTable)
	ready := f.add(t, msg{status: "ready", topic: "orders.created", attempts: 2})
	later := f.add(t, msg{status: "retry_wait", topic: "orders.created", attempts: 1, due: time.Hour})
	claimed := f.add(t, msg{status: "claimed", topic: "orders.created", claimedBy: "relay-a", claimLeft: time.Minute})
	other := f.add(t, msg{status: "ready", topic: "payments.settled"})
	keyed := f.add(t, msg{status: "scheduled", topic: "payments.settled", orderingKey: "acct-7", due: -time.Second})
	done := f.add(t, msg{status: "done", topic: "orders.created", finished: time.Minute})
	listener := f.listen(t)

	r := f.run(t, "suspend", "-topic", "orders.created", "-reason", "orders service down", "-by", "dave").want(t, exitOK)
	r.contains(t, "suspended 3 messages of topic orders.created in idempotency_outbox: held until resumed", "  "+ready, "  "+later, "  "+claimed)
	for _, id := range []string{ready, later, claimed} {
		if st, why, token := f.field(t, id, "status"), f.field(t, id, "suspended_reason"), f.field(t, id, "claim_token"); st != "suspended" ||
			why != "orders service down (by dave with idemctl)" || token != "" {
			t.Errorf("%s: %s, %q, token %q", id, st, why, token)
		}
	}
	if got := f.field(t, ready, "attempts"); got != "2" {
		t.Errorf("a suspension counted an attempt: %s", got)
	}
	if got := f.field(t, done, "status"); got != "done" {
		t.Errorf("suspend changed a done message: %s", got)
	}
	f.run(t, "suspend", "-key", "acct-7").want(t, exitOK).contains(t, "suspended 1 message of ordering key acct-7", "  "+keyed)
	f.run(t, "suspend", ready).want(t, exitRefused).contains(t, ready+" is suspended: suspend acts on scheduled, ready, retry_wait or claimed messages only, and this one is suspended")
	f.run(t, "suspend", done).want(t, exitRefused).contains(t, "is done")
	f.run(t, "suspend", other).want(t, exitOK).contains(t, "suspended 1 message in")
	if n := notified(t, listener, 200*time.Millisecond); n != nil {
		t.Errorf("a suspension notified: %+v", n)
	}
	f.run(t).want(t, exitOK).lines(t, [][]string{{"suspended", "5"}, {"3", "orders service down (by dave with idemctl)"}})

	f.run(t, "resume", done).want(t, exitRefused).contains(t, "resume acts on suspended messages only")
	r = f.run(t, "resume", "-topic", "orders.created").want(t, exitOK)
	r.contains(t, "resumed 3 messages of topic orders.created in idempotency_outbox: ready, or scheduled until their due time; relays notified")
	r.lines(t, [][]string{{ready, "ready"}, {later, "scheduled"}, {claimed, "ready"}})
	if why := f.field(t, ready, "suspended_reason"); why != "" {
		t.Errorf("suspended_reason kept after resume: %q", why)
	}
	if n := notified(t, listener, 5*time.Second); n == nil {
		t.Error("no notification after resume")
	}
	var ch outboxChange
	f.run(t, "resume", "-key", "acct-7", "-json").want(t, exitOK).decode(t, &ch)
	if ch.Count != 1 || ch.IDs[0] != keyed || ch.States[0] != lifecycle.Ready {
		t.Errorf("resume -key acct-7: %+v", ch)
	}
	f.run(t, "resume", "-all").want(t, exitOK).contains(t, "resumed 1 message", "  "+other)
	if st := f.statuses(t); st["suspended"] != 0 {
		t.Errorf("after resume -all: %v", st)
	}
}

func TestOutboxSchemaTable(t *testing.T) {
	f := newOutboxFixture(t, "myschema.box")
	why := "publish_failed: \x1b]0;pwned\x07"
	dead := f.add(t, msg{status: "dead", attempts: 2, finished: time.Minute, lastError: &why})
	f.add(t, msg{status: "claimed", claimedBy: "relay\r\x1b[2Kfake", claimLeft: time.Minute})
	f.add(t, msg{status: "ready", topic: "odd\u2028topic", due: -time.Minute})
	f.add(t, msg{status: "suspended", reason: "bad\x1b[2Jreason"})

	r := f.run(t).want(t, exitOK)
	checkShown(t, r.stdout)
	r.contains(t, "table myschema.box: 4 messages", `topic "odd\u2028topic"`, `"bad\x1b[2Jreason"`).lines(t, [][]string{{`"relay\r\x1b[2Kfake"`, "1", "0"}})
	r = f.run(t, "dead").want(t, exitOK)
	checkShown(t, r.stdout)
	r.lines(t, [][]string{{dead, "orders.created", "2"}}).contains(t, `"publish_failed: \x1b]0;pwned\a"`)

	listener := f.listen(t) // on "box"
	f.run(t, "requeue", dead).want(t, exitOK).contains(t, "requeued 1 message in myschema.box")
	if n := notified(t, listener, 5*time.Second); n == nil || n.Channel != "box" {
		t.Errorf("notification after requeue: %+v, want one on box", n)
	}
	if st := f.statuses(t); st["ready"] != 2 || st["dead"] != 0 {
		t.Errorf("after requeue: %v", st)
	}

	// The default table holds none of these.
	idemctl(t, nil, "outbox", "-postgres", f.url, "dead").want(t, exitOK).contains(t, "ID  ")
	idemctl(t, nil, "outbox", "-postgres", f.url, "requeue", dead).want(t, exitNotFound).contains(t, "no message "+dead+" in idempotency_outbox")
	idemctl(t, nil, "outbox", "-postgres", f.url, "-table", "myschema.nope").want(t, exitFailure).contains(t, "does not exist")
}

// TestOutboxRequeueWakesRelay kills a message in a running relay, lists it
// as dead, and requeues it: the relay, which polls once a minute, is woken
// by the requeue's notification and publishes it.
func TestOutboxRequeueWakesRelay(t *testing.T) {
	db := outboxtest.NewDB(t)
	rec := outboxtest.NewRecorder()
	rec.FailWith(func(outbox.Envelope) error { return errors.New("broker down\nretry later") })
	rl := relay.New(db.Pool, rec, relay.WithMaxAttempts(1), relay.WithPollInterval(time.Minute), relay.WithName("relay-1"))
	ctx, cancel := context.WithCancel(context.Background())
	stopped := make(chan error, 1)
	go func() { stopped <- rl.Run(ctx) }()
	defer func() {
		cancel()
		<-stopped
	}()

	ids := db.Enqueue(t, "order-1", outbox.Message{Topic: "orders.created", Payload: []byte(`{"id":1}`)})
	deadline := time.Now().Add(10 * time.Second)
	for {
		if r, _ := db.Row(t, ids[0]); r.Status == lifecycle.Dead {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the message never died: %+v", db.Statuses(t))
		}
		time.Sleep(10 * time.Millisecond)
	}
	run := func(args ...string) result {
		return idemctl(t, nil, append([]string{"outbox", "-postgres", db.URL}, args...)...)
	}
	run().want(t, exitOK).lines(t, [][]string{{"dead", "1"}, {"ready", "0"}})
	r := run("dead").want(t, exitOK)
	r.lines(t, [][]string{{ids[0], "orders.created", "1"}}).contains(t, `"publish_failed: broker down\nretry later"`)
	checkShown(t, r.stdout)

	rec.FailWith(nil)
	run("requeue", ids[0]).want(t, exitOK)
	if err := rec.AwaitIDs(10*time.Second, ids[0]); err != nil {
		t.Fatalf("the requeued message was not published: %v", err)
	}
	deadline = time.Now().Add(10 * time.Second)
	for {
		row, _ := db.Row(t, ids[0])
		if row.Status == lifecycle.Done {
			if row.Attempts != 1 || row.LastError == nil || !strings.Contains(*row.LastError, "broker down") {
				t.Errorf("the published message's row: %+v, want 1 attempt and the last error kept", row)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the message was published but not marked done: %+v", row)
		}
		time.Sleep(10 * time.Millisecond)
	}
	run().want(t, exitOK).lines(t, [][]string{{"done", "1"}, {"dead", "0"}})
}

// TestOutboxShowsRelayRetries: a message a running relay failed to
// publish waits for its retry, jittered backoff and all, and status shows
// it with its error.
func TestOutboxShowsRelayRetries(t *testing.T) {
	db := outboxtest.NewDB(t)
	rec := outboxtest.NewRecorder()
	rec.FailWith(func(e outbox.Envelope) error {
		return fmt.Errorf("natsink: publishing %s to orders.created: nats: no response from stream", e.ID)
	})
	retried := make(chan relay.Event, 1)
	rl := relay.New(db.Pool, rec, relay.WithBackoff(time.Hour, 2*time.Hour), relay.WithObserver(func(_ context.Context, e relay.Event) {
		if e.Kind == relay.EventRetried {
			retried <- e
		}
	}))
	ctx, cancel := context.WithCancel(context.Background())
	stopped := make(chan error, 1)
	go func() { stopped <- rl.Run(ctx) }()
	defer func() {
		cancel()
		<-stopped
	}()
	id := db.Enqueue(t, "order-1", outbox.Message{Topic: "orders.created"})[0]
	var e relay.Event
	select {
	case e = <-retried:
	case <-time.After(10 * time.Second):
		t.Fatal("no retry")
	}
	if e.ID != id || e.Backoff < 30*time.Minute || e.Backoff > time.Hour {
		t.Errorf("retried %+v, want a backoff jittered into [30m, 1h]", e)
	}
	r := idemctl(t, nil, "outbox", "-postgres", db.URL).want(t, exitOK)
	r.lines(t, [][]string{
		{"retry_wait", "1", "0 due again, 1 waiting for their backoff"},
		{"1", "publish_failed: natsink: publishing <id> to orders.created: nats: no response from stream"},
	}).contains(t, "waiting for a retry: 1 message, by last error")
}

// TestOutboxResumeWakesRelay: a message suspended while a relay runs is
// not presented, nor the later message of its ordering key; resumed, the
// relay (polling once a minute) is woken and publishes both, in order.
func TestOutboxResumeWakesRelay(t *testing.T) {
	db := outboxtest.NewDB(t)
	rec := outboxtest.NewRecorder()
	run := func(args ...string) result {
		return idemctl(t, nil, append([]string{"outbox", "-postgres", db.URL}, args...)...)
	}
	// Suspended before any relay runs: enqueued with a schedule, then held.
	ids := db.Enqueue(t, "order-1", outbox.Message{Topic: "orders.created", NotBefore: time.Now().Add(time.Hour)},
		outbox.Message{Topic: "orders.shipped"})
	run("suspend", ids[0]).want(t, exitOK)
	rl := relay.New(db.Pool, rec, relay.WithPollInterval(time.Minute))
	ctx, cancel := context.WithCancel(context.Background())
	stopped := make(chan error, 1)
	go func() { stopped <- rl.Run(ctx) }()
	defer func() {
		cancel()
		<-stopped
	}()
	if err := rec.AwaitIDs(500*time.Millisecond, ids[1]); err == nil {
		t.Fatal("the message after a suspended one of its ordering key was published")
	}
	// Its schedule is an hour away: resumed, it is scheduled still.
	run("resume", ids[0]).want(t, exitOK).lines(t, [][]string{{ids[0], "scheduled"}})
	run("schedule", "-in", "0s", ids[0]).want(t, exitOK).lines(t, [][]string{{ids[0], "ready"}})
	if err := rec.AwaitIDs(10*time.Second, ids...); err != nil {
		t.Fatal(err)
	}
	if d := rec.Deliveries(); d[0].ID != ids[0] || d[1].ID != ids[1] {
		t.Errorf("published %s then %s, want the order of the key", d[0].ID, d[1].ID)
	}
}

// TestOutboxUsage needs no server: the command line is checked first.
func TestOutboxUsage(t *testing.T) {
	const url = "postgres://x@127.0.0.1:1/x"
	id := idempotency.StorageKey("", "k") + "/1"
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"frob"}, `unknown subcommand "frob"`},
		{[]string{id}, "unknown subcommand"},
		{[]string{"status", "extra"}, `unexpected argument "extra"`},
		{[]string{"status", "-limit", "3"}, "-limit is not a flag of outbox status"},
		{[]string{"dead", "-all"}, "-all is not a flag of outbox dead"},
		{[]string{"dead", "-limit", "-1"}, "-limit -1 is negative"},
		{[]string{"requeue"}, "name the messages"},
		{[]string{"requeue", "-older", "1h", id}, "-older is not a flag of outbox requeue"},
		{[]string{"requeue", "-all", id}, "give message IDs or -all, not both"},
		{[]string{"requeue", "-topic", "a", id}, "-topic goes with -all"},
		{[]string{"requeue", "-state", "done", id}, "-state goes with -all"},
		{[]string{"requeue", "-all", "-state", "ready"}, `-state "ready": want dead, done or canceled`},
		{[]string{"requeue", "abc"}, "invalid message ID"},
		{[]string{"requeue", id[:len(id)-1] + "0"}, "does not end in a sequence from 1"},
		{[]string{"purge"}, "name the messages: their IDs (<storage key>/<sequence>), or -done, -dead or -canceled"},
		{[]string{"purge", "-dead"}, "purge -dead needs -older"},
		{[]string{"purge", "-dead", "-done"}, "purge -done -dead needs -older"},
		{[]string{"purge", "-done", "-older", "-1s"}, "-older -1s is negative"},
		{[]string{"purge", "-done", "-older", "1h", "-batch", "0"}, "-batch 0"},
		{[]string{"purge", "-older", "1h", id}, "-older and -batch go with -done, -dead or -canceled"},
		{[]string{"purge", "-all"}, "-all is not a flag of outbox purge"},
		{[]string{"schedule", id}, "give -at TIME or -in DURATION"},
		{[]string{"schedule", "-at", "2026-01-01T00:00:00Z", "-in", "1h", id}, "give -at TIME or -in DURATION"},
		{[]string{"schedule", "-at", "tomorrow", id}, `-at "tomorrow" is not an RFC 3339 time`},
		{[]string{"schedule", "-in", "-1h", id}, "-in -1h0m0s is negative"},
		{[]string{"schedule", "-in", "1h"}, "name the messages: their IDs (<storage key>/<sequence>)"},
		{[]string{"schedule", "-in", "1h", "-topic", "t", id}, "-topic is not a flag of outbox schedule"},
		{[]string{"cancel"}, "name the messages"},
		{[]string{"cancel", "-topic", "t"}, "-topic is not a flag of outbox cancel"},
		{[]string{"suspend"}, "name the messages: their IDs (<storage key>/<sequence>), or -topic or -key"},
		{[]string{"suspend", "-topic", "t", id}, "give message IDs or -topic or -key, not both"},
		{[]string{"suspend", "-all"}, "-all is not a flag of outbox suspend"},
		{[]string{"resume"}, "or -topic, -key or -all"},
		{[]string{"resume", "-all", "-topic", "t"}, "-all resumes every suspended message"},
		{[]string{"resume", "-reason", "x", id}, "-reason is not a flag of outbox resume"},
		{[]string{"-redis", "127.0.0.1:1"}, "flag provided but not defined: -redis"},
		{[]string{"-table", "a.b.c"}, "more than two parts"},
	} {
		r := idemctl(t, nil, append([]string{"outbox", "-postgres", url}, c.args...)...)
		if r.code != exitUsage || !strings.Contains(r.stderr, c.want) {
			t.Errorf("outbox %q: exit status %d, stderr %q; want %d and %q", c.args, r.code, r.stderr, exitUsage, c.want)
		}
	}
	idemctl(t, nil, "outbox").want(t, exitUsage).contains(t, "no database: give -postgres (or set DATABASE_URL)")
	// Redis's environment does not matter to the outbox.
	idemctl(t, map[string]string{"REDIS_URL": "redis://127.0.0.1:1"}, "outbox", "dead").want(t, exitUsage).contains(t, "no database")
	idemctl(t, map[string]string{"DATABASE_URL": url, "REDIS_URL": "redis://127.0.0.1:1"}, "outbox", "-timeout", "2s").
		want(t, exitFailure).contains(t, "connecting to PostgreSQL")
	idemctl(t, nil, "outbox", "purge", "-h").want(t, exitOK).contains(t, "Usage: idemctl outbox", "purge deletes finished messages")
}
