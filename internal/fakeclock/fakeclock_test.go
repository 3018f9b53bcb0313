package fakeclock

import (
	"sync"
	"testing"
	"time"
)

func TestAdvance(t *testing.T) {
	t0 := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	c := New(t0)
	if got := c.Now(); !got.Equal(t0) {
		t.Fatalf("Now = %v, want %v", got, t0)
	}
	var wg sync.WaitGroup
	for range 10 {
		wg.Go(func() {
			c.Advance(time.Second)
			_ = c.Now()
		})
	}
	wg.Wait()
	if got, want := c.Now(), t0.Add(10*time.Second); !got.Equal(want) {
		t.Fatalf("Now after ten Advance(1s) = %v, want %v", got, want)
	}
}
