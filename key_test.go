package idempotency

import (
	"encoding/hex"
	"errors"
	"net/http"
	"net/http/httptest"
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
	// Records written by any version are found by every later one: the
	// hash of "idempotency/v1/storage-key\x00" || len || scope || len || key
	// (8-byte big-endian lengths) never changes.
	if want := "485b591520b3540228cc1122d54554b8870df89cb5665fb6ef51270e19773462"; a != want {
		t.Errorf("StorageKey(alice, k1) = %s, want %s as in every earlier version", a, want)
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

// TestDefaultFingerprint pins the fingerprint's input and value: a record
// completed by an earlier version is replayed, not answered 422, by a later
// one.
func TestDefaultFingerprint(t *testing.T) {
	r := httptest.NewRequest(http.MethodPost, "/payments/a%20b?x=1", nil)
	got := hex.EncodeToString([]byte(DefaultFingerprint(r, []byte("hello"))))
	// SHA-256 of len || "POST" || len || "/payments/a%20b" || len || "x=1" ||
	// len || "hello", with 8-byte big-endian lengths.
	if want := "2d738954a4d52b02543ec1ce3a6629dfd994ab9512d40bfaec865eafecc2164f"; got != want {
		t.Errorf("DefaultFingerprint = %s, want %s", got, want)
	}
	for _, other := range []*http.Request{
		httptest.NewRequest(http.MethodPatch, "/payments/a%20b?x=1", nil),
		httptest.NewRequest(http.MethodPost, "/payments/a%20b?x=2", nil),
		httptest.NewRequest(http.MethodPost, "/payments/a%20c?x=1", nil),
	} {
		if DefaultFingerprint(other, []byte("hello")) == DefaultFingerprint(r, []byte("hello")) {
			t.Errorf("%s %s has the fingerprint of POST %s", other.Method, other.URL, r.URL)
		}
	}
	if DefaultFingerprint(r, []byte("hellp")) == DefaultFingerprint(r, []byte("hello")) {
		t.Error("another body has the same fingerprint")
	}
}
