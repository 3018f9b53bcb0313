package client

import (
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strings"
)

// redirectKey decides what becomes of the Idempotency-Key on req, a request
// that http.Client made to follow a redirect (req.Response is set). The key
// on such a request is the caller's: http.Client copies the headers of the
// first request, which a key the Transport made never reaches, since it is set
// on the Transport's own copies (CheckRedirect may also have set one).
//
// redirectKey returns req as it is when the key may go where req goes: there
// is no key, the host is the first request's, or WithCrossHostKey allows it.
// It returns a copy of req without the key when the redirect has turned the
// request into a GET, and an error wrapping ErrCrossHostKey otherwise, or when
// the redirect chain cannot be followed back to its first request.
func (t *Transport) redirectKey(req *http.Request) (*http.Request, error) {
	if t.cfg.crossHostKey || len(req.Header.Values(HeaderKey)) == 0 {
		return req, nil
	}
	to := hostPort(req.URL)
	first := firstRequest(req)
	if first == nil {
		return nil, fmt.Errorf("%w: from an unknown host to %s", ErrCrossHostKey, to)
	}
	from := hostPort(first.URL)
	if from == to {
		return req, nil
	}
	if req.Method == http.MethodGet && first.Method != http.MethodGet {
		r := req.Clone(req.Context())
		r.Header.Del(HeaderKey)
		return r, nil
	}
	return nil, fmt.Errorf("%w: from %s to %s", ErrCrossHostKey, from, to)
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
