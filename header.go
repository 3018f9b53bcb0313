package idempotency

import (
	"net/http"
	"net/textproto"
	"slices"
	"strings"
)

// Response headers set on replays.
const (
	// HeaderReplayed marks a replayed response: "Idempotent-Replayed: true".
	HeaderReplayed = "Idempotent-Replayed"
	// HeaderBodyOmitted marks a replay whose body was not stored (over the
	// store cap, or not known in full): "Idempotent-Body-Omitted: true".
	HeaderBodyOmitted = "Idempotent-Body-Omitted"
	// HeaderHeaderOmitted marks a replay whose headers were not stored
	// either (over WithMaxResponseHeader, or over a store's bound): the
	// replay is the status alone, "Idempotent-Header-Omitted: true".
	HeaderHeaderOmitted = "Idempotent-Header-Omitted"
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

// headerPolicy says which response headers a record keeps, and so which a
// replay sends: not hop-by-hop ones (nor those the Connection header
// names), not Date, not trailers, Set-Cookie only with WithStoreSetCookie,
// and, with WithStoredHeaders, only the names listed. Names are compared
// in canonical form whatever form the handler used ("set-cookie" is
// Set-Cookie), since net/http sends a name as it is in the map.
type headerPolicy struct {
	setCookie bool
	only      map[string]bool // canonical names; nil: any name
}

// each calls yield with the canonical name and the values of every header
// of h that p keeps. A name present in two forms is yielded twice.
func (p headerPolicy) each(h http.Header, yield func(name string, values []string)) {
	var named map[string]bool // the names the Connection header lists
	for k, vv := range h {
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
	for k, vv := range h {
		ck := textproto.CanonicalMIMEHeaderKey(k)
		if hopByHop[ck] || named[ck] || ck == "Date" || isTrailer(k) ||
			(ck == "Set-Cookie" && !p.setCookie) || (p.only != nil && !p.only[ck]) {
			continue
		}
		yield(ck, vv)
	}
}

// stored copies the headers of h that p keeps and that the handler set:
// a header that was already there, with the same values, when the
// middleware started (before holds those, see snapshotHeader) belongs to
// the middleware in front, which sets it afresh for every request. The
// copy shares nothing with h; it is nil when nothing is kept.
func (p headerPolicy) stored(h, before http.Header) http.Header {
	values := 0
	for _, vv := range h {
		values += len(vv)
	}
	var out http.Header
	all := make([]string, 0, values) // one array for every value, as Header.Clone
	p.each(h, func(ck string, vv []string) {
		if out == nil {
			out = make(http.Header, len(h))
		}
		if prev, ok := out[ck]; ok { // the same name in two forms
			out[ck] = append(prev, vv...)
			return
		}
		start := len(all)
		all = append(all, vv...)
		out[ck] = all[start:len(all):len(all)]
	})
	for ck, vv := range out {
		if bv, ok := before[ck]; ok && slices.Equal(vv, bv) {
			delete(out, ck)
		}
	}
	if len(out) == 0 {
		return nil
	}
	return out
}

// snapshotHeader returns a copy of h in canonical form, nil when h is
// empty: the headers the middleware in front set before this one started.
func snapshotHeader(h http.Header) http.Header {
	if len(h) == 0 {
		return nil
	}
	out := make(http.Header, len(h))
	for k, vv := range h {
		ck := textproto.CanonicalMIMEHeaderKey(k)
		out[ck] = append(out[ck][:len(out[ck]):len(out[ck])], vv...)
	}
	return out
}

// headerSize is what a stored header counts for against
// WithMaxResponseHeader: the bytes of every value, and of its name once
// per value, as the header lines carry them.
func headerSize(h http.Header) int {
	n := 0
	for k, vv := range h {
		for _, v := range vv {
			n += len(k) + len(v)
		}
	}
	return n
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
