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
	got := storedHeader(h, false)
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
	got = storedHeader(h, true)
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
	if storedHeader(http.Header{"Date": {"x"}}, false) != nil {
		t.Fatal("nothing to store: want nil")
	}
}
