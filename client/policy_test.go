package client

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"syscall"
	"testing"
	"time"
)

func TestRetryAfter(t *testing.T) {
	now := time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)
	for _, tc := range []struct {
		in   string
		want time.Duration
		ok   bool
	}{
		{"", 0, false},
		{"  ", 0, false},
		{"0", 0, true},
		{"7", 7 * time.Second, true},
		{" 7 ", 7 * time.Second, true},
		{"-1", 0, false},
		{"1.5", 0, false},
		{"7s", 0, false},
		{"99999999999999999999", 0, false},
		{"9999999999", time.Duration(1<<63-1) / time.Second * time.Second, true},
		{now.Add(90 * time.Second).Format(http.TimeFormat), 90 * time.Second, true},
		{now.Add(-time.Hour).Format(http.TimeFormat), 0, true},
		{"Mon, 32 Foo 2025", 0, false},
	} {
		got, ok := retryAfter(tc.in, now)
		if got != tc.want || ok != tc.ok {
			t.Errorf("retryAfter(%q) = %v, %v; want %v, %v", tc.in, got, ok, tc.want, tc.ok)
		}
	}
}

func TestBackoffCeiling(t *testing.T) {
	for _, tc := range []struct {
		base, max time.Duration
		retry     int
		want      time.Duration
	}{
		{100 * time.Millisecond, 5 * time.Second, 1, 100 * time.Millisecond},
		{100 * time.Millisecond, 5 * time.Second, 2, 200 * time.Millisecond},
		{100 * time.Millisecond, 5 * time.Second, 6, 3200 * time.Millisecond},
		{100 * time.Millisecond, 5 * time.Second, 7, 5 * time.Second},
		{100 * time.Millisecond, 5 * time.Second, 1000, 5 * time.Second},
		{time.Second, time.Second, 3, time.Second},
		{time.Hour, 1<<63 - 1, 200, 1<<63 - 1},
	} {
		if got := backoffCeiling(tc.base, tc.max, tc.retry); got != tc.want {
			t.Errorf("backoffCeiling(%v, %v, %d) = %v, want %v", tc.base, tc.max, tc.retry, got, tc.want)
		}
	}
}

type timeoutErr struct{}

func (timeoutErr) Error() string   { return "i/o timeout" }
func (timeoutErr) Timeout() bool   { return true }
func (timeoutErr) Temporary() bool { return true }

func TestRetryableError(t *testing.T) {
	op := func(err error) error { return &net.OpError{Op: "dial", Net: "tcp", Err: err} }
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{nil, false},
		{io.EOF, true},
		{fmt.Errorf("net/http: HTTP/1.x transport connection broken: %w", io.ErrUnexpectedEOF), true},
		{op(os.NewSyscallError("connect", syscall.ECONNREFUSED)), true},
		{op(os.NewSyscallError("read", syscall.ECONNRESET)), true},
		{os.NewSyscallError("write", syscall.EPIPE), true},
		{timeoutErr{}, true},
		{op(timeoutErr{}), true},
		{op(os.NewSyscallError("connect", syscall.ENETUNREACH)), true},
		{&net.DNSError{Err: "no such host", Name: "x.invalid", IsNotFound: true}, false},
		{op(&net.DNSError{Err: "timeout", Name: "x", IsTimeout: true}), true},
		{op(&net.AddrError{Err: "missing port", Addr: "x"}), false},
		{x509.UnknownAuthorityError{}, false},
		{errors.New("unsupported protocol scheme"), false},
		{context.Canceled, false},
	} {
		if got := retryableError(tc.err); got != tc.want {
			t.Errorf("retryableError(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}

func TestOptionsPanicOnMisconfiguration(t *testing.T) {
	for name, f := range map[string]func(){
		"no methods":       func() { WithMethods() },
		"empty method":     func() { WithMethods("POST", "") },
		"zero base":        func() { WithBackoff(0, time.Second) },
		"max below base":   func() { WithBackoff(time.Second, time.Millisecond) },
		"zero attempts":    func() { WithMaxAttempts(0) },
		"negative elapsed": func() { WithMaxElapsed(-time.Second) },
		"zero elapsed":     func() { WithMaxElapsed(0) },
		"nil option":       func() { NewTransport(nil, nil) },
	} {
		t.Run(name, func(t *testing.T) {
			defer func() {
				if recover() == nil {
					t.Errorf("no panic")
				}
			}()
			f()
		})
	}
}

func TestDefaults(t *testing.T) {
	tr := NewTransport(nil)
	if tr.base != http.DefaultTransport {
		t.Errorf("nil base is not http.DefaultTransport")
	}
	c := tr.cfg
	if !c.methods["POST"] || !c.methods["PATCH"] || len(c.methods) != 2 ||
		c.baseDelay != 100*time.Millisecond || c.maxDelay != 5*time.Second ||
		c.maxAttempts != 5 || c.maxElapsed != 30*time.Second || c.crossHostKey {
		t.Errorf("defaults = %+v", c)
	}
	tr = NewTransport(nil, WithMaxAttempts(2), WithBackoff(time.Second, time.Second), WithMaxElapsed(time.Minute), WithMethods("PUT"), WithCrossHostKey(true))
	c = tr.cfg
	if c.maxAttempts != 2 || c.baseDelay != time.Second || c.maxElapsed != time.Minute || !c.methods["PUT"] || c.methods["POST"] || !c.crossHostKey {
		t.Errorf("options not applied: %+v", c)
	}
}

type idleCloser struct {
	http.RoundTripper
	closed bool
}

func (c *idleCloser) CloseIdleConnections() { c.closed = true }

func TestCloseIdleConnections(t *testing.T) {
	base := &idleCloser{}
	NewTransport(base).CloseIdleConnections()
	if !base.closed {
		t.Errorf("CloseIdleConnections not forwarded")
	}
	NewTransport(roundTripFunc(nil)).CloseIdleConnections() // no such method: no panic
}
