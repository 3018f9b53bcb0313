package idempotency

import (
	"net/http"
	"slices"
	"testing"
)

// TestStoredHeaderCanonical: headers are filtered by their canonical names,
// whatever form the handler wrote them in, and stored under those names.
func TestStoredHeaderCanonical(t *testing.T) {
	h := http.Header{
		"set-cookie":         {"sid=secret"},
		"SET-COOKIE":         {"other=secret"},
		"connection":         {"x-hop, Keep-Alive"},
		"x-hop":              {"per-connection"},
		"keep-alive":         {"timeout=5"},
		"transfer-encoding":  {"chunked"},
		"proxy-authenticate": {"Basic"},
		"te":                 {"trailers"},
		"upgrade":            {"h2c"},
		"date":               {"Mon, 30 Nov 2026 00:00:00 GMT"},
		"trailer":            {"X-Sum"},
		"trailer:x-sum":      {"1"},
		"Trailer:X-Other":    {"2"},
		"x-request-id":       {"a"},
		"X-Request-Id":       {"b"},
		"content-type":       {"application/json"},
		"Cache-Control":      {"no-store"},
	}
	got := headerPolicy{}.stored(h, nil)
	want := http.Header{
		"X-Request-Id":  {"a", "b"},
		"Content-Type":  {"application/json"},
		"Cache-Control": {"no-store"},
	}
	if len(got) != len(want) {
		t.Fatalf("stored %v, want %v", got, want)
	}
	for k, v := range want {
		gv := slices.Clone(got[k])
		slices.Sort(gv)
		if !slices.Equal(gv, v) {
			t.Fatalf("stored %s = %q, want %q (all: %v)", k, got[k], v, got)
		}
	}
	// Opting in stores Set-Cookie, in canonical form.
	got = headerPolicy{setCookie: true}.stored(h, nil)
	cookies := slices.Clone(got["Set-Cookie"])
	slices.Sort(cookies)
	if !slices.Equal(cookies, []string{"other=secret", "sid=secret"}) || got["set-cookie"] != nil {
		t.Fatalf("with Set-Cookie stored: %v", got)
	}
	// The copy shares nothing with the handler's map.
	got["X-Request-Id"][0] = "changed"
	if h["x-request-id"][0] != "a" || h["X-Request-Id"][0] != "b" {
		t.Fatal("the stored header shares values with the handler's")
	}
	if (headerPolicy{}).stored(http.Header{"Date": {"x"}}, nil) != nil {
		t.Fatal("nothing to store: want nil")
	}
}

// TestStoredHeaderBeforeAndOnly: a header that was set before the
// middleware ran, and that the handler left as it was, is not stored; one
// the handler changed is; WithStoredHeaders' list keeps only its names.
func TestStoredHeaderBeforeAndOnly(t *testing.T) {
	before := snapshotHeader(http.Header{
		"x-request-id":                {"req-1"},
		"Access-Control-Allow-Origin": {"https://a.example"},
		"Content-Type":                {"text/plain"},
	})
	if got := before["X-Request-Id"]; len(got) != 1 || got[0] != "req-1" {
		t.Fatalf("snapshot not canonical: %v", before)
	}
	h := http.Header{
		"X-Request-Id":                {"req-1"},
		"Access-Control-Allow-Origin": {"https://a.example"},
		"Content-Type":                {"application/json"}, // changed by the handler
		"Location":                    {"/payments/1"},
	}
	got := headerPolicy{}.stored(h, before)
	if len(got) != 2 || got.Get("Content-Type") != "application/json" || got.Get("Location") != "/payments/1" {
		t.Fatalf("stored %v, want the handler's Content-Type and Location", got)
	}
	only := headerPolicy{only: map[string]bool{"Location": true}}
	if got := only.stored(h, before); len(got) != 1 || got.Get("Location") == "" {
		t.Fatalf("with only Location: stored %v", got)
	}
	// The snapshot is a copy: the handler changing a value in place does
	// not change it.
	src := http.Header{"X-A": {"1"}}
	snap := snapshotHeader(src)
	src["X-A"][0] = "2"
	if snap.Get("X-A") != "1" {
		t.Fatal("the snapshot shares values with the header it copies")
	}
	if snapshotHeader(http.Header{}) != nil {
		t.Fatal("snapshot of an empty header: want nil")
	}
}

// TestHeaderSize counts every value with its name.
func TestHeaderSize(t *testing.T) {
	h := http.Header{"Abc": {"12", "3456"}, "X": {""}}
	if got, want := headerSize(h), 3+2+3+4+1; got != want {
		t.Fatalf("headerSize = %d, want %d", got, want)
	}
}
