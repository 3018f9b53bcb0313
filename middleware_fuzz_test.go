package idempotency_test

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/memstore"
)

// FuzzMiddleware sends arbitrary methods, Idempotency-Key header lines
// (zero, one or many, any bytes) and bodies through the middleware, each
// twice. The handler's answer is a function of the request, so every answer
// can be judged: it is the handler's own (fresh or replayed, byte for byte),
// or a problem with a documented status. The middleware must never panic.
func FuzzMiddleware(f *testing.F) {
	f.Add(uint8(0), "abc", []byte("amount=1"))
	f.Add(uint8(0), `"quoted \" key"`, []byte(""))
	f.Add(uint8(1), "k1\nk2", []byte("x"))
	f.Add(uint8(0), "", []byte("no key"))
	f.Add(uint8(0), "\n", []byte{})
	f.Add(uint8(2), "get-key", []byte("ignored"))
	f.Add(uint8(0), strings.Repeat("k", 256), []byte("long"))
	f.Add(uint8(0), "fail", []byte("5xx"))
	f.Add(uint8(0), "big", bytes.Repeat([]byte("b"), 300))
	f.Add(uint8(5), "a\x00b", []byte("\xff"))

	store := memstore.New()
	f.Cleanup(func() { store.Close() })
	methods := []string{http.MethodPost, http.MethodPatch, http.MethodGet, http.MethodPut, http.MethodDelete, "BREW"}
	expected := func(method string, body []byte) string {
		sum := sha256.Sum256(append([]byte(method+" "), body...))
		return "h:" + hex.EncodeToString(sum[:])
	}
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body := new(bytes.Buffer)
		body.ReadFrom(r.Body)
		if bytes.HasPrefix(body.Bytes(), []byte("5xx")) {
			w.WriteHeader(http.StatusInternalServerError)
			w.Write([]byte("handler failed"))
			return
		}
		w.Header().Set("X-Handler", "yes")
		w.WriteHeader(http.StatusCreated)
		w.Write([]byte(expected(r.Method, body.Bytes())))
	})
	mw := idempotency.New(store, idempotency.WithMaxRequestBody(256))(handler)
	problems := map[int]bool{400: true, 409: true, 413: true, 422: true, 503: true}

	f.Fuzz(func(t *testing.T, m uint8, keys string, body []byte) {
		method := methods[int(m)%len(methods)]
		for i := 0; i < 2; i++ {
			req := httptest.NewRequest(method, "/", bytes.NewReader(body))
			if keys != "" {
				req.Header[idempotency.HeaderKey] = strings.Split(keys, "\n")
			}
			rec := httptest.NewRecorder()
			mw.ServeHTTP(rec, req)
			res := rec.Result()
			got := rec.Body.String()
			switch {
			case res.StatusCode == http.StatusCreated:
				if got != expected(method, body) {
					t.Fatalf("%s %q: 201 with %q, want the handler's answer to this request", method, keys, got)
				}
			case res.StatusCode == http.StatusInternalServerError:
				if got != "handler failed" {
					t.Fatalf("%s %q: 500 not from the handler: %q", method, keys, got)
				}
			case problems[res.StatusCode]:
				if res.Header.Get("Content-Type") != "application/problem+json" || !strings.Contains(got, `"code":"`) {
					t.Fatalf("%s %q: %d without a problem document: %q", method, keys, res.StatusCode, got)
				}
			default:
				t.Fatalf("%s %q: undocumented status %d: %q", method, keys, res.StatusCode, got)
			}
		}
	})
}
