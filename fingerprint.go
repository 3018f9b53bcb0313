package idempotency

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"net/http"
	"net/url"
	"strings"
	"sync/atomic"
)

// FingerprintFunc identifies a request's payload. Two requests with the same
// key and different fingerprints are different requests: the second gets
// 422. body is the whole request body, already read by the middleware (at
// most the WithMaxRequestBody cap); the function must not keep it.
type FingerprintFunc func(r *http.Request, body []byte) string

// DefaultFingerprint is SHA-256 over the method, the escaped path, the raw
// query and the body, each length-prefixed so that no two requests share an
// input.
func DefaultFingerprint(r *http.Request, body []byte) string {
	var fields []byte
	for _, s := range [...]string{r.Method, r.URL.EscapedPath(), r.URL.RawQuery} {
		fields = appendField(fields, s)
	}
	fields = binary.BigEndian.AppendUint64(fields, uint64(len(body)))
	h := sha256.New()
	h.Write(fields)
	h.Write(body)
	return string(h.Sum(nil))
}

// appendField appends s to b after its length (8 bytes, big-endian), so
// that fields cannot run into each other.
func appendField(b []byte, s string) []byte {
	b = binary.BigEndian.AppendUint64(b, uint64(len(s)))
	return append(b, s...)
}

// storageKeyDomain separates storage-key hashes from any other use of SHA-256.
const storageKeyDomain = "idempotency/v1/storage-key\x00"

// StorageKey derives the storage key of (scope, key): the hex SHA-256 of both,
// length-prefixed under a fixed domain. It is 64 bytes long whatever the
// input and holds no client bytes, so stores can use it in key names.
func StorageKey(scope, key string) string {
	sum := sha256.Sum256(appendField(appendField([]byte(storageKeyDomain), scope), key))
	return hex.EncodeToString(sum[:])
}

// requestDomain separates request identities from any other use of
// SHA-256.
const requestDomain = "idempotency/v1/request\x00"

// requestIdentity is what a record's fingerprint holds for a request: the
// SHA-256 of the route the client addressed (method and path as sent) and
// the configured fingerprint, length-prefixed under a fixed domain. A
// custom fingerprint thus adds to the route and never replaces it.
func requestIdentity(method, path, fingerprint string) string {
	b := make([]byte, 0, len(requestDomain)+3*8+len(method)+len(path)+len(fingerprint))
	b = appendField(appendField(appendField(append(b, requestDomain...), method), path), fingerprint)
	sum := sha256.Sum256(b)
	return string(sum[:])
}

// addressedPath returns the path the client addressed: that of the request
// target as it was sent (Request.RequestURI), before a router or
// http.StripPrefix rewrote r.URL. A request made in process has no
// RequestURI; its URL is what it addressed.
func addressedPath(r *http.Request) string {
	u := r.RequestURI
	switch {
	case u == "":
		return r.URL.EscapedPath()
	case u[0] == '/':
		path, _, _ := strings.Cut(u, "?")
		return path
	}
	if p, err := url.ParseRequestURI(u); err == nil { // absolute form, sent to a proxy
		return p.EscapedPath()
	}
	return u
}

// claim returns the AcquireRequest of a caller's attempt at the record of
// (scope, key), made by a request or call with fingerprint: a fresh lease
// token, the configured lease and TTL.
func (c *config) claim(scope, key, fingerprint string) AcquireRequest {
	return AcquireRequest{Key: StorageKey(scope, key), Token: newToken(), Fingerprint: fingerprint, Lease: c.lease, TTL: c.ttl}
}

// fingerprintOf returns the configured fingerprint of r with body.
func (c *config) fingerprintOf(r *http.Request, body []byte) string {
	if c.fingerprint == nil {
		return DefaultFingerprint(r, body)
	}
	return c.fingerprint(r, body)
}

// A lease token is a random per-process prefix and a counter: unique without
// reading crypto/rand on every request. Tokens fence owners of one record
// from each other and never leave the server, so they need to be unique,
// not secret.
var (
	tokenPrefix  [8]byte
	tokenCounter atomic.Uint64
)

func init() {
	_, _ = rand.Read(tokenPrefix[:]) // crypto/rand.Read never fails (Go 1.24)
}

// newToken returns a fresh lease token: 32 hex digits.
func newToken() string {
	var t [16]byte
	copy(t[:8], tokenPrefix[:])
	binary.BigEndian.PutUint64(t[8:], tokenCounter.Add(1))
	return hex.EncodeToString(t[:])
}
