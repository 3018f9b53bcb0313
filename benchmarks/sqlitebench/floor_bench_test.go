package sqlitebench

import (
	"context"
	"fmt"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/benchmarks/internal/sqlitefloor"
	"github.com/go-idempotency/idempotency/sqlitestore"
)

// The requests of BenchmarkFloor: those of BenchmarkHTTP (a 1 KiB body,
// a 64-byte fingerprint and key, a lease of a minute and a TTL of an
// hour), on 256 replayed records.
const (
	floorBody    = 1 << 10
	floorReplays = 256
)

var (
	floorResponse = &idempotency.Response{Status: http.StatusCreated, Header: http.Header{
		"Content-Type": {"application/json"}, "Content-Length": {strconv.Itoa(floorBody)}}, Body: []byte(strings.Repeat("x", floorBody))}
	floorRecord = sqlitefloor.Record{
		Fingerprint: []byte(strings.Repeat("f", 64)),
		Header:      []byte("\x00\x00\x00\xc9Content-Type\x00application/json\x00Content-Length\x001024\x00"),
		Body:        floorResponse.Body,
		Lease:       time.Minute,
		TTL:         time.Hour,
	}
	// floorKeys numbers the keys of first executions, unique across the
	// runs of a benchmark binary.
	floorKeys atomic.Int64
)

// floorKey is the key of record n, 64 bytes as the middleware's are.
func floorKey(prefix string, n int64) string { return fmt.Sprintf("%s%0*d", prefix, 64-len(prefix), n) }

// floorSide is one side of BenchmarkFloor: the three requests on a file.
type floorSide struct {
	replay, first, tx func(ctx context.Context, key string) error
}

// storeSide is sqlitestore's calls for each request, as the middleware
// makes them: Acquire (a replay); Acquire, then Complete; Acquire,
// BeginTx, the handler's payment row in the transaction, Tx.Complete.
func storeSide(s *sqlitestore.Store) floorSide {
	req := func(key string) idempotency.AcquireRequest {
		return idempotency.AcquireRequest{Key: key, Token: "token-" + key[len(key)-16:], Fingerprint: string(floorRecord.Fingerprint),
			Lease: floorRecord.Lease, TTL: floorRecord.TTL}
	}
	acquire := func(ctx context.Context, key string, want idempotency.AcquireOutcome) error {
		a, err := s.Acquire(ctx, req(key))
		if err == nil && a.Outcome != want {
			err = fmt.Errorf("%s: outcome %v, want %v", key, a.Outcome, want)
		}
		return err
	}
	return floorSide{
		replay: func(ctx context.Context, key string) error { return acquire(ctx, key, idempotency.Completed) },
		first: func(ctx context.Context, key string) error {
			if err := acquire(ctx, key, idempotency.Acquired); err != nil {
				return err
			}
			return s.Complete(ctx, key, req(key).Token, floorResponse, floorRecord.TTL)
		},
		tx: func(ctx context.Context, key string) error {
			if err := acquire(ctx, key, idempotency.Acquired); err != nil {
				return err
			}
			tx, err := s.BeginTx(ctx, key, req(key).Token)
			if err != nil {
				return err
			}
			if _, err := tx.Handle().(*sqlitestore.HandlerTx).ExecContext(ctx, sqlitefloor.PaymentSQL, key, floorBody); err != nil {
				tx.Rollback(ctx)
				return err
			}
			return tx.Complete(ctx, floorResponse, floorRecord.TTL)
		},
	}
}

// floorOf is the record floor's statements for each request.
func floorOf(f *sqlitefloor.Floor) floorSide {
	return floorSide{
		replay: func(ctx context.Context, key string) error {
			_, err := f.Read(ctx, key)
			return err
		},
		first: func(ctx context.Context, key string) error {
			if err := f.Create(ctx, key); err != nil {
				return err
			}
			return f.Store(ctx, key)
		},
		tx: func(ctx context.Context, key string) error {
			if err := f.Create(ctx, key); err != nil {
				return err
			}
			return f.StoreWithPayment(ctx, key, floorBody)
		},
	}
}

// BenchmarkFloor puts sqlitestore's calls beside its record floor
// (internal/sqlitefloor: the same round trips by hand, their statements
// prepared, checking nothing), in process, each on a file of its own with
// the store's settings, for a replay, a first execution and a
// transactional route's first execution (see storeSide). Every op makes
// the request once on each side, in an order that alternates from op to
// op, so that both meet the same background load; it reports the mean
// time of a request on each side (ns/req@side=store, ns/req@side=floor)
// and their ratio (store/floor).
//
//	go test -run '^$' -bench Floor -benchtime 1500x -count 6 .
func BenchmarkFloor(b *testing.B) {
	dir := b.TempDir()
	open := func(name string) *sqlitestore.Store {
		s, err := sqlitestore.Open(filepath.Join(dir, name))
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { s.Close() })
		return s
	}
	store, fs := open("store.db"), open("floor.db")
	if _, err := store.DB().ExecContext(ctx, sqlitefloor.PaymentsSQL); err != nil {
		b.Fatal(err)
	}
	f, err := sqlitefloor.New(ctx, fs.DB(), floorRecord)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(f.Close)
	sides := [2]floorSide{storeSide(store), floorOf(f)}
	names := [2]string{"store", "floor"}
	for _, side := range sides {
		for i := range int64(floorReplays) {
			if err := side.first(ctx, floorKey("r", i)); err != nil {
				b.Fatal(err)
			}
		}
	}
	for _, work := range []string{"replay", "first", "tx"} {
		b.Run("work="+work, func(b *testing.B) {
			// Each request has a context of its own that ends with it, as
			// an HTTP request's does: the driver then watches it in every
			// statement, as it does under the middleware.
			op := func(side floorSide, key string) error {
				ctx, cancel := context.WithCancel(ctx)
				defer cancel()
				switch work {
				case "replay":
					return side.replay(ctx, key)
				case "first":
					return side.first(ctx, key)
				}
				return side.tx(ctx, key)
			}
			key := func(i int) string {
				if work == "replay" {
					return floorKey("r", int64(i%floorReplays))
				}
				return floorKey("n", floorKeys.Add(1))
			}
			for i := range 20 { // untimed: opens the connections, prepares the statements
				for _, side := range sides {
					if err := op(side, key(i)); err != nil {
						b.Fatal(err)
					}
				}
			}
			var total [2]time.Duration
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				k := key(i)
				for n := range sides {
					j := (n + i) % len(sides)
					start := time.Now()
					if err := op(sides[j], k); err != nil {
						b.Fatal(err)
					}
					total[j] += time.Since(start)
				}
			}
			b.StopTimer()
			for j, name := range names {
				b.ReportMetric(float64(total[j])/float64(b.N), "ns/req@side="+name)
			}
			b.ReportMetric(float64(total[0])/float64(total[1]), "store/floor")
		})
	}
}
