package client

import (
	"io"
	"net/http"
	"strings"
	"testing"
)

// BenchmarkRoundTrip measures what the Transport adds to a request answered
// at the first attempt: the copy, the key and the bookkeeping.
func BenchmarkRoundTrip(b *testing.B) {
	ok := &http.Response{StatusCode: http.StatusCreated, Body: http.NoBody, Header: http.Header{}}
	base := roundTripFunc(func(r *http.Request) (*http.Response, error) {
		if r.Body != nil {
			io.Copy(io.Discard, r.Body)
			r.Body.Close()
		}
		resp := *ok
		return &resp, nil
	})
	for _, bc := range []struct {
		name, method string
	}{{"covered", http.MethodPost}, {"pass-through", http.MethodGet}} {
		b.Run(bc.name, func(b *testing.B) {
			tr := NewTransport(base)
			b.ReportAllocs()
			for b.Loop() {
				req, _ := http.NewRequest(bc.method, "http://127.0.0.1/payments", strings.NewReader(`{"amount":1}`))
				resp, err := tr.RoundTrip(req)
				if err != nil || resp.StatusCode != http.StatusCreated {
					b.Fatal(err)
				}
			}
		})
	}
}
