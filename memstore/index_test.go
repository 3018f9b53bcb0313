package memstore

import (
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
)

func entry(key string, h uint64) *completed {
	return &completed{key: key, hash: h, fingerprint: "fp-" + key}
}

// TestPublishedCollisions puts keys whose hashes all pick the same slot, so
// that every operation walks one probe chain through tombstones.
func TestPublishedCollisions(t *testing.T) {
	var p published
	const n = 50
	h := func(i int) uint64 { return uint64(i)<<60 | 7<<shardBits } // same slot, different hashes
	for i := range n {
		p.put(entry(fmt.Sprint("k", i), h(i)))
	}
	if p.live != n {
		t.Fatalf("live = %d, want %d", p.live, n)
	}
	for i := range n {
		k := fmt.Sprint("k", i)
		if c := p.get(k, h(i)); c == nil || c.key != k {
			t.Fatalf("get(%s) = %+v", k, c)
		}
	}
	// Same hash, another key: not found.
	if c := p.get("other", h(3)); c != nil {
		t.Fatalf("get of an absent key with a present hash = %+v", c)
	}
	for i := 0; i < n; i += 2 {
		p.remove(fmt.Sprint("k", i), h(i))
	}
	for i := range n {
		k := fmt.Sprint("k", i)
		if c := p.get(k, h(i)); (c != nil) != (i%2 == 1) {
			t.Fatalf("after removing the even keys, get(%s) = %+v", k, c)
		}
	}
	// Putting again reuses tombstones and finds no duplicate.
	used := p.used
	p.put(entry("k0", h(0)))
	if p.used != used || p.live != n/2+1 {
		t.Fatalf("re-put: used %d -> %d, live %d", used, p.used, p.live)
	}
	p.put(entry("k1", h(1))) // replaces
	if p.live != n/2+1 {
		t.Fatalf("replacing put changed live to %d", p.live)
	}
	if c := p.get("k1", h(1)); c == nil || c.fingerprint != "fp-k1" {
		t.Fatalf("get(k1) after replace = %+v", c)
	}
}

// TestPublishedGrowAndShrink fills the index far past its first table and
// empties it again: every key stays findable, and the table goes away.
func TestPublishedGrowAndShrink(t *testing.T) {
	var p published
	const n = 10000
	h := func(i int) uint64 { return uint64(i) * 0x9e3779b97f4a7c15 }
	for i := range n {
		p.put(entry(fmt.Sprint(i), h(i)))
	}
	tb := p.table.Load()
	if len(tb.slots) < n*4/3 {
		t.Fatalf("%d slots for %d entries", len(tb.slots), n)
	}
	for i := range n {
		if p.get(fmt.Sprint(i), h(i)) == nil {
			t.Fatalf("key %d lost", i)
		}
	}
	for i := range n - 10 {
		p.remove(fmt.Sprint(i), h(i))
	}
	p.shrink()
	if got := len(p.table.Load().slots); got > 64 {
		t.Fatalf("%d slots left for 10 entries", got)
	}
	for i := n - 10; i < n; i++ {
		if p.get(fmt.Sprint(i), h(i)) == nil {
			t.Fatalf("key %d lost by shrink", i)
		}
	}
	for i := n - 10; i < n; i++ {
		p.remove(fmt.Sprint(i), h(i))
	}
	p.shrink()
	if p.table.Load() != nil || p.live != 0 || p.used != 0 {
		t.Fatalf("empty index keeps a table: live %d used %d", p.live, p.used)
	}
}

// TestPublishedConcurrentReaders reads while a writer puts, removes, grows
// and shrinks under a lock: a reader finds only entries of the key it asked
// for, and always finds the keys that are never removed.
func TestPublishedConcurrentReaders(t *testing.T) {
	var p published
	var mu sync.Mutex
	h := func(i int) uint64 { return uint64(i%97) << shardBits } // long probe chains
	const stable, churn = 20, 500
	for i := range stable {
		p.put(entry(fmt.Sprint("stable", i), h(i)))
	}
	var stop atomic.Bool
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for r := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for n := 0; !stop.Load(); n++ {
				i := (n + r) % stable
				k := fmt.Sprint("stable", i)
				if c := p.get(k, h(i)); c == nil || c.key != k {
					errs <- fmt.Errorf("get(%s) = %+v", k, c)
					return
				}
				j := n % churn
				if c := p.get(fmt.Sprint("churn", j), h(j)); c != nil && c.key != fmt.Sprint("churn", j) {
					errs <- fmt.Errorf("get(churn%d) returned %s", j, c.key)
					return
				}
			}
		}()
	}
	for round := range 8 {
		for i := range churn {
			mu.Lock()
			if round%2 == 0 {
				p.put(entry(fmt.Sprint("churn", i), h(i)))
			} else {
				p.remove(fmt.Sprint("churn", i), h(i))
			}
			mu.Unlock()
		}
		mu.Lock()
		p.shrink()
		mu.Unlock()
	}
	stop.Store(true)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if p.live != stable {
		t.Fatalf("live = %d, want %d", p.live, stable)
	}
}
