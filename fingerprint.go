package idempotency

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"hash"
	"net/http"
	"sync"
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
	var out [sha256.Size]byte
	return string(appendDefaultFingerprint(out[:0], r, body))
}

func appendDefaultFingerprint(dst []byte, r *http.Request, body []byte) []byte {
	f := fingerprintPool.Get().(*fingerprinter)
	f.h.Reset()
	b := f.scratch[:0]
	for _, s := range [...]string{r.Method, r.URL.EscapedPath(), r.URL.RawQuery} {
		b = binary.BigEndian.AppendUint64(b, uint64(len(s)))
		b = append(b, s...)
	}
	b = binary.BigEndian.AppendUint64(b, uint64(len(body)))
	f.h.Write(b)
	f.h.Write(body)
	dst = append(dst, f.h.Sum(f.sum[:0])...)
	if cap(b) <= maxPooledScratch {
		f.scratch = b[:0]
		fingerprintPool.Put(f)
	}
	return dst
}

// fingerprinter is a reusable SHA-256 state with room for the length-prefixed
// request line.
type fingerprinter struct {
	h       hash.Hash
	scratch []byte
	sum     [sha256.Size]byte
}

const maxPooledScratch = 4 << 10

var fingerprintPool = sync.Pool{New: func() any {
	return &fingerprinter{h: sha256.New(), scratch: make([]byte, 0, 512)}
}}

// storageKeyDomain separates storage-key hashes from any other use of SHA-256.
const storageKeyDomain = "idempotency/v1/storage-key\x00"

// StorageKey derives the storage key of (scope, key): the hex SHA-256 of both,
// length-prefixed under a fixed domain. It is 64 bytes long whatever the
// input and holds no client bytes, so stores can use it in key names.
func StorageKey(scope, key string) string {
	var out [2 * sha256.Size]byte
	return string(appendStorageKey(out[:0], scope, key))
}

func appendStorageKey(dst []byte, scope, key string) []byte {
	var buf [len(storageKeyDomain) + 16 + 2*MaxKeyLen]byte
	b := append(buf[:0], storageKeyDomain...)
	b = binary.BigEndian.AppendUint64(b, uint64(len(scope)))
	b = append(b, scope...)
	b = binary.BigEndian.AppendUint64(b, uint64(len(key)))
	b = append(b, key...)
	sum := sha256.Sum256(b)
	return hex.AppendEncode(dst, sum[:])
}

// identity returns the storage key of (scope, key), a fresh random lease
// token and the request's fingerprint. With the default fingerprint the
// three share one allocation.
func (c *config) identity(r *http.Request, scope, key string, body []byte) (storageKey, token, fingerprint string) {
	const k, t = 2 * sha256.Size, 2 * tokenBytes
	var out [k + t + sha256.Size]byte
	b := appendStorageKey(out[:0], scope, key)
	b = appendToken(b)
	if c.fingerprint == nil {
		b = appendDefaultFingerprint(b, r, body)
		s := string(b)
		return s[:k], s[k : k+t], s[k+t:]
	}
	s := string(b)
	return s[:k], s[k:], c.fingerprint(r, body)
}

// tokenBytes is the size of a lease token.
const tokenBytes = 16

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

func appendToken(dst []byte) []byte {
	var t [tokenBytes]byte
	copy(t[:8], tokenPrefix[:])
	binary.BigEndian.PutUint64(t[8:], tokenCounter.Add(1))
	return hex.AppendEncode(dst, t[:])
}
