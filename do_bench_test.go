package idempotency_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency"
)

// BenchmarkDo measures one call of Do on memstore, in process, beside the
// bare function and its record floor: the same function between the same
// store calls, made by hand (an Acquire, then a Complete of the encoded
// result; a replay's single Acquire, decoded). Run with -benchmem.
func BenchmarkDo(b *testing.B) {
	ctx := context.Background()
	type receipt struct {
		ID     string `json:"id"`
		Amount int    `json:"amount"`
	}
	fn := func(context.Context) (receipt, error) { return receipt{ID: "ch_1", Amount: 1999}, nil }
	payload := []byte(`{"order":"1001","amount":1999}`)
	call := func(key string) idempotency.Call {
		return idempotency.Call{Name: "charge", Key: key, Payload: payload}
	}
	b.Run("Bare", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := fn(ctx); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("FirstExecution", func(b *testing.B) {
		r := idempotency.NewRunner(benchStore(b))
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			i++
			if _, err := idempotency.Do(ctx, r, call(fmt.Sprint("k", i)), fn); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("FirstExecutionFloor", func(b *testing.B) {
		s := benchStore(b)
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			i++
			key := idempotency.StorageKey("", fmt.Sprint("k", i))
			if _, err := s.Acquire(ctx, idempotency.AcquireRequest{Key: key, Token: "t", Fingerprint: "fp", Lease: 10 * time.Second, TTL: time.Hour}); err != nil {
				b.Fatal(err)
			}
			v, _ := fn(ctx)
			body, _ := json.Marshal(v)
			resp := &idempotency.Response{Status: http.StatusOK, Header: http.Header{"Content-Type": {"application/json"}}, Body: body}
			if err := s.Complete(ctx, key, "t", resp, time.Hour); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("Replay", func(b *testing.B) {
		r := idempotency.NewRunner(benchStore(b))
		if _, err := idempotency.Do(ctx, r, call("k"), fn); err != nil {
			b.Fatal(err)
		}
		b.ReportAllocs()
		for b.Loop() {
			if res, err := idempotency.Do(ctx, r, call("k"), fn); err != nil || !res.Replayed {
				b.Fatal(err)
			}
		}
	})
	b.Run("ReplayFloor", func(b *testing.B) {
		s := benchStore(b)
		key := idempotency.StorageKey("", "k")
		req := idempotency.AcquireRequest{Key: key, Token: "t", Fingerprint: "fp", Lease: 10 * time.Second, TTL: time.Hour}
		s.Acquire(ctx, req)
		body, _ := json.Marshal(receipt{ID: "ch_1", Amount: 1999})
		s.Complete(ctx, key, "t", &idempotency.Response{Status: http.StatusOK, Header: http.Header{"Content-Type": {"application/json"}}, Body: body}, time.Hour)
		req.Token = "dup"
		b.ReportAllocs()
		for b.Loop() {
			a, err := s.Acquire(ctx, req)
			if err != nil || a.Outcome != idempotency.Completed {
				b.Fatal(a.Outcome, err)
			}
			var v receipt
			if err := json.Unmarshal(a.Response.Body, &v); err != nil {
				b.Fatal(err)
			}
		}
	})
}
