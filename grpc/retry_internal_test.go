package idemgrpc

import (
	"context"
	"errors"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
)

// fakeClock is the retrier's time: sleeps advance it at once.
type fakeClock struct {
	now    time.Time
	sleeps []time.Duration
}

func newRetrier(clock *fakeClock, opts ...ClientOption) *retrier {
	return &retrier{
		cfg: newConfig("test", opts, ClientOption.applyClient),
		now: func() time.Time { return clock.now },
		sleep: func(ctx context.Context, d time.Duration) error {
			clock.sleeps = append(clock.sleeps, d)
			clock.now = clock.now.Add(d)
			return ctx.Err()
		},
		jitter: func(ceiling time.Duration) time.Duration { return ceiling },
	}
}

// script is an invoker that answers the attempts with errs in turn (nil
// after the last) and records each attempt's key.
type script struct {
	errs []error
	keys []string
}

func (s *script) invoke(ctx context.Context, _ string, _, _ any, _ *grpc.ClientConn, _ ...grpc.CallOption) error {
	md, _ := metadata.FromOutgoingContext(ctx)
	s.keys = append(s.keys, md.Get(MetadataKey)...)
	if len(s.keys) > len(s.errs) {
		return nil
	}
	return s.errs[len(s.keys)-1]
}

func unavailable(retry time.Duration) error {
	st := status.New(codes.Unavailable, "in flight")
	if retry > 0 {
		st, _ = st.WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(retry)})
	}
	return st.Err()
}

func TestRetrierBackoff(t *testing.T) {
	clock := &fakeClock{now: time.Unix(0, 0)}
	c := newRetrier(clock, WithBackoff(100*time.Millisecond, 300*time.Millisecond))
	s := &script{errs: []error{unavailable(0), unavailable(2 * time.Second), unavailable(0), unavailable(0)}}
	if err := c.intercept(context.Background(), "/s.S/M", nil, nil, nil, s.invoke); err != nil {
		t.Fatal(err)
	}
	want := []time.Duration{100 * time.Millisecond, 2 * time.Second, 300 * time.Millisecond, 300 * time.Millisecond}
	if len(clock.sleeps) != len(want) {
		t.Fatalf("waits %v, want %v", clock.sleeps, want)
	}
	for i := range want {
		if clock.sleeps[i] != want[i] {
			t.Fatalf("waits %v, want %v: doubling to the cap, or the RetryInfo delay when longer", clock.sleeps, want)
		}
	}
	for _, k := range s.keys {
		if k != s.keys[0] || len(s.keys) != 5 {
			t.Fatalf("keys %q, want one key on all 5 attempts", s.keys)
		}
	}
}

func TestRetrierGivesUp(t *testing.T) {
	always := func() *script {
		return &script{errs: []error{unavailable(time.Second), unavailable(time.Second), unavailable(time.Second), unavailable(time.Second)}}
	}
	t.Run("MaxAttempts", func(t *testing.T) {
		s := always()
		err := newRetrier(&fakeClock{}, WithMaxAttempts(2)).intercept(context.Background(), "/s.S/M", nil, nil, nil, s.invoke)
		if status.Code(err) != codes.Unavailable || len(s.keys) != 2 {
			t.Fatalf("%v after %d attempts, want the last error after 2", err, len(s.keys))
		}
	})
	t.Run("MaxElapsed", func(t *testing.T) {
		s := always()
		err := newRetrier(&fakeClock{}, WithMaxElapsed(2500*time.Millisecond)).intercept(context.Background(), "/s.S/M", nil, nil, nil, s.invoke)
		if status.Code(err) != codes.Unavailable || len(s.keys) != 3 {
			t.Fatalf("%v after %d attempts, want the last error after 3 (waits of 1s within 2.5s)", err, len(s.keys))
		}
	})
	t.Run("Deadline", func(t *testing.T) {
		s := always()
		clock := &fakeClock{now: time.Now()}
		ctx, cancel := context.WithDeadline(context.Background(), clock.now.Add(500*time.Millisecond))
		defer cancel()
		err := newRetrier(clock).intercept(ctx, "/s.S/M", nil, nil, nil, s.invoke)
		if status.Code(err) != codes.Unavailable || len(s.keys) != 1 || len(clock.sleeps) != 0 {
			t.Fatalf("%v after %d attempts and waits %v; want no wait past the deadline", err, len(s.keys), clock.sleeps)
		}
	})
	t.Run("Cancelled", func(t *testing.T) {
		s := always()
		ctx, cancel := context.WithCancel(context.Background())
		c := newRetrier(&fakeClock{})
		c.sleep = func(ctx context.Context, d time.Duration) error { cancel(); return ctx.Err() }
		err := c.intercept(ctx, "/s.S/M", nil, nil, nil, s.invoke)
		if status.Code(err) != codes.Canceled || len(s.keys) != 1 {
			t.Fatalf("%v after %d attempts, want Canceled after 1", err, len(s.keys))
		}
	})
	t.Run("NotRetryable", func(t *testing.T) {
		s := &script{errs: []error{status.Error(codes.Internal, "released"), errors.New("never reached")}}
		err := newRetrier(&fakeClock{}).intercept(context.Background(), "/s.S/M", nil, nil, nil, s.invoke)
		if status.Code(err) != codes.Internal || len(s.keys) != 1 {
			t.Fatalf("%v after %d attempts, want Internal after 1", err, len(s.keys))
		}
	})
}
