package load

import (
	"fmt"
	"strconv"
	"strings"
)

// Kind is the kind of a request the driver sends.
type Kind uint8

const (
	// New is a request with a fresh key: a first execution.
	New Kind = iota
	// Dup repeats the key of a request that completed: a replay.
	Dup
	// ConcDup sends two requests with one fresh key at the same time: one
	// runs the handler, the other gets 409 (or a replay when it arrives
	// after the first completed).
	ConcDup
	kinds
)

var kindNames = [kinds]string{"new", "dup", "concdup"}

// String returns the kind's name as the -mix flag spells it.
func (k Kind) String() string {
	if k < kinds {
		return kindNames[k]
	}
	return "kind(" + strconv.Itoa(int(k)) + ")"
}

// Mix holds the relative weights of the request kinds.
type Mix [kinds]int

// ParseMix parses a mix such as "new=70,dup=20,concdup=10". Weights are
// non-negative integers, at least one positive; kinds not named weigh 0.
func ParseMix(s string) (Mix, error) {
	var m Mix
	seen := [kinds]bool{}
	for _, part := range strings.Split(s, ",") {
		name, val, ok := strings.Cut(strings.TrimSpace(part), "=")
		if !ok {
			return Mix{}, fmt.Errorf("load: mix %q: %q is not name=weight", s, part)
		}
		k := Kind(0)
		for k < kinds && kindNames[k] != name {
			k++
		}
		if k == kinds {
			return Mix{}, fmt.Errorf("load: mix %q: unknown kind %q (want new, dup or concdup)", s, name)
		}
		if seen[k] {
			return Mix{}, fmt.Errorf("load: mix %q: %s given twice", s, name)
		}
		seen[k] = true
		w, err := strconv.Atoi(val)
		if err != nil || w < 0 || w > 1_000_000 {
			return Mix{}, fmt.Errorf("load: mix %q: weight %q of %s is not an integer in 0..1000000", s, val, name)
		}
		m[k] = w
	}
	if m.total() == 0 {
		return Mix{}, fmt.Errorf("load: mix %q: every weight is 0", s)
	}
	return m, nil
}

func (m Mix) total() int {
	t := 0
	for _, w := range m {
		t += w
	}
	return t
}

// pick maps n in [0, total) to a kind.
func (m Mix) pick(n int) Kind {
	for k, w := range m {
		if n < w {
			return Kind(k)
		}
		n -= w
	}
	return New
}

// String returns the mix as ParseMix reads it.
func (m Mix) String() string {
	parts := make([]string, 0, kinds)
	for k, w := range m {
		if w > 0 {
			parts = append(parts, kindNames[k]+"="+strconv.Itoa(w))
		}
	}
	return strings.Join(parts, ",")
}
