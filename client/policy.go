package client

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// retryableStatus reports whether a response with this status is worth
// another attempt with the same key. 409 is what an idempotency server answers
// while the original request still runs; 429 and 503 ask the client to come
// back later; 502 and 504 come from a proxy that lost the upstream answer.
// 500 is not retried: the server released the key, and whether the failure
// repeats is for the caller to judge.
func retryableStatus(code int) bool {
	switch code {
	case http.StatusConflict,
		http.StatusTooManyRequests,
		http.StatusBadGateway,
		http.StatusServiceUnavailable,
		http.StatusGatewayTimeout:
		return true
	}
	return false
}

// retryableError reports whether err, returned by the base transport while
// the request's context is still live, is a network failure that another
// attempt may get past: a refused, reset or aborted connection, an EOF before
// the response, or a timeout of the transport's own (dial, TLS handshake,
// response header). Certificate errors, unknown hosts, bad URLs and other
// errors that would repeat are not retried.
func retryableError(err error) bool {
	if err == nil {
		return false
	}
	var (
		dnsErr  *net.DNSError
		certErr *tls.CertificateVerificationError
		unkAuth x509.UnknownAuthorityError
		hostErr x509.HostnameError
		invErr  x509.CertificateInvalidError
		recErr  tls.RecordHeaderError
		addrErr *net.AddrError
	)
	switch {
	case errors.As(err, &certErr), errors.As(err, &unkAuth),
		errors.As(err, &hostErr), errors.As(err, &invErr),
		errors.As(err, &recErr), errors.As(err, &addrErr):
		return false
	case errors.As(err, &dnsErr):
		return dnsErr.IsTimeout || dnsErr.IsTemporary
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF),
		errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, syscall.ECONNRESET),
		errors.Is(err, syscall.ECONNABORTED), errors.Is(err, syscall.EPIPE),
		errors.Is(err, net.ErrClosed):
		return true
	}
	var netErr net.Error
	if errors.As(err, &netErr) && netErr.Timeout() {
		return true
	}
	var opErr *net.OpError
	return errors.As(err, &opErr)
}

// retryAfter parses a Retry-After header value: delay-seconds or an
// HTTP-date, taken relative to now. It reports false for an absent or
// malformed value; a date in the past gives 0.
func retryAfter(v string, now time.Time) (time.Duration, bool) {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0, false
	}
	if v[0] >= '0' && v[0] <= '9' {
		secs, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			return 0, false
		}
		const maxSecs = uint64(1<<63-1) / uint64(time.Second)
		if secs > maxSecs {
			secs = maxSecs
		}
		return time.Duration(secs) * time.Second, true
	}
	t, err := http.ParseTime(v)
	if err != nil {
		return 0, false
	}
	if d := t.Sub(now); d > 0 {
		return d, true
	}
	return 0, true
}

// backoffCeiling returns min(max, base·2^(retry-1)) for retry >= 1, without
// overflowing.
func backoffCeiling(base, max time.Duration, retry int) time.Duration {
	d := base
	for i := 1; i < retry; i++ {
		if d >= max/2 {
			return max
		}
		d *= 2
	}
	if d > max {
		return max
	}
	return d
}

// replayed reports whether resp carries Idempotent-Replayed: true.
func replayed(resp *http.Response) bool {
	return resp != nil && strings.EqualFold(strings.TrimSpace(resp.Header.Get(headerReplayed)), "true")
}
