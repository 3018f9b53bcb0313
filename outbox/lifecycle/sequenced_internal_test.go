package lifecycle

import (
	"strings"
	"testing"
	"time"
)

// TestDecodeSequencedApart reads rows of Messages from the values a driver
// gives: a healthy row as it is; a row whose state no table of this
// package could hold (another producer's table without the CHECK), whose
// times or texts are of another type, with its Err naming the row and
// every column it could not read, the others set; and a row whose id
// cannot be read, which alone fails.
func TestDecodeSequencedApart(t *testing.T) {
	tb, err := New("idempotency_outbox", PostgreSQL)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	row := func(mod func(c []cell)) []cell {
		c := []cell{{int64(7)}, {int64(2)}, {"topic"}, {[]byte("p")}, {`{"k":"v"}`}, {"ok"}, {"done"}, {int64(1)}, {now}, {now}, {nil}}
		if mod != nil {
			mod(c)
		}
		return c
	}
	m, err := tb.decodeSequenced("rec", row(nil))
	if err != nil || m.Err != nil || m.ID != "rec/2" || m.State != Done || m.Headers["k"] != "v" || m.FinishedAt == nil || m.LastError != nil {
		t.Fatalf("healthy row: %+v, %v", m, err)
	}
	m, err = tb.decodeSequenced("rec", row(func(c []cell) { c[6].v, c[9].v, c[10].v = "lost", int64(3), int64(4) }))
	if err != nil || m.Err == nil {
		t.Fatalf("corrupt row: %+v, %v", m, err)
	}
	for _, want := range []string{"row 7:", `column status holds an unknown state "lost"`, "column finished_at is a int64, not time", "column last_error is a int64, not text"} {
		if !strings.Contains(m.Err.Error(), want) {
			t.Errorf("error %q lacks %q", m.Err, want)
		}
	}
	if m.ID != "rec/2" || m.Topic != "topic" || m.Attempts != 1 {
		t.Errorf("the readable columns of a corrupt row: %+v", m)
	}
	if _, err := tb.decodeSequenced("rec", row(func(c []cell) { c[0].v = "x" })); err == nil || !strings.Contains(err.Error(), "column id") {
		t.Errorf("a row without an id: %v, want an error naming column id", err)
	}
}
