package idempotency

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"io"
	"net/http"
)

// FingerprintFunc identifies a request's payload. Two requests with the same
// key and different fingerprints are different requests: the second gets
// 422. body is the whole request body, already read by the middleware (at
// most the WithMaxRequestBody cap); the function must not keep it.
type FingerprintFunc func(r *http.Request, body []byte) string

// DefaultFingerprint is SHA-256 over the method, the path, the raw query and
// the body, each length-prefixed so that no two requests share an input.
func DefaultFingerprint(r *http.Request, body []byte) string {
	h := sha256.New()
	var n [8]byte
	for _, s := range [...]string{r.Method, r.URL.Path, r.URL.RawQuery} {
		binary.BigEndian.PutUint64(n[:], uint64(len(s)))
		h.Write(n[:])
		io.WriteString(h, s)
	}
	binary.BigEndian.PutUint64(n[:], uint64(len(body)))
	h.Write(n[:])
	h.Write(body)
	var sum [sha256.Size]byte
	return string(h.Sum(sum[:0]))
}

// storageKeyDomain separates storage-key hashes from any other use of SHA-256.
const storageKeyDomain = "idempotency/v1/storage-key\x00"

// StorageKey derives the storage key of (scope, key): the hex SHA-256 of both,
// length-prefixed under a fixed domain. It is 64 bytes long whatever the
// input and holds no client bytes, so stores can use it in key names.
func StorageKey(scope, key string) string {
	var buf [len(storageKeyDomain) + 16 + 2*MaxKeyLen]byte
	b := append(buf[:0], storageKeyDomain...)
	b = binary.BigEndian.AppendUint64(b, uint64(len(scope)))
	b = append(b, scope...)
	b = binary.BigEndian.AppendUint64(b, uint64(len(key)))
	b = append(b, key...)
	sum := sha256.Sum256(b)
	var out [2 * sha256.Size]byte
	hex.Encode(out[:], sum[:])
	return string(out[:])
}
