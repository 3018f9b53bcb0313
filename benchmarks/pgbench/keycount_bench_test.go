package pgbench

import (
	"context"
	"fmt"
	"strconv"
	"testing"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/benchmarks/internal/keycount"
	"github.com/go-idempotency/idempotency/internal/pgtest"
	"github.com/go-idempotency/idempotency/pgstore"
)

var ctx = context.Background()

// copySQL fills a table with copies of its record $1, under the keys
// k0 .. k<$2 - 1>.
const copySQL = `INSERT INTO %[1]s (key, state, token, fingerprint, epoch, lease_until, ttl_until, watched, status, headers, body, body_omitted, updated_at)
SELECT 'k' || g, state, token, fingerprint, epoch, lease_until, ttl_until, watched, status, headers, body, body_omitted, updated_at
FROM %[1]s, generate_series(0, $2::int - 1) AS g WHERE key = $1`

// BenchmarkKeyCount measures the cost of a request's store calls as the
// number of live records in PostgreSQL grows from 10^3 to 10^6, in
// lockstep: four tables of one database hold 10^3, 10^4, 10^5 and 10^6
// COMPLETE records, and every op makes the request once on each, in an
// order that rotates from op to op, so that all sizes meet the same
// background load. Replay is Acquire of a record picked at random;
// FirstExecution is Acquire of a new key, then Complete. Records hold a
// 14-byte body. It reports the mean time of a request at each size
// (ns/req@keys=N).
func BenchmarkKeyCount(b *testing.B) {
	pool := pgtest.Pool(b)
	stores := make([]idempotency.Store, len(keycount.Sizes))
	for j, n := range keycount.Sizes {
		table := fmt.Sprintf("records_%d", n)
		if err := pgstore.Migrate(ctx, pool, pgstore.WithTable(table)); err != nil {
			b.Fatal(err)
		}
		s := pgstore.New(pool, pgstore.WithTable(table))
		b.Cleanup(func() { s.Close() })
		if err := keycount.Template(ctx, s); err != nil {
			b.Fatal(err)
		}
		if _, err := pool.Exec(ctx, fmt.Sprintf(copySQL, s.Table()), keycount.TemplateKey, n); err != nil {
			b.Fatal(err)
		}
		if _, err := pool.Exec(ctx, "ANALYZE "+s.Table()); err != nil {
			b.Fatal(err)
		}
		stores[j] = s
	}
	keycount.Run(b, stores, func(n uint64) string { return "k" + strconv.FormatUint(n, 10) }, nil)
}
