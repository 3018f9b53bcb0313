package memstore

import "sync/atomic"

// published is a shard's index of the COMPLETE records that duplicates have
// asked for: an open-addressing hash table that Acquire reads without the
// shard's lock, so that a duplicate writes nothing other cores read and
// replays scale with the cores. Writers hold the shard's lock.
//
// A reader may see the table as it was a moment ago: slots only ever go
// from empty to an entry, from an entry to a tombstone and from a tombstone
// to an entry, and a table that must grow or shrink is copied and replaced
// whole, so a probe always ends at an empty slot and finds an entry that
// was published, or nothing. An entry removed a moment ago belonged to an
// expired record, which the reader's clock check refuses; a miss sends the
// reader to the locked path.
type published struct {
	table atomic.Pointer[pubTable]
	live  int // entries; under the shard's lock
	used  int // entries and tombstones; under the shard's lock
}

// pubTable is padded to 64 bytes, a cache line of its own: at 32 bytes it
// shared a line with other small objects, and when one of them was written
// often, readers on two cores of one hot key ran no faster than on one.
type pubTable struct {
	mask  uint64
	slots []atomic.Pointer[completed]
	_     [32]byte
}

// tombstone fills the slot of a removed entry, so that probes go on past it.
var tombstone = new(completed)

// pubHash is the part of a key's hash that the shard index leaves free.
func pubHash(h uint64) uint64 { return h >> shardBits }

// get returns the entry of key, whose hash is h, or nil.
func (p *published) get(key string, h uint64) *completed {
	t := p.table.Load()
	if t == nil {
		return nil
	}
	for i := pubHash(h) & t.mask; ; i = (i + 1) & t.mask {
		c := t.slots[i].Load()
		if c == nil {
			return nil
		}
		if c.hash == h && c.key == key {
			return c
		}
	}
}

// put adds c, or replaces the entry of the same key.
func (p *published) put(c *completed) {
	t := p.table.Load()
	if t == nil || (p.used+1)*4 > len(t.slots)*3 {
		t = p.resize(p.live + 1)
	}
	free := -1
	for i := pubHash(c.hash) & t.mask; ; i = (i + 1) & t.mask {
		old := t.slots[i].Load()
		switch {
		case old == nil:
			if free < 0 {
				free = int(i)
				p.used++
			}
			t.slots[free].Store(c)
			p.live++
			return
		case old == tombstone:
			if free < 0 {
				free = int(i)
			}
		case old.hash == c.hash && old.key == c.key:
			t.slots[i].Store(c)
			return
		}
	}
}

// remove removes the entry of key, whose hash is h, if there is one.
func (p *published) remove(key string, h uint64) {
	t := p.table.Load()
	if t == nil {
		return
	}
	for i := pubHash(h) & t.mask; ; i = (i + 1) & t.mask {
		c := t.slots[i].Load()
		if c == nil {
			return
		}
		if c.hash == h && c.key == key {
			t.slots[i].Store(tombstone)
			p.live--
			return
		}
	}
}

// shrink drops the table when it holds no entry, and copies it into a
// smaller one when it is mostly empty slots and tombstones.
func (p *published) shrink() {
	t := p.table.Load()
	switch {
	case t == nil:
	case p.live == 0:
		p.table.Store(nil)
		p.used = 0
	case len(t.slots) > 8 && p.live*8 < len(t.slots):
		p.resize(p.live)
	}
}

// resize copies the entries into a new table with room for n, at most half
// full, and makes it the table.
func (p *published) resize(n int) *pubTable {
	size := 8
	for size < 2*n {
		size <<= 1
	}
	nt := &pubTable{mask: uint64(size - 1), slots: make([]atomic.Pointer[completed], size)}
	if t := p.table.Load(); t != nil {
		for i := range t.slots {
			c := t.slots[i].Load()
			if c == nil || c == tombstone {
				continue
			}
			j := pubHash(c.hash) & nt.mask
			for nt.slots[j].Load() != nil {
				j = (j + 1) & nt.mask
			}
			nt.slots[j].Store(c)
		}
	}
	p.used = p.live
	p.table.Store(nt)
	return nt
}

// reset empties the index.
func (p *published) reset() {
	p.table.Store(nil)
	p.live, p.used = 0, 0
}
