package idemgrpc

import (
	"strings"
	"testing"

	"google.golang.org/grpc/codes"

	"github.com/go-idempotency/idempotency"
)

// TestOutcomeReplies: the translation table has a row for every outcome
// the core reports, and each row agrees with the outcome's class: a call
// that is over gets the handler's answer or the replay; one to retry gets
// the handler's released error, its context's status, or an answer that
// asks for the retry; one that will never succeed gets an answer that does
// not ask for one, or the handler's own error that refused it for good.
func TestOutcomeReplies(t *testing.T) {
	for _, o := range idempotency.Outcomes() {
		r, ok := outcomeReplies[o]
		if !ok {
			t.Errorf("%v has no row in outcomeReplies", o)
			continue
		}
		if r.send == sendHandler && !o.Ran() {
			t.Errorf("%v: the handler's answer, but the handler did not run", o)
		}
		switch o.Class() {
		case idempotency.ClassDone:
			if r.send != sendHandler && r.send != sendReplay {
				t.Errorf("%v is done, but its caller gets neither the handler's answer nor the replay: %+v", o, r)
			}
		case idempotency.ClassRetry:
			asks := r.send == sendAnswer && r.retry && (r.answer.code == codes.Unavailable || r.answer.code == codes.ResourceExhausted)
			if !asks && r.send != sendHandler && r.send != sendContext {
				t.Errorf("%v is to be retried, but its caller is not asked to: %+v", o, r)
			}
		case idempotency.ClassPermanent:
			// The handler's own error, when it refused the call for good
			// (Refused), says so itself.
			if r.send == sendHandler && o.Ran() {
				break
			}
			if (r.send != sendAnswer && r.send != sendKeyInvalid) || r.retry || r.answer.code == codes.Unavailable {
				t.Errorf("%v will never succeed, but its caller is not told so: %+v", o, r)
			}
		default:
			t.Errorf("%v has no class", o)
		}
		if r.send == sendAnswer && (r.answer.reason == "" || !strings.HasPrefix(r.answer.msg, "idemgrpc: ")) {
			t.Errorf("%v: answer %+v has no reason or message", o, r.answer)
		}
	}
	if len(outcomeReplies) != len(idempotency.Outcomes()) {
		t.Errorf("outcomeReplies has %d rows for %d outcomes", len(outcomeReplies), len(idempotency.Outcomes()))
	}
}

// TestHTTPStatuses: the record's status maps the 17 codes injectively onto
// 200..599, Google's canonical mapping where it is injective, so that the
// code survives a record kept as its status alone.
func TestHTTPStatuses(t *testing.T) {
	canonical := map[codes.Code]int{codes.OK: 200, codes.Canceled: 499, codes.InvalidArgument: 400,
		codes.DeadlineExceeded: 504, codes.NotFound: 404, codes.AlreadyExists: 409, codes.PermissionDenied: 403,
		codes.ResourceExhausted: 429, codes.Unimplemented: 501, codes.Internal: 500, codes.Unavailable: 503,
		codes.Unauthenticated: 401}
	seen := map[int]codes.Code{}
	for c := codes.OK; c <= codes.Unauthenticated; c++ {
		s := httpStatus(c)
		if s < 200 || s > 599 {
			t.Errorf("%v -> %d, outside 200..599", c, s)
		}
		if other, dup := seen[s]; dup {
			t.Errorf("%v and %v both -> %d", other, c, s)
		}
		seen[s] = c
		if back, ok := codeOf(s); !ok || back != c {
			t.Errorf("%v -> %d -> %v, %v", c, s, back, ok)
		}
		if want, ok := canonical[c]; ok && s != want {
			t.Errorf("%v -> %d, want the canonical %d", c, s, want)
		}
	}
	if len(seen) != 17 {
		t.Errorf("%d codes mapped, want 17", len(seen))
	}
	if s := httpStatus(codes.Code(42)); s != httpStatus(codes.Unknown) {
		t.Errorf("code 42 -> %d, want Unknown's %d", s, httpStatus(codes.Unknown))
	}
}

// TestMessageHeader: Grpc-Message keeps a message's bytes, invalid UTF-8
// and '%' included, and at most maxHeaderMessage of them, not cutting a
// character in two.
func TestMessageHeader(t *testing.T) {
	for _, msg := range []string{"", "card declined", "100% sure", "caf\xc3", "carte refusée", "\x00\r\n\xff%zz", "%4"} {
		enc := encodeMessage(msg)
		if got := decodeMessage(enc); got != msg {
			t.Errorf("%q -> %q -> %q", msg, enc, got)
		}
		for i := range len(enc) {
			if c := enc[i]; c < ' ' || c > '~' {
				t.Errorf("%q encoded as %q, with a byte outside printable ASCII", msg, enc)
			}
		}
	}
	long := strings.Repeat("é", maxHeaderMessage) // 2 bytes each
	if cut := cutMessage(long, maxHeaderMessage); cut != strings.Repeat("é", maxHeaderMessage/2) {
		t.Errorf("cut to %d bytes", len(cut))
	}
	if cut := cutMessage("a"+long, maxHeaderMessage); cut != "a"+strings.Repeat("é", maxHeaderMessage/2-1) {
		t.Errorf("cut to %d bytes, through a character", len(cut))
	}
	o := &outcome{status: statusOf(errorString(strings.Repeat("x", 3*maxHeaderMessage))).Proto()}
	if r := o.record(); len(decodeMessage(r.Header.Get(headerMessage))) != maxHeaderMessage || r.BodyOmitted {
		t.Errorf("header message of %d bytes, body omitted %v", len(r.Header.Get(headerMessage)), r.BodyOmitted)
	}
}

type errorString string

func (e errorString) Error() string { return string(e) }

// TestReadRecord: what a record's headers say must agree with its status
// and its body, or the record is unreadable.
func TestReadRecord(t *testing.T) {
	o := &outcome{status: statusOf(errorString("x")).Proto()}
	good := o.record()
	for name, r := range map[string]*idempotency.Response{
		"status and header disagree": {Status: 412, Header: good.Header, Body: good.Body},
		"body and header disagree":   {Status: 412, Header: map[string][]string{headerStatus: {"9"}}, Body: good.Body},
		"no code anywhere":           {Status: 200, Header: map[string][]string{"Content-Type": {"application/json"}}, Body: good.Body},
		"status of no code":          {Status: 299, HeaderOmitted: true, BodyOmitted: true},
		"body unreadable":            {Status: good.Status, Header: good.Header, Body: []byte{0xff}},
	} {
		if _, err := readRecord(r); err == nil {
			t.Errorf("%s: read without an error", name)
		}
	}
	if got, err := readRecord(good); err != nil || got.status.GetCode() != int32(codes.Unknown) || got.status.GetMessage() != "x" {
		t.Errorf("readRecord(good) = %v, %v", got, err)
	}
}
