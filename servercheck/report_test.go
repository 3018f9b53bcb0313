package servercheck

import (
	"context"
	"encoding/json"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/go-idempotency/idempotency/internal/redistest"
)

// recorder is a slog.Handler that keeps every record.
type recorder struct {
	mu      sync.Mutex
	records []slog.Record
}

func (h *recorder) Enabled(context.Context, slog.Level) bool { return true }
func (h *recorder) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.records = append(h.records, r.Clone())
	return nil
}
func (h *recorder) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *recorder) WithGroup(string) slog.Handler      { return h }

func (h *recorder) all() []slog.Record {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]slog.Record(nil), h.records...)
}

// byItem returns the records logged per item.
func (h *recorder) byItem() map[string]slog.Record {
	m := map[string]slog.Record{}
	for _, r := range h.all() {
		m[attr(r, "item")] = r
	}
	return m
}

func attr(r slog.Record, key string) string {
	var v string
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == key {
			v = a.Value.String()
			return false
		}
		return true
	})
	return v
}

func TestReportLogsUnsafeSettings(t *testing.T) {
	c, srv := checkServer(t, "--maxmemory-policy", "allkeys-lru", "--maxmemory", "64mb")
	h := &recorder{}
	runRedis(t, c).Log(context.Background(), slog.New(h))

	byItem := h.byItem()
	policy, ok := byItem["maxmemory-policy"]
	if !ok {
		t.Fatalf("no record for maxmemory-policy among %v", h.all())
	}
	if policy.Level != slog.LevelError || attr(policy, "value") != "allkeys-lru" || attr(policy, "node") != srv.Addr() ||
		policy.Message != "servercheck: unsafe server configuration" || !strings.Contains(attr(policy, "detail"), "noeviction") {
		t.Errorf("maxmemory-policy record: %v %q %q", policy.Level, policy.Message, attr(policy, "value"))
	}
	// redistest's servers keep nothing on disk.
	if persistence, ok := byItem["persistence"]; !ok || persistence.Level != slog.LevelWarn {
		t.Errorf("persistence record: %v (present %v)", persistence.Level, ok)
	}
	if _, ok := byItem["version"]; ok {
		t.Error("an OK finding (version) was logged")
	}
	if _, ok := byItem["clock"]; ok {
		t.Error("an INFO finding (clock) was logged")
	}
}

func TestReportQuietWhenSafe(t *testing.T) {
	c, srv := checkServer(t, safeArgs...)
	t.Cleanup(func() { redistest.Do(srv.Addr(), "CONFIG", "SET", "appendonly", "no") })
	h := &recorder{}
	runRedis(t, c).Log(context.Background(), slog.New(h))
	if n := len(h.all()); n != 0 {
		t.Errorf("%d records logged for a safe server: %v", n, h.all())
	}
}

// TestReportLogsReplicatedMaster: a master with a replica and
// min-replicas-to-write 0 is warned about; once the setting is there, with
// two replicas, nothing is.
func TestReportLogsReplicatedMaster(t *testing.T) {
	master := redistest.Start(t, safeArgs...)
	t.Cleanup(func() { redistest.Do(master.Addr(), "CONFIG", "SET", "appendonly", "no") })
	c := clientOn(t, master.Addr())
	redistest.StartReplica(t, master, "--maxmemory", "64mb")
	h := &recorder{}
	runRedis(t, c).Log(context.Background(), slog.New(h))
	r, ok := h.byItem()["replication"]
	if !ok || r.Level != slog.LevelWarn || !strings.Contains(attr(r, "value"), "min-replicas-to-write 0") {
		t.Fatalf("replication record %v (present %v) among %v", r, ok, h.all())
	}

	redistest.StartReplica(t, master, "--maxmemory", "64mb")
	setMinReplicas(t, master, "1", "2")
	h = &recorder{}
	runRedis(t, c).Log(context.Background(), slog.New(h))
	if recs := h.all(); len(recs) != 0 {
		t.Errorf("records for a master with min-replicas-to-write 1 and two replicas: %v", recs)
	}
}

func TestReportLogDefaultLogger(t *testing.T) {
	h := &recorder{}
	defer func(l *slog.Logger) { slog.SetDefault(l) }(slog.Default())
	slog.SetDefault(slog.New(h))
	Report{Findings: []Finding{{Item: "maxmemory-policy", Verdict: Fail, Value: "allkeys-random"}}}.Log(context.Background(), nil)
	if r, ok := h.byItem()["maxmemory-policy"]; !ok || r.Level != slog.LevelError {
		t.Errorf("a nil logger did not log through slog.Default(): %v", h.all())
	}
}

func TestVerdictText(t *testing.T) {
	b, err := json.Marshal(Report{Findings: []Finding{{Item: "x", Verdict: Warn}}})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), `"verdict":"WARN"`) {
		t.Errorf("JSON %s", b)
	}
	var r Report
	if err := json.Unmarshal(b, &r); err != nil || r.Findings[0].Verdict != Warn || r.Worst() != Warn {
		t.Errorf("round trip: %+v, %v", r, err)
	}
	if (Report{}).Worst() != Info {
		t.Error("the worst of no findings is not INFO")
	}
	if _, err := json.Marshal(Verdict(9)); err == nil {
		t.Error("an unknown verdict marshalled")
	}
	if s := Verdict(9).String(); s != "Verdict("+strconv.Itoa(9)+")" {
		t.Errorf("String of an unknown verdict: %q", s)
	}
	var v Verdict
	if err := v.UnmarshalText([]byte("fail")); err != nil || v != Fail {
		t.Errorf("UnmarshalText(fail) = %v, %v", v, err)
	}
	if err := v.UnmarshalText([]byte("bad")); err == nil {
		t.Error("an unknown verdict unmarshalled")
	}
}
