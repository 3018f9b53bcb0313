package idempotency

import (
	"net/http"
	"net/textproto"
	"strings"
)

// Response headers set on replays.
const (
	// HeaderReplayed marks a replayed response: "Idempotent-Replayed: true".
	HeaderReplayed = "Idempotent-Replayed"
	// HeaderBodyOmitted marks a replay whose body was over the store cap and
	// was not stored: "Idempotent-Body-Omitted: true".
	HeaderBodyOmitted = "Idempotent-Body-Omitted"
)

// hopByHop lists the headers that belong to one connection (RFC 9110 §7.6.1)
// and are never stored.
var hopByHop = map[string]bool{
	"Connection":          true,
	"Keep-Alive":          true,
	"Proxy-Authenticate":  true,
	"Proxy-Authorization": true,
	"Proxy-Connection":    true,
	"Te":                  true,
	"Trailer":             true,
	"Transfer-Encoding":   true,
	"Upgrade":             true,
}

// storedHeader copies the response headers that a replay may send: all but
// hop-by-hop headers (and those the Connection header names), Date, trailer
// declarations and, unless setCookie, Set-Cookie.
func storedHeader(h http.Header, setCookie bool) http.Header {
	out := h.Clone()
	if out == nil {
		return nil
	}
	for k := range out {
		if hopByHop[k] || k == "Date" || (k == "Set-Cookie" && !setCookie) ||
			strings.HasPrefix(k, http.TrailerPrefix) {
			delete(out, k)
		}
	}
	for _, v := range h["Connection"] {
		for _, name := range strings.Split(v, ",") {
			if name = strings.TrimSpace(name); name != "" {
				delete(out, textproto.CanonicalMIMEHeaderKey(name))
			}
		}
	}
	if len(out) == 0 {
		return nil
	}
	return out
}
