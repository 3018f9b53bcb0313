package idemnats

import (
	"strconv"
	"strings"

	"github.com/nats-io/nats.go/jetstream"
)

// term terms msg, with its reason (the outcome) when the server is known
// to honour one (see WithConn).
func (p *Processor[T]) term(msg jetstream.Msg, out Outcome) error {
	if p.cfg.conn == nil || !honoursTermReason(p.cfg.conn.ConnectedServerVersion()) {
		return msg.Term()
	}
	reason := out.Reason.String()
	if out.LastDelivery {
		reason = "last delivery: " + reason
	}
	return msg.TermWithReason(reason)
}

// termReasonSince is the first nats-server release that honours a term
// with a reason; earlier ones ignore such a term, leaving the message
// unterminated.
var termReasonSince = [3]int{2, 10, 4}

// honoursTermReason reports whether a nats-server of version v (as the
// server announces it: "2.10.4") honours a term with a reason. A version
// it cannot read, or a pre-release of 2.10.4, gets a plain term, which
// every server honours.
func honoursTermReason(v string) bool {
	release, pre, _ := strings.Cut(v, "-")
	parts := strings.Split(release, ".")
	if len(parts) != 3 {
		return false
	}
	var got [3]int
	for i, p := range parts {
		n, err := strconv.Atoi(p)
		if err != nil || n < 0 {
			return false
		}
		got[i] = n
	}
	for i := range got {
		if got[i] != termReasonSince[i] {
			return got[i] > termReasonSince[i]
		}
	}
	return pre == "" // 2.10.4 itself, not one of its pre-releases
}
