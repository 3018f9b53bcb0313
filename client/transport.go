package client

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"time"

	"github.com/google/uuid"
)

// drainLimit bounds how much of a discarded response body is read so that
// its connection can be reused; a longer body is closed unread.
const drainLimit = 64 << 10

// Transport is an http.RoundTripper that sends covered requests with an
// Idempotency-Key and retries them with that same key. It is safe for
// concurrent use by multiple goroutines; build one with NewTransport.
//
// For a covered request RoundTrip:
//
//   - keeps the caller's Idempotency-Key, or sets a fresh random (version 4)
//     UUID, on a copy of the request: the caller's *http.Request is never
//     modified;
//   - retries on network errors (refused or reset connections, EOF before the
//     response, timeouts that are not the request context's) and on 409, 429,
//     502, 503 and 504 responses that are not replays;
//   - never retries other statuses, 400, 413 and 422 included, nor a response
//     marked Idempotent-Replayed, which is the stored outcome of the request;
//   - waits between attempts as WithBackoff says, or for the response's
//     Retry-After when that is longer, gives up when WithMaxAttempts or
//     WithMaxElapsed would be exceeded or the wait would outlast the
//     context's deadline, and returns the context's error promptly when it is
//     cancelled during a wait;
//   - rewinds the body with GetBody before each retry, and returns an error
//     wrapping ErrBodyNotRewindable when a retry is needed but impossible;
//   - drains and closes each response it discards.
//
// When it gives up, RoundTrip returns the last response as it came, or the
// last network error wrapped with the number of attempts.
//
// Redirects: http.Client builds each redirected request from the first
// request's headers. A key the Transport made is set on its own copy, so it
// is never carried: a redirected request that is covered gets a fresh key of
// its own, and the first key never reaches the redirect's target. The caller's
// key is carried: on a redirect to the first request's host, as a key derived
// from it and the redirect's target (the server stored the redirect under the
// caller's key, for the route the caller addressed; the target is another
// route, which that key would name twice and which would refuse it as a
// mismatch), the same on every retry of the whole call, so that the target
// runs once and a retried call replays every hop. On a redirect to another
// host (host:port, compared case-insensitively, with the
// scheme's default port), RoundTrip does not send it unless
// WithCrossHostKey(true) allows it, since on a server that does not scope keys
// to the caller whoever presents a key may read its stored response: when the
// redirect has turned the request into a GET (301, 302 and 303 do so for a
// POST), it removes the key, which belongs to the request answered with the
// redirect, and sends the GET; otherwise it sends nothing and returns an error
// wrapping ErrCrossHostKey that names both hosts. This holds for requests of
// every method, covered or not.
//
// Version 4 UUIDs are used rather than time-ordered version 7 ones because a
// key works like a capability on servers that do not scope keys to the
// caller: 122 random bits reveal nothing and cannot be guessed, while a
// version 7 key discloses when it was made and is partly predictable. Time
// ordering would buy nothing either, as servers hash keys before storing them.
type Transport struct {
	base http.RoundTripper
	cfg  config

	// Seams for tests; set by NewTransport, never changed afterwards.
	now    func() time.Time
	sleep  func(ctx context.Context, d time.Duration) error
	jitter func(ceiling time.Duration) time.Duration // uniform in [0, ceiling]
	newKey func() (string, error)
}

// NewTransport returns a Transport that sends requests through base, or
// through http.DefaultTransport when base is nil. It panics on a
// misconfigured option.
func NewTransport(base http.RoundTripper, opts ...Option) *Transport {
	if base == nil {
		base = http.DefaultTransport
	}
	cfg := defaultConfig()
	for _, opt := range opts {
		if opt == nil {
			panic("client: nil Option")
		}
		opt(&cfg)
	}
	return &Transport{
		base:   base,
		cfg:    cfg,
		now:    time.Now,
		sleep:  sleepContext,
		jitter: fullJitter,
		newKey: newUUIDv4,
	}
}

