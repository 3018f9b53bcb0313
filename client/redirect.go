package client

import (
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
)

// redirectKey decides what becomes of the Idempotency-Key on req, a request
// that http.Client made to follow a redirect (req.Response is set). The key
// on such a request is the caller's: http.Client copies the headers of the
// first request, which a key the Transport made never reaches, since it is set
// on the Transport's own copies (CheckRedirect may also have set one).
//
// redirectKey returns req as it is when it has no key, and else decides
// where the key may go:
//
//   - to the first request's host, or with WithCrossHostKey to any host, the
//     request goes with a key derived from the caller's and its own target
//     (see redirectedKey): the target is another operation than the one the
//     caller's key named, which the server has stored the redirect under;
//   - to another host, when the redirect has turned the request into a GET,
//     the request goes without a key;
//   - to another host otherwise, or when the redirect chain cannot be
//     followed back to its first request, nothing goes: an error wrapping
//     ErrCrossHostKey.
func (t *Transport) redirectKey(req *http.Request) (*http.Request, error) {
	if len(req.Header.Values(HeaderKey)) == 0 {
		return req, nil
	}
	if t.cfg.crossHostKey {
		return withRedirectedKey(req), nil
	}
	to := hostPort(req.URL)
	first := firstRequest(req)
	if first == nil {
		return nil, fmt.Errorf("%w: from an unknown host to %s", ErrCrossHostKey, to)
	}
	from := hostPort(first.URL)
	if from == to {
		return withRedirectedKey(req), nil
	}
	if req.Method == http.MethodGet && first.Method != http.MethodGet {
		r := req.Clone(req.Context())
		r.Header.Del(HeaderKey)
		return r, nil
	}
	return nil, fmt.Errorf("%w: from %s to %s", ErrCrossHostKey, from, to)
}

// withRedirectedKey returns a copy of req, a request following a redirect,
// whose key is redirectedKey of the caller's.
func withRedirectedKey(req *http.Request) *http.Request {
	r := req.Clone(req.Context())
	r.Header.Set(HeaderKey, redirectedKey(req.Header.Get(HeaderKey), req.Method, req.URL))
	return r
}

// redirectedKey returns the key of a request that follows a redirect to
// method and u, derived from the caller's key: "r-" and the base64url of a
// SHA-256 over both (45 characters, within the key syntax). A server stores
// the redirect itself under the caller's key, for the operation the caller
// addressed; the redirect's target is another operation (another route, the
// same request), which that key would name twice, and which the server
// would refuse as a mismatch. Derived, the target's key is its own, and the
// same on every retry of the whole call with the caller's key: the target
// runs once, and a retried call replays every hop.
func redirectedKey(key, method string, u *url.URL) string {
	h := sha256.New()
	for _, s := range []string{"idempotency/v1/redirect", key, method, u.String()} {
		h.Write([]byte(strconv.Itoa(len(s))))
		h.Write([]byte{':'})
		h.Write([]byte(s))
	}
	return "r-" + base64.RawURLEncoding.EncodeToString(h.Sum(nil))
}

// firstRequest follows req's redirect chain back to the request that started
// it, through each redirect response's Request. It returns nil when a link is
// missing (a transport returned a response without its Request).
func firstRequest(req *http.Request) *http.Request {
	for req.Response != nil {
		if req = req.Response.Request; req == nil {
			return nil
		}
	}
	return req
}

// hostPort returns the host and port u's requests go to, lower-cased, with
// the scheme's default port when u names none.
func hostPort(u *url.URL) string {
	if u == nil {
		return ""
	}
	port := u.Port()
	if port == "" {
		switch strings.ToLower(u.Scheme) {
		case "http":
			port = "80"
		case "https":
			port = "443"
		}
	}
	return net.JoinHostPort(strings.ToLower(u.Hostname()), port)
}
