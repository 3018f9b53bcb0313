package wire

import (
	"net/http"
	"testing"

	"github.com/go-idempotency/idempotency"
)

// benchResponse has the two headers a typical JSON API response stores.
var benchResponse = &idempotency.Response{
	Status: http.StatusCreated,
	Header: http.Header{"Content-Type": {"application/json"}, "Location": {"/payments/123456"}},
	Body:   make([]byte, 1024),
}

// BenchmarkAppendMeta measures encoding a response's status and headers
// into a new block, as memstore's and redisstore's Complete do.
func BenchmarkAppendMeta(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		if _, err := AppendMeta(nil, benchResponse); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkDecode measures rebuilding the Response, as a replay that does
// not share a published one does.
func BenchmarkDecode(b *testing.B) {
	meta, err := AppendMeta(nil, benchResponse)
	if err != nil {
		b.Fatal(err)
	}
	m, body := string(meta), string(benchResponse.Body)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Decode(m, body); err != nil {
			b.Fatal(err)
		}
	}
}