// RoundTrip implements http.RoundTripper.
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	if req == nil {
		return nil, errNilRequest
	}
	if req.Response != nil {
		r, err := t.redirectKey(req)
		if err != nil {
			closeBody(req)
			if info, _ := req.Context().Value(infoKey{}).(*Info); info != nil {
				*info = Info{Key: req.Header.Get(HeaderKey)}
			}
			return nil, err
		}
		req = r
	}
	if !t.cfg.methods[req.Method] {
		return t.base.RoundTrip(req)
	}
	ctx := req.Context()
	info, _ := ctx.Value(infoKey{}).(*Info)

	key, callerKey := "", len(req.Header.Values(HeaderKey)) > 0
	if callerKey {
		key = req.Header.Get(HeaderKey)
	} else {
		var err error
		if key, err = t.newKey(); err != nil {
			closeBody(req)
			return nil, fmt.Errorf("client: generating idempotency key: %w", err)
		}
	}
	rec := &record{}
	actx := context.WithValue(ctx, recordKey{}, rec)
	rewindable := req.Body == nil || req.Body == http.NoBody || req.GetBody != nil
	start := t.now()

	finish := func(areq *http.Request, resp *http.Response) {
		if resp != nil {
			resp.Request = areq
			rec.final = areq
		}
		if info != nil {
			*info = Info{Key: key, Attempts: rec.attempts, Replayed: replayed(resp)}
		}
	}

	for attempt := 1; ; attempt++ {
		areq := req.Clone(actx)
		if attempt > 1 && req.Body != nil && req.Body != http.NoBody {
			body, err := req.GetBody()
			if err != nil {
				finish(areq, nil)
				return nil, fmt.Errorf("%w: GetBody: %w", ErrBodyNotRewindable, err)
			}
			areq.Body = body
		}
		if !callerKey {
			if areq.Header == nil {
				areq.Header = make(http.Header)
			}
			areq.Header.Set(HeaderKey, key)
		}
		rec.attempts = attempt

		resp, err := t.base.RoundTrip(areq)
		if err == nil && resp == nil {
			err = fmt.Errorf("client: base transport returned neither response nor error")
		}
		if err != nil {
			resp = nil
			if ctx.Err() != nil || !retryableError(err) {
				finish(areq, nil)
				return nil, err
			}
		} else if !retryableStatus(resp.StatusCode) || replayed(resp) {
			finish(areq, resp)
			return resp, nil
		}

		// The attempt failed in a way another attempt may get past.
		giveUp := func() (*http.Response, error) {
			finish(areq, resp)
			if resp != nil {
				return resp, nil
			}
			return nil, fmt.Errorf("client: %d attempts: %w", attempt, err)
		}
		if attempt >= t.cfg.maxAttempts {
			return giveUp()
		}
		if !rewindable {
			finish(areq, nil)
			if resp != nil {
				status := resp.Status
				discard(resp)
				return nil, fmt.Errorf("%w: a retry is needed after %q", ErrBodyNotRewindable, status)
			}
			return nil, fmt.Errorf("%w: a retry is needed after: %w", ErrBodyNotRewindable, err)
		}
		now := t.now()
		delay := t.jitter(backoffCeiling(t.cfg.baseDelay, t.cfg.maxDelay, attempt))
		if resp != nil {
			if ra, ok := retryAfter(resp.Header.Get("Retry-After"), now); ok && ra > delay {
				delay = ra
			}
		}
		if now.Add(delay).Sub(start) > t.cfg.maxElapsed {
			return giveUp()
		}
		if dl, ok := ctx.Deadline(); ok && !now.Add(delay).Before(dl) {
			return giveUp()
		}
		if resp != nil {
			discard(resp)
		}
		if err := t.sleep(ctx, delay); err != nil {
			finish(areq, nil)
			return nil, err
		}
	}
}

// CloseIdleConnections closes the idle connections of the base transport
// when it has such a method, as http.Client.CloseIdleConnections expects.
func (t *Transport) CloseIdleConnections() {
	if c, ok := t.base.(interface{ CloseIdleConnections() }); ok {
		c.CloseIdleConnections()
	}
}

func newUUIDv4() (string, error) {
	id, err := uuid.NewRandom()
	if err != nil {
		return "", err
	}
	return id.String(), nil
}

func fullJitter(ceiling time.Duration) time.Duration {
	if ceiling <= 0 {
		return 0
	}
	return time.Duration(rand.Int64N(int64(ceiling) + 1))
}

// sleepContext waits for d, or until ctx is done, whose error it returns.
func sleepContext(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-timer.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// discard drains (up to drainLimit) and closes the body of a response that is
// not returned, so that its connection can be reused.
func discard(resp *http.Response) {
	if resp.Body == nil {
		return
	}
	_, _ = io.CopyN(io.Discard, resp.Body, drainLimit)
	_ = resp.Body.Close()
}

// closeBody closes the request body, as RoundTrip must even when it fails
// before handing the request on.
func closeBody(req *http.Request) {
	if req.Body != nil {
		_ = req.Body.Close()
	}
}
