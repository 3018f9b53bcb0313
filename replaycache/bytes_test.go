package replaycache_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/replaycache"
)

// byKey is a store whose records are all COMPLETE with a response named
// after their key, and an hour left.
func byKey() *stub {
	return newStub(func(req idempotency.AcquireRequest) (idempotency.Acquisition, error) {
		return idempotency.Acquisition{Outcome: idempotency.Completed, Response: response(req.Key), ExpiresIn: time.Hour}, nil
	})
}

// entrySize returns what the entry of key k0 from byKey counts for.
func entrySize(t *testing.T) int64 {
	t.Helper()
	c := replaycache.New(byKey())
	acquire(t, c, "k0", "d", "fp")
	st := c.Stats()
	if st.Entries != 1 {
		t.Fatalf("Stats = %+v, want one entry", st)
	}
	return st.Bytes
}

func TestMaxBytesEvictsLeastRecentlyUsed(t *testing.T) {
	t.Parallel()
	per := entrySize(t)
	// The key, the fingerprint, the body and the overhead at least.
	if least := int64(replaycache.EntryOverhead + len("k0") + len("fp") + len(`{"id":"k0"}`)); per < least {
		t.Fatalf("an entry counts for %d bytes, less than %d", per, least)
	}
	store := byKey()
	c := replaycache.New(store, replaycache.WithMaxBytes(3*per))
	key := func(i int) string { return fmt.Sprintf("k%d", i) }
	calls := func() int { return len(store.requests()) }
	for i := range 3 {
		acquire(t, c, key(i), "d", "fp")
	}
	if st := c.Stats(); st.Entries != 3 || st.Bytes != 3*per || st.Evictions != 0 {
		t.Fatalf("Stats = %+v after three entries at the bound, want 3 entries, %d bytes", st, 3*per)
	}
	acquire(t, c, key(0), "d", "fp") // k0 is now the most recently used, k1 the least
	acquire(t, c, key(3), "d", "fp")
	if st := c.Stats(); st.Entries != 3 || st.Bytes != 3*per || st.Evictions != 1 {
		t.Fatalf("Stats = %+v after a fourth entry, want 3 entries, 1 eviction", st)
	}
	before := calls()
	for _, i := range []int{0, 2, 3} {
		wantReplay(t, acquire(t, c, key(i), "d", "fp"), response(key(i)))
	}
	if n := calls(); n != before {
		t.Fatalf("store Acquires went from %d to %d for the entries kept", before, n)
	}
	wantReplay(t, acquire(t, c, key(1), "d", "fp"), response(key(1)))
	if n := calls(); n != before+1 {
		t.Fatalf("store Acquires = %d, want %d: the least recently used entry was evicted", n, before+1)
	}
	// k1 came back and took the room of k0, now the least recently used.
	if st := c.Stats(); st.Evictions != 2 || st.Bytes != 3*per {
		t.Fatalf("Stats = %+v, want 2 evictions", st)
	}
}

func TestEntryOverTheBoundIsNotKept(t *testing.T) {
	t.Parallel()
	per := entrySize(t)
	store := byKey()
	c := replaycache.New(store, replaycache.WithMaxBytes(per-1))
	for range 3 {
		wantReplay(t, acquire(t, c, "k0", "d", "fp"), response("k0"))
	}
	if n := len(store.requests()); n != 3 {
		t.Fatalf("store Acquires = %d, want 3: the entry does not fit", n)
	}
	if st := c.Stats(); st.Entries != 0 || st.Bytes != 0 || st.Evictions != 0 {
		t.Fatalf("Stats = %+v, want nothing kept and nothing evicted", st)
	}
}

// TestEndedEntriesMakeRoom: a new entry drops the ended entries at the
// cold end of the list, which are not counted as evictions.
func TestEndedEntriesMakeRoom(t *testing.T) {
	t.Parallel()
	clock := newFakeClock()
	c := replaycache.New(byKey(), replaycache.WithClock(clock.Now), replaycache.WithMaxAge(time.Second))
	acquire(t, c, "k0", "d", "fp")
	acquire(t, c, "k1", "d", "fp")
	clock.Advance(time.Second)
	acquire(t, c, "k2", "d", "fp")
	if st := c.Stats(); st.Entries != 1 || st.Evictions != 0 {
		t.Fatalf("Stats = %+v, want only the new entry, and no eviction", st)
	}
}
