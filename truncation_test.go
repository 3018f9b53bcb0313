package idempotency_test

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/internal/reliability"
)

// bigBody is a response body well over the recorder's hold-back, in
// distinct lines, so that a truncation or a reordering shows.
var bigBody = func() []byte {
	var b bytes.Buffer
	for i := 0; b.Len() < 256<<10; i++ {
		fmt.Fprintf(&b, "line %06d of the response body\n", i)
	}
	return b.Bytes()
}()

// midBodyHandler writes the first 20 KiB of bigBody and flushes, waits until
// the test says the client is gone, then writes the rest in 4 KiB pieces:
// to its end (ignoring write errors, as many handlers do), or until a write
// fails (as io.Copy does). With declare set it declares the Content-Length.
type midBodyHandler struct {
	declare, stopOnError bool
	flushed              chan struct{} // the first part is out
	gone                 chan struct{} // the client hung up
	runs                 atomic.Int64
	writeErrs            atomic.Int64
}

func (h *midBodyHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h.runs.Add(1)
	if h.declare {
		w.Header().Set("Content-Length", strconv.Itoa(len(bigBody)))
	}
	w.Header().Set("Content-Type", "text/plain")
	w.WriteHeader(http.StatusCreated)
	const first = 20 << 10
	w.Write(bigBody[:first])
	http.NewResponseController(w).Flush()
	close(h.flushed)
	<-h.gone
	for off := first; off < len(bigBody); off += 4 << 10 {
		if _, err := w.Write(bigBody[off:min(off+4<<10, len(bigBody))]); err != nil {
			h.writeErrs.Add(1)
			if h.stopOnError {
				return
			}
		}
	}
}

// wantWholeOrOmitted checks a replay: byte for byte the handler's body, or
// marked as omitted with an empty body; never a silent part of it.
func wantWholeOrOmitted(t *testing.T, res *http.Response, body string) (omitted bool) {
	t.Helper()
	if res.StatusCode != http.StatusCreated || res.Header.Get(idempotency.HeaderReplayed) != "true" {
		t.Fatalf("retry: %d replayed=%q, want the replay of the 201", res.StatusCode, res.Header.Get(idempotency.HeaderReplayed))
	}
	if res.Header.Get(idempotency.HeaderBodyOmitted) == "true" {
		if body != "" {
			t.Fatalf("replay marked omitted with a %d-byte body", len(body))
		}
		return true
	}
	if body != string(bigBody) {
		t.Fatalf("replay has %d bytes of the %d-byte body and no %s marker: a silent truncation",
			len(body), len(bigBody), idempotency.HeaderBodyOmitted)
	}
	return false
}

