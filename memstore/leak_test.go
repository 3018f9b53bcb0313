package memstore_test

import (
	"bytes"
	"runtime"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency/memstore"
)

// sweepers counts the goroutines running a store's background sweep.
func sweepers() int {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			return bytes.Count(buf[:n], []byte("memstore.(*Store).sweep("))
		}
		buf = make([]byte, 2*len(buf))
	}
}

// waitSweepers waits until sweepers() is want.
func waitSweepers(t *testing.T, want int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		n := sweepers()
		if n == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d sweep goroutines, want %d", n, want)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestCloseStopsSweep is not parallel: it counts every sweep goroutine in
// the process.
func TestCloseStopsSweep(t *testing.T) {
	before := sweepers()
	stores := make([]*memstore.Store, 3)
	for i := range stores {
		stores[i] = memstore.New(memstore.WithSweepInterval(time.Millisecond))
	}
	waitSweepers(t, before+len(stores))
	for _, s := range stores {
		s.Close()
	}
	waitSweepers(t, before)
}
