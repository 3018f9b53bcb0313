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
	// HeaderBodyOmitted marks a replay whose body was not stored (over the
	// store cap, or not known in full): "Idempotent-Body-Omitted: true".
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
// hop-by-hop headers (and those the Connection header names), Date, trailers
// and, unless setCookie, Set-Cookie. Names are compared, and stored, in
// canonical form whatever form the handler used ("set-cookie" is
// Set-Cookie), since net/http sends a name as it is in the map. The copy
// shares nothing with h.
func storedHeader(h http.Header, setCookie bool) http.Header {
	var named map[string]bool // the names the Connection header lists
	values := 0
	for k, vv := range h {
		values += len(vv)
		if textproto.CanonicalMIMEHeaderKey(k) != "Connection" {
			continue
		}
		for _, v := range vv {
			for _, name := range splitList(v) {
				if named == nil {
					named = map[string]bool{}
				}
				named[textproto.CanonicalMIMEHeaderKey(name)] = true
			}
		}
	}
	var out http.Header
	all := make([]string, 0, values) // one array for every value, as Header.Clone
	for k, vv := range h {
		ck := textproto.CanonicalMIMEHeaderKey(k)
		if hopByHop[ck] || named[ck] || ck == "Date" || (ck == "Set-Cookie" && !setCookie) || isTrailer(k) {
			continue
		}
		if out == nil {
			out = make(http.Header, len(h))
		}
		if prev, ok := out[ck]; ok { // the same name in two forms
			out[ck] = append(prev, vv...)
			continue
		}
		start := len(all)
		all = append(all, vv...)
		out[ck] = all[start:len(all):len(all)]
	}
	return out
}

// isTrailer reports whether k names a trailer by net/http's prefix
// ("Trailer:Name"), in any case.
func isTrailer(k string) bool {
	return len(k) >= len(http.TrailerPrefix) && strings.EqualFold(k[:len(http.TrailerPrefix)], http.TrailerPrefix)
}

// splitList returns the elements of a comma-separated header value, trimmed,
// without empty ones.
func splitList(v string) []string {
	var out []string
	for _, e := range strings.Split(v, ",") {
		if e = strings.TrimSpace(e); e != "" {
			out = append(out, e)
		}
	}
	return out
}
