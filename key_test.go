package idempotency

import (
	"errors"
	"strings"
	"testing"
)

func TestParseKey(t *testing.T) {
	long := strings.Repeat("k", MaxKeyLen)
	tests := []struct {
		in, want string
		bad      bool
	}{
		{in: "abc", want: "abc"},
		{in: `"abc"`, want: "abc"},
		{in: "  abc\t", want: "abc"},
		{in: `"a\"b\\c"`, want: `a"b\c`},
		{in: `"with space"`, want: "with space"},
		{in: "8e0f9c3a-4f1b-4c5e-9f7a-2b2d1c0e9a11", want: "8e0f9c3a-4f1b-4c5e-9f7a-2b2d1c0e9a11"},
		{in: long, want: long},
		{in: `"` + long + `"`, want: long},
		{in: `"` + strings.Repeat(`\"`, MaxKeyLen) + `"`, want: strings.Repeat(`"`, MaxKeyLen)},
		{in: "", bad: true},
		{in: "   ", bad: true},
		{in: `""`, bad: true},
		{in: long + "k", bad: true},
		{in: `"` + long + `k"`, bad: true},
		{in: "a b", bad: true},
		{in: "a\x00b", bad: true},
		{in: "a\x7fb", bad: true},
		{in: "caf\xc3\xa9", bad: true},
		{in: `"abc`, bad: true},
		{in: `abc"`, bad: true},
		{in: `a"b`, bad: true},
		{in: `"a"b"`, bad: true},
		{in: `"a\b"`, bad: true},
		{in: `"abc\"`, bad: true},
		{in: `"a` + "\t" + `b"`, bad: true},
		{in: `"`, bad: true},
	}
	for _, tt := range tests {
		got, err := ParseKey(tt.in)
		if tt.bad {
			if err == nil {
				t.Errorf("ParseKey(%q) = %q, want an error", tt.in, got)
			} else if !errors.Is(err, ErrInvalidKey) {
				t.Errorf("ParseKey(%q) error %v does not wrap ErrInvalidKey", tt.in, err)
			}
			continue
		}
		if err != nil || got != tt.want {
			t.Errorf("ParseKey(%q) = %q, %v; want %q", tt.in, got, err, tt.want)
		}
	}
}

func TestRequestKeyMultipleLines(t *testing.T) {
	if _, ok, err := requestKey([]string{"a", "b"}); !ok || !errors.Is(err, ErrInvalidKey) {
		t.Fatalf("two header lines: ok=%v err=%v, want an invalid-key error", ok, err)
	}
	if _, ok, err := requestKey(nil); ok || err != nil {
		t.Fatalf("no header: ok=%v err=%v", ok, err)
	}
}

// quoteSF writes key as a Structured Field String.
func quoteSF(key string) string {
	r := strings.NewReplacer(`\`, `\\`, `"`, `\"`)
	return `"` + r.Replace(key) + `"`
}

func FuzzParseKey(f *testing.F) {
	for _, s := range []string{"abc", `"abc"`, `"a\"b"`, "", `"`, "a b", "\x00", strings.Repeat("x", 300), `"\\"`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		key, err := ParseKey(in)
		if err != nil {
			if !errors.Is(err, ErrInvalidKey) {
				t.Fatalf("error %v does not wrap ErrInvalidKey", err)
			}
			return
		}
		if len(key) == 0 || len(key) > MaxKeyLen {
			t.Fatalf("ParseKey(%q) accepted a key of %d bytes", in, len(key))
		}
		for i := 0; i < len(key); i++ {
			if key[i] < 0x20 || key[i] > 0x7e {
				t.Fatalf("ParseKey(%q) accepted byte %#x", in, key[i])
			}
		}
		// The quoted form of an accepted key parses back to the same key.
		again, err := ParseKey(quoteSF(key))
		if err != nil || again != key {
			t.Fatalf("round trip of %q: %q, %v", key, again, err)
		}
	})
}

func TestStorageKey(t *testing.T) {
	a := StorageKey("alice", "k1")
	if len(a) != 64 || strings.Trim(a, "0123456789abcdef") != "" {
		t.Fatalf("StorageKey = %q, want 64 hex digits", a)
	}
	if a != StorageKey("alice", "k1") {
		t.Fatal("StorageKey is not deterministic")
	}
	// Length prefixes keep (scope, key) pairs apart even when their
	// concatenations are equal.
	for _, other := range [][2]string{{"bob", "k1"}, {"alice", "k2"}, {"alicek", "1"}, {"", "alicek1"}} {
		if StorageKey(other[0], other[1]) == a {
			t.Fatalf("StorageKey(%q, %q) collides with (alice, k1)", other[0], other[1])
		}
	}
	long := strings.Repeat("s", 4096)
	if got := StorageKey(long, long); len(got) != 64 {
		t.Fatalf("StorageKey of long input = %d bytes", len(got))
	}
}
