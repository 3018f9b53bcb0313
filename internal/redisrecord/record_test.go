package redisrecord

import (
	"net/http"
	"strings"
	"testing"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/internal/wire"
)

func TestParseHead(t *testing.T) {
	hd, err := ParseHead("P2:ab17:1796120945665:\x00fp:")
	if err != nil || hd != (Head{Watched, "ab", 17, 1796120945665, "\x00fp:"}) {
		t.Fatalf("ParseHead = %+v, %v", hd, err)
	}
	if !hd.InProgress() || hd.String() != "P2:ab17:1796120945665:\x00fp:" {
		t.Errorf("InProgress %v, String %q", hd.InProgress(), hd.String())
	}
	if hd, err := ParseHead("c1:t999999999999999:999999999999999:"); err != nil || hd.InProgress() || hd.Epoch != MaxEpoch || hd.LeaseEnd != MaxEpoch {
		t.Errorf("the largest numbers: %+v, %v", hd, err)
	}
	for h, want := range map[string]string{
		"":                          "malformed state or token length",
		"x2:ab1:5:f":                "malformed state or token length",
		"p0:1:5:f":                  "malformed state or token length",
		"p01:a1:5:f":                "malformed state or token length",
		"p1234567890:a1:5:f":        "malformed state or token length",
		"p2:a":                      "malformed epoch or lease end",
		"p2:ab01:5:f":               "malformed epoch or lease end",
		"p2:ab1:0:f":                "malformed epoch or lease end",
		"p2:ab1:05:f":               "malformed epoch or lease end",
		"p2:ab1:x:f":                "malformed epoch or lease end",
		"p2:ab1:5":                  "malformed epoch or lease end",
		"p2:ab1000000000000000:5:f": "malformed epoch or lease end",
		"p2:ab1:1e3:f":              "malformed epoch or lease end",
	} {
		if _, err := ParseHead(h); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("ParseHead(%q) = %v, want %q", h, err, want)
		}
	}
}

func TestPayload(t *testing.T) {
	resp := &idempotency.Response{Status: http.StatusCreated, Header: http.Header{"Location": {"/x"}}, Body: []byte("body")}
	p, err := AppendPayload(nil, resp)
	if err != nil {
		t.Fatal(err)
	}
	meta, body, err := SplitPayload(string(p))
	if err != nil || body != "body" {
		t.Fatalf("SplitPayload = %q, %q, %v", meta, body, err)
	}
	got, err := wire.Decode(meta, body)
	if err != nil || got.Status != resp.Status || got.Header.Get("Location") != "/x" || string(got.Body) != "body" {
		t.Errorf("decoded %+v, %v", got, err)
	}

	// A marked response stores no body.
	p, err = AppendPayload(nil, &idempotency.Response{Status: 200, Body: []byte("dropped"), BodyOmitted: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, body, err := SplitPayload(string(p)); err != nil || body != "" {
		t.Errorf("an omitted body stored as %q, %v", body, err)
	}

	// The meta block's bounds from the first bytes of a large payload.
	big := string(p) + strings.Repeat("x", 1000)
	if start, end, err := MetaBounds(big[:12], len(big)); err != nil || start != 1 || big[start:end] != string(p[1:]) {
		t.Errorf("MetaBounds of a prefix = %d, %d, %v", start, end, err)
	}

	for _, bad := range []string{"", "\x7f", "\x05abc", "\xff\xff\xff", strings.Repeat("\xff", 10) + "\x01"} {
		if _, _, err := SplitPayload(bad); err == nil || err.Error() != "payload: malformed meta length" {
			t.Errorf("SplitPayload(%q) = %v", bad, err)
		}
	}
}

func TestNames(t *testing.T) {
	if got := TokenTag("abc"); got != "3:abc" {
		t.Errorf("TokenTag = %q", got)
	}
	if got := PayloadField("fp"); got != "cfp" {
		t.Errorf("PayloadField = %q", got)
	}
	if got := Channel("idempotency:k"); got != "idempotency:k:changed" {
		t.Errorf("Channel = %q", got)
	}
}
