package pgname

import (
	"strings"
	"testing"
)

func TestNames(t *testing.T) {
	long := strings.Repeat("a", 60)
	for _, c := range []struct {
		name, quoted, acquire, index string
	}{
		{"idempotency_records", `"idempotency_records"`, `"idempotency_records_acquire"`, `"idempotency_records_expires_at_idx"`},
		{"billing.idem", `"billing"."idem"`, `"billing"."idem_acquire"`, `"idem_expires_at_idx"`},
		{long, `"` + long + `"`, `"` + long + `_ac"`, `"` + long + `_ex"`},
	} {
		tb, err := ParseTable(c.name)
		if err != nil {
			t.Fatalf("ParseTable(%q): %v", c.name, err)
		}
		if got := tb.String(); got != c.name {
			t.Errorf("String() = %s, want %s", got, c.name)
		}
		if got := tb.Quoted(); got != c.quoted {
			t.Errorf("Quoted(%q) = %s, want %s", c.name, got, c.quoted)
		}
		if got := tb.AcquireFunction(); got != c.acquire {
			t.Errorf("AcquireFunction(%q) = %s, want %s", c.name, got, c.acquire)
		}
		if got := tb.ExpiresAtIndex(); got != c.index {
			t.Errorf("ExpiresAtIndex(%q) = %s, want %s", c.name, got, c.index)
		}
	}
}

func TestParseTableRefuses(t *testing.T) {
	for name, want := range map[string]string{
		"a.b.c":                 "more than two parts",
		"":                      "not an identifier",
		"1bad":                  "not an identifier",
		"bad-name":              "not an identifier",
		"billing.":              "not an identifier",
		`x"y`:                   "not an identifier",
		strings.Repeat("a", 64): "not an identifier",
	} {
		if _, err := ParseTable(name); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("ParseTable(%q) = %v, want an error saying %q", name, err, want)
		}
	}
	if _, err := ParseTable(strings.Repeat("a", MaxLen)); err != nil {
		t.Errorf("a name of %d bytes: %v", MaxLen, err)
	}
}
