package storetest

import (
	"net/http"
	"testing"

	"github.com/go-idempotency/idempotency"
)

var completeCases = []testCase{
	{"Replay", func(t *testing.T, h *harness) {
		key, owner := newKey(), newToken()
		h.acquireWant(req(key, owner, "fp", longLease, longTTL), idempotency.Acquired, 1)
		want := &idempotency.Response{
			Status: http.StatusCreated,
			Header: http.Header{
				"Content-Type": {"application/json"},
				"Link":         {"</a>; rel=next", "</z>; rel=last", "</m>; rel=first"},
				"X-Empty":      {""},
			},
			Body: []byte(`{"id":"pay_1","amount":100}`),
		}
		h.complete(key, owner, cloneResponse(want), longTTL)
		h.wantReplay(key, "fp", want)
		// Every duplicate replays the same payload, not only the first.
		h.wantReplay(key, "fp", want)
	}},
	{"HolderReacquires", func(t *testing.T, h *harness) {
		key, owner := newKey(), newToken()
		r := req(key, owner, "fp", longLease, longTTL)
		h.acquireWant(r, idempotency.Acquired, 1)
		h.complete(key, owner, sampleResponse("a"), longTTL)
		a := h.acquireWant(r, idempotency.Completed, 0)
		if d := diffResponse(a.Response, sampleResponse("a")); d != "" {
			t.Fatal(d)
		}
	}},
	{"Mismatch", func(t *testing.T, h *harness) {
		key, owner := newKey(), newToken()
		h.acquireWant(req(key, owner, "fp-1", longLease, longTTL), idempotency.Acquired, 1)
		h.complete(key, owner, sampleResponse("a"), longTTL)
		h.acquireWant(req(key, newToken(), "fp-2", longLease, longTTL), idempotency.Mismatch, 0)
		h.acquireWant(req(key, newToken(), "fp-2", longLease, longTTL), idempotency.Mismatch, 0)
		// The record is untouched: a corrected retry still replays.
		h.wantReplay(key, "fp-1", sampleResponse("a"))
	}},
	{"Retry", func(t *testing.T, h *harness) {
		key, owner := newKey(), newToken()
		h.acquireWant(req(key, owner, "fp", longLease, longTTL), idempotency.Acquired, 1)
		want := sampleResponse("a")
		h.complete(key, owner, cloneResponse(want), longTTL)
		h.complete(key, owner, cloneResponse(want), longTTL)
		h.wantReplay(key, "fp", want)
		h.complete(key, owner, cloneResponse(want), longTTL)
		h.wantReplay(key, "fp", want)
	}},
	{"Absent", func(t *testing.T, h *harness) {
		key := newKey()
		h.wantLeaseLost("Complete on an absent key", h.s.Complete(h.ctx(), key, newToken(), sampleResponse("x"), longTTL))
		// Nothing was created.
		h.acquireWant(req(key, newToken(), "fp", longLease, longTTL), idempotency.Acquired, 1)
	}},
	{"OtherToken", func(t *testing.T, h *harness) {
		key, owner := newKey(), newToken()
		h.acquireWant(req(key, owner, "fp", longLease, longTTL), idempotency.Acquired, 1)
		h.wantLeaseLost("Complete by a token that never held the lease",
			h.s.Complete(h.ctx(), key, newToken(), sampleResponse("intruder"), longTTL))
		h.acquireWant(req(key, newToken(), "fp", longLease, longTTL), idempotency.InFlight, 1)
		h.complete(key, owner, sampleResponse("owner"), longTTL)
		h.wantReplay(key, "fp", sampleResponse("owner"))
	}},
	{"OtherTokenAfterComplete", func(t *testing.T, h *harness) {
		key, owner := newKey(), newToken()
		h.acquireWant(req(key, owner, "fp", longLease, longTTL), idempotency.Acquired, 1)
		h.complete(key, owner, sampleResponse("owner"), longTTL)
		h.wantLeaseLost("Complete of a COMPLETE record by another token",
			h.s.Complete(h.ctx(), key, newToken(), sampleResponse("intruder"), longTTL))
		h.wantReplay(key, "fp", sampleResponse("owner"))
	}},
}

// payloadCases round-trip unusual responses through Complete and a replay.
var payloadCases = func() []testCase {
	binary := make([]byte, 256)
	for i := range binary {
		binary[i] = byte(i)
	}
	big := make([]byte, 1<<20)
	for i := range big {
		big[i] = byte(i*7 + i>>8)
	}
	payloads := []struct {
		name string
		resp *idempotency.Response
	}{
		{"EmptyBody", &idempotency.Response{Status: http.StatusNoContent, Header: http.Header{}, Body: []byte{}}},
		{"NilHeaderNilBody", &idempotency.Response{Status: http.StatusAccepted}},
		{"BinaryBody", &idempotency.Response{
			Status: http.StatusOK,
			Header: http.Header{"Content-Type": {"application/octet-stream"}},
			Body:   binary,
		}},
		{"OneMiBBody", &idempotency.Response{
			Status: http.StatusOK,
			Header: http.Header{"Content-Type": {"application/octet-stream"}},
			Body:   big,
		}},
		{"BodyOmitted", &idempotency.Response{
			Status:      http.StatusOK,
			Header:      http.Header{"Content-Type": {"text/csv"}, "X-Multi": {"2", "1"}},
			BodyOmitted: true,
		}},
		{"HeaderOmitted", &idempotency.Response{
			Status:        http.StatusCreated,
			BodyOmitted:   true,
			HeaderOmitted: true,
		}},
		{"ClientError", &idempotency.Response{
			Status: http.StatusUnprocessableEntity,
			Header: http.Header{"Content-Type": {"application/problem+json"}},
			Body:   []byte(`{"title":"card declined"}`),
		}},
		{"ManyHeaders", func() *idempotency.Response {
			h := http.Header{}
			for i := range 50 {
				h.Add("X-H"+string(rune('a'+i%26))+string(rune('a'+i/26)), string(rune('0'+i%10)))
			}
			h["X-Values"] = []string{"z", "y", "x", "y", "z"}
			return &idempotency.Response{Status: http.StatusOK, Header: h, Body: []byte("ok")}
		}()},
	}
	var cases []testCase
	for _, p := range payloads {
		cases = append(cases, testCase{p.name, func(t *testing.T, h *harness) {
			key, owner := newKey(), newToken()
			h.acquireWant(req(key, owner, "fp", longLease, longTTL), idempotency.Acquired, 1)
			h.complete(key, owner, cloneResponse(p.resp), longTTL)
			h.wantReplay(key, "fp", p.resp)
		}})
	}
	return cases
}()
