package idempotency_test

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency"
)

func TestRecorderWritePaths(t *testing.T) {
	tests := []struct {
		name       string
		handler    http.HandlerFunc
		wantStatus int
		wantBody   string
	}{
		{"nothing written", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("X-Only-Header", "1")
		}, 200, ""},
		{"write without WriteHeader", func(w http.ResponseWriter, r *http.Request) {
			w.Write([]byte("implicit 200"))
		}, 200, "implicit 200"},
		{"WriteString", func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(http.StatusAccepted)
			io.WriteString(w, "via ")
			io.WriteString(w, "WriteString")
		}, 202, "via WriteString"},
		{"ReadFrom", func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(http.StatusCreated)
			w.(io.ReaderFrom).ReadFrom(strings.NewReader("read from"))
		}, 201, "read from"},
		{"informational first", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Link", "</style.css>; rel=preload")
			w.WriteHeader(http.StatusEarlyHints)
			w.WriteHeader(http.StatusCreated)
			io.WriteString(w, "after hints")
		}, 201, "after hints"},
		{"second WriteHeader ignored", func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(http.StatusCreated)
			w.WriteHeader(http.StatusTeapot)
			io.WriteString(w, "first status wins")
		}, 201, "first status wins"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var runs atomic.Int64
			h := idempotency.New(newMemStore(t))(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				runs.Add(1)
				tt.handler(w, r)
			}))
			srv := httptest.NewServer(h)
			defer srv.Close()
			for i, wantReplay := range []string{"", "true"} {
				res, body := post(t, srv.Client(), srv.URL, "k", "")
				if res == nil {
					return
				}
				if res.StatusCode != tt.wantStatus || body != tt.wantBody || res.Header.Get("Idempotent-Replayed") != wantReplay {
					t.Fatalf("request %d: %d %q replayed=%q; want %d %q", i, res.StatusCode, body,
						res.Header.Get("Idempotent-Replayed"), tt.wantStatus, tt.wantBody)
				}
			}
			if runs.Load() != 1 {
				t.Fatalf("handler ran %d times", runs.Load())
			}
		})
	}
}

func TestHijackReleases(t *testing.T) {
	var runs atomic.Int64
	released := make(chan struct{}, 2)
	obs := idempotency.WithObserver(func(_ context.Context, e idempotency.Event) {
		if e.Kind == idempotency.EventReleased {
			released <- struct{}{}
		}
	})
	h := idempotency.New(newMemStore(t), obs)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		conn, brw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			t.Error(err)
			return
		}
		defer conn.Close()
		brw.WriteString("HTTP/1.1 200 OK\r\nContent-Length: 7\r\nConnection: close\r\n\r\nhijack!")
		brw.Flush()
	}))
	srv := httptest.NewServer(h)
	defer srv.Close()
	for i := 0; i < 2; i++ {
		res, body := post(t, srv.Client(), srv.URL, "k", "")
		if res == nil || body != "hijack!" || res.Header.Get("Idempotent-Replayed") != "" {
			t.Fatalf("request %d: %v %q", i, res, body)
		}
		// The client has its answer before the handler returns; the key is
		// released after that.
		select {
		case <-released:
		case <-time.After(5 * time.Second):
			t.Fatal("the hijacked request's key was not released")
		}
	}
	if runs.Load() != 2 {
		t.Fatalf("handler ran %d times; a hijacked response must release the key", runs.Load())
	}
}

func TestHijackUnsupported(t *testing.T) {
	h := idempotency.New(newMemStore(t))(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// httptest.ResponseRecorder cannot be hijacked.
		if _, _, err := w.(http.Hijacker).Hijack(); !errors.Is(err, http.ErrNotSupported) {
			t.Errorf("Hijack on a recorder: %v, want ErrNotSupported", err)
		}
		w.WriteHeader(http.StatusCreated)
	}))
	if res := do(h, http.MethodPost, "k", ""); res.StatusCode != 201 {
		t.Fatalf("status %d", res.StatusCode)
	}
	if res := do(h, http.MethodPost, "k", ""); res.Header.Get("Idempotent-Replayed") != "true" {
		t.Fatal("a failed hijack must not stop the response from being stored")
	}
}

// errReader fails mid-body, as a client that disconnects does.
type errReader struct{ n int }

func (e *errReader) Read(p []byte) (int, error) {
	if e.n > 0 {
		e.n--
		p[0] = 'x'
		return 1, nil
	}
	return 0, io.ErrUnexpectedEOF
}

func TestRequestBodyErrors(t *testing.T) {
	c := &counter{}
	h := idempotency.New(newMemStore(t), idempotency.WithMaxRequestBody(100))(c)

	req := httptest.NewRequest(http.MethodPost, "/", io.NopCloser(&errReader{n: 5}))
	req.Header.Set("Idempotency-Key", "k")
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	if rec.Code != 400 || !strings.Contains(rec.Body.String(), string(idempotency.CodeBodyUnreadable)) {
		t.Fatalf("unreadable body: %d %s", rec.Code, rec.Body)
	}

	// A declared length over the cap is refused without reading.
	req = httptest.NewRequest(http.MethodPost, "/", io.NopCloser(&errReader{n: 1 << 20}))
	req.ContentLength = 1 << 20
	req.Header.Set("Idempotency-Key", "k")
	rec = httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	if rec.Code != 413 {
		t.Fatalf("declared length over the cap: %d", rec.Code)
	}
	// An undeclared (chunked) body over the cap is refused too.
	req = httptest.NewRequest(http.MethodPost, "/", bufio.NewReader(strings.NewReader(strings.Repeat("y", 101))))
	req.ContentLength = -1
	req.Header.Set("Idempotency-Key", "k")
	rec = httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	if rec.Code != 413 {
		t.Fatalf("chunked body over the cap: %d", rec.Code)
	}
	if c.n.Load() != 0 {
		t.Fatalf("handler ran %d times", c.n.Load())
	}
	// The key was never taken: a good request runs.
	if res := do(h, http.MethodPost, "k", "ok"); res.StatusCode != 201 || c.n.Load() != 1 {
		t.Fatalf("good request after refused ones: %d", res.StatusCode)
	}
}

// TestHandlerSeesWholeBody: the handler reads the same body the middleware
// fingerprinted, in any read sizes.
func TestHandlerSeesWholeBody(t *testing.T) {
	want := strings.Repeat("0123456789", 3000)
	h := idempotency.New(newMemStore(t))(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
		if err != nil || string(got) != want {
			t.Errorf("handler read %d bytes, %v", len(got), err)
		}
		if err := r.Body.Close(); err != nil {
			t.Error(err)
		}
	}))
	srv := httptest.NewServer(h)
	defer srv.Close()
	// Chunked: no Content-Length.
	req, _ := http.NewRequest(http.MethodPost, srv.URL, io.NopCloser(strings.NewReader(want)))
	req.Header.Set("Idempotency-Key", "k")
	res, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != 200 {
		t.Fatalf("status %d", res.StatusCode)
	}
}