// retryPast409 posts with key until the answer is not 409: the original may
// still be storing its record.
func retryPast409(t *testing.T, client *http.Client, url, key string) (*http.Response, string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		res, body := post(t, client, url, key, "")
		if res == nil || res.StatusCode != http.StatusConflict || time.Now().After(deadline) {
			return res, body
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestClientHangsUpMidBody: a client that hangs up after part of the body
// leaves a record that replays the whole body (when the handler wrote all of
// its declared Content-Length) or is marked omitted; the retry never gets a
// part of the body as if it were all of it, and the handler runs once.
func TestClientHangsUpMidBody(t *testing.T) {
	for _, tc := range []struct {
		name                 string
		declare, stopOnError bool
		wantOmitted          bool
	}{
		{"writes on, no length", false, false, true},
		{"stops at the error, no length", false, true, true},
		{"writes on, declared length", true, false, false},
		{"stops at the error, declared length", true, true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := &midBodyHandler{declare: tc.declare, stopOnError: tc.stopOnError,
				flushed: make(chan struct{}), gone: make(chan struct{})}
			srv := httptest.NewServer(idempotency.New(newMemStore(t))(h))
			defer srv.Close()

			conn, err := net.Dial("tcp", srv.Listener.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			fmt.Fprintf(conn, "POST / HTTP/1.1\r\nHost: x\r\nIdempotency-Key: k\r\nContent-Length: 0\r\n\r\n")
			<-h.flushed
			br := bufio.NewReader(conn)
			res, err := http.ReadResponse(br, nil)
			if err != nil {
				t.Fatal(err)
			}
			part := make([]byte, 10<<10)
			if _, err := io.ReadFull(res.Body, part); err != nil || !bytes.Equal(part, bigBody[:len(part)]) {
				t.Fatalf("first part: %v", err)
			}
			conn.Close() // unread bytes: the kernel resets the connection
			close(h.gone)

			res, body := retryPast409(t, srv.Client(), srv.URL, "k")
			if omitted := wantWholeOrOmitted(t, res, body); omitted != tc.wantOmitted {
				t.Fatalf("omitted=%v, want %v (write errors seen by the handler: %d)", omitted, tc.wantOmitted, h.writeErrs.Load())
			}
			if h.writeErrs.Load() == 0 {
				t.Fatal("no write failed after the client hung up: the test did not cut the body")
			}
			if h.runs.Load() != 1 {
				t.Fatalf("handler ran %d times", h.runs.Load())
			}
			note := "replay whole (declared length written)"
			if tc.wantOmitted {
				note = "replay marked Idempotent-Body-Omitted"
			}
			reliability.Report(t, reliability.Result{Scenario: "fault: client hangs up mid-body", Store: "memstore",
				Operations: 2, Faults: 1, Note: note})
		})
	}
}

// TestWriteTimeoutMidBody: the server's WriteTimeout passing mid-body is a
// hang-up like any other: the retry's replay is whole or marked omitted.
func TestWriteTimeoutMidBody(t *testing.T) {
	for _, declare := range []bool{false, true} {
		t.Run(fmt.Sprintf("declared=%v", declare), func(t *testing.T) {
			h := &midBodyHandler{declare: declare, flushed: make(chan struct{}), gone: make(chan struct{})}
			mw := idempotency.New(newMemStore(t))(h)
			srv := httptest.NewUnstartedServer(mw)
			srv.Config.WriteTimeout = 300 * time.Millisecond
			srv.Start()
			defer srv.Close()
			retrySrv := httptest.NewServer(mw) // the retry must not time out itself
			defer retrySrv.Close()

			done := make(chan error, 1)
			go func() {
				req, _ := http.NewRequest(http.MethodPost, srv.URL, nil)
				req.Header.Set("Idempotency-Key", "k")
				res, err := srv.Client().Do(req)
				if err == nil {
					_, err = io.Copy(io.Discard, res.Body)
					res.Body.Close()
				}
				done <- err
			}()
			<-h.flushed
			time.Sleep(400 * time.Millisecond) // only real time passes a WriteTimeout
			close(h.gone)
			if err := <-done; err == nil {
				t.Fatal("the first client read the whole body past the WriteTimeout")
			}
			res, body := retryPast409(t, retrySrv.Client(), retrySrv.URL, "k")
			if omitted := wantWholeOrOmitted(t, res, body); omitted == declare {
				t.Fatalf("declared=%v: omitted=%v", declare, omitted)
			}
			if h.runs.Load() != 1 {
				t.Fatalf("handler ran %d times", h.runs.Load())
			}
			reliability.Report(t, reliability.Result{Scenario: "fault: server WriteTimeout mid-body", Store: "memstore",
				Operations: 2, Faults: 1, Note: "replay whole with a declared length, else marked omitted"})
		})
	}
}

// TestHeldResponse: a small response the handler did not flush is held back
// and sent, when the handler returns, with a Content-Length (net/http's own
// rule), so its client has it whole before the record is stored; a header
// changed after the status reaches neither the client nor the record, as
// with net/http; a trailer set after the body still reaches the client
// (net/http itself drops a prefixed one set after the status of a small
// response; the recorder passes it on).
func TestHeldResponse(t *testing.T) {
	h := idempotency.New(newMemStore(t))(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Before", "1")
		if r.URL.Query().Get("trailer") == "declared" {
			w.Header().Set("Trailer", "X-Checksum")
		}
		w.WriteHeader(http.StatusCreated)
		w.Header().Set("X-After", "dropped")
		io.WriteString(w, "held")
		switch r.URL.Query().Get("trailer") {
		case "declared":
			w.Header().Set("X-Checksum", "abc")
		case "prefixed":
			w.Header().Set(http.TrailerPrefix+"X-Checksum", "abc")
		}
	}))
	srv := httptest.NewServer(h)
	defer srv.Close()
	res, body := post(t, srv.Client(), srv.URL, "k1", "")
	if body != "held" || res.ContentLength != 4 || len(res.TransferEncoding) != 0 {
		t.Fatalf("first: %q, Content-Length %d, Transfer-Encoding %v", body, res.ContentLength, res.TransferEncoding)
	}
	if res.Header.Get("X-Before") != "1" || res.Header.Get("X-After") != "" {
		t.Fatalf("first headers: %v", res.Header)
	}
	res, _ = post(t, srv.Client(), srv.URL, "k1", "")
	if res.Header.Get("Idempotent-Replayed") != "true" || res.Header.Get("X-Before") != "1" || res.Header.Get("X-After") != "" {
		t.Fatalf("replay headers: %v", res.Header)
	}

	for i, kind := range []string{"declared", "prefixed"} {
		res, body = post(t, srv.Client(), srv.URL+"?trailer="+kind, fmt.Sprint("t", i), "")
		if body != "held" || res.Trailer.Get("X-Checksum") != "abc" {
			t.Fatalf("with a %s trailer: %q, trailers %v", kind, body, res.Trailer)
		}
	}
}

// TestStreamingStillStreams: a response over the hold-back passes through
// while the handler writes: the client reads its start before the handler
// returns (net/http's own buffers may keep its last few KiB).
func TestStreamingStillStreams(t *testing.T) {
	firstRead := make(chan struct{})
	chunk := strings.Repeat("s", 16<<10)
	h := idempotency.New(newMemStore(t))(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, chunk)
		select {
		case <-firstRead:
		case <-time.After(5 * time.Second):
			t.Error("an unflushed 16 KiB response was held back until the handler returned")
		}
		io.WriteString(w, "end")
	}))
	srv := httptest.NewServer(h)
	defer srv.Close()
	req, _ := http.NewRequest(http.MethodPost, srv.URL, nil)
	req.Header.Set("Idempotency-Key", "k")
	res, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	buf := make([]byte, 8<<10)
	if _, err := io.ReadFull(res.Body, buf); err != nil {
		t.Fatal(err)
	}
	close(firstRead)
	rest, _ := io.ReadAll(res.Body)
	if string(buf)+string(rest) != chunk+"end" {
		t.Fatalf("body of %d bytes", len(buf)+len(rest))
	}
}
