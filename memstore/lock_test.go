package memstore

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency"
)

// TestNoGlobalLock holds one shard's lock and shows that everything else
// goes on without it: acquire, complete, replay, release and extend of keys
// in the other shards.
func TestNoGlobalLock(t *testing.T) {
	s := New()
	defer s.Close()
	ctx := context.Background()
	resp := &idempotency.Response{Status: http.StatusCreated, Body: []byte("ok")}
	req := func(key, token string) idempotency.AcquireRequest {
		return idempotency.AcquireRequest{Key: key, Token: token, Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour}
	}

	held := s.shard("hot")
	var others []string
	for i := 0; len(others) < 200; i++ {
		if k := fmt.Sprint("k", i); s.shard(k) != held {
			others = append(others, k)
		}
	}

	held.mu.Lock()
	done := make(chan error, 1)
	go func() {
		done <- func() error {
			for _, k := range others {
				if a, err := s.Acquire(ctx, req(k, "t")); err != nil || a.Outcome != idempotency.Acquired {
					return fmt.Errorf("Acquire(%s) = %+v, %v", k, a, err)
				}
				if err := s.Extend(ctx, k, "t", time.Minute); err != nil {
					return fmt.Errorf("Extend(%s): %v", k, err)
				}
				if err := s.Complete(ctx, k, "t", resp, time.Hour); err != nil {
					return fmt.Errorf("Complete(%s): %v", k, err)
				}
				if a, err := s.Acquire(ctx, req(k, "dup")); err != nil || a.Outcome != idempotency.Completed {
					return fmt.Errorf("replay of %s = %+v, %v", k, a, err)
				}
			}
			k := others[0] + "-released"
			for s.shard(k) == held {
				k += "x"
			}
			if _, err := s.Acquire(ctx, req(k, "t")); err != nil {
				return err
			}
			return s.Release(ctx, k, "t")
		}()
	}()
	// The bound only decides when to give up: the calls need no lock that
	// the test holds, so they finish in microseconds.
	select {
	case err := <-done:
		held.mu.Unlock()
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		held.mu.Unlock()
		t.Fatal("calls that need no lock the test holds did not finish: they waited for the held shard")
	}
}
