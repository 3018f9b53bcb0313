package idempotency_test

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/internal/reliability"
)

// firstRead signals on the first Read of a request body.
type firstRead struct {
	io.ReadCloser
	once atomic.Bool
	seen chan<- struct{}
}

func (b *firstRead) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if n > 0 && !b.once.Swap(true) {
		b.seen <- struct{}{}
	}
	return n, err
}

// TestSlowBodyMemory: clients that declare a large Content-Length and send
// one byte cost the memory of the bytes that arrived, not of the length they
// declared: 200 of them, each declaring 1 MiB, hold the heap to a few MiB.
func TestSlowBodyMemory(t *testing.T) {
	const clients = 200
	seen := make(chan struct{}, clients)
	mw := idempotency.New(newMemStore(t))(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		t.Error("the handler ran with a body that never arrived")
	}))
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		r.Body = &firstRead{ReadCloser: r.Body, seen: seen}
		mw.ServeHTTP(w, r)
	}))
	defer srv.Close()

	heap := func() uint64 {
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return m.HeapAlloc
	}
	before := heap()
	conns := make([]net.Conn, 0, clients)
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for i := range clients {
		c, err := net.Dial("tcp", srv.Listener.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
		fmt.Fprintf(c, "POST / HTTP/1.1\r\nHost: x\r\nIdempotency-Key: k%d\r\nContent-Length: %d\r\n\r\nx", i, 1<<20)
	}
	for range clients {
		select {
		case <-seen:
		case <-time.After(10 * time.Second):
			t.Fatal("not every request reached the middleware's body read")
		}
	}
	grown := int64(heap()) - int64(before)
	t.Logf("heap grew by %.1f MiB for %d connections declaring 1 MiB and sending 1 byte", float64(grown)/(1<<20), clients)
	if grown > 16<<20 {
		t.Fatalf("heap grew by %d MiB: the body buffers follow the declared length, not the bytes", grown>>20)
	}
	reliability.Report(t, reliability.Result{Scenario: "bad input: slow bodies declaring 1 MiB", Store: "memstore",
		Operations: clients, Faults: clients,
		Note: fmt.Sprintf("%d connections, 1 byte each: heap +%.1f MiB (was +205 MiB)", clients, float64(grown)/(1<<20))})
}
