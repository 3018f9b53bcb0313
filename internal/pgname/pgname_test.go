package pgname

import (
	"strings"
	"testing"
)

func TestNames(t *testing.T) {
	long := strings.Repeat("a", 60)
	for _, c := range []struct {
		parts          []string
		acquire, index string
	}{
		{[]string{"idempotency_records"}, `"idempotency_records_acquire"`, `"idempotency_records_expires_at_idx"`},
		{[]string{"billing", "idem"}, `"billing"."idem_acquire"`, `"idem_expires_at_idx"`},
		{[]string{long}, `"` + long + `_ac"`, `"` + long + `_ex"`},
	} {
		if got := AcquireFunction(c.parts); got != c.acquire {
			t.Errorf("AcquireFunction(%q) = %s, want %s", c.parts, got, c.acquire)
		}
		if got := ExpiresAtIndex(c.parts); got != c.index {
			t.Errorf("ExpiresAtIndex(%q) = %s, want %s", c.parts, got, c.index)
		}
	}
}
