// Package pgtest gives tests and benchmarks a PostgreSQL database of their own on a server that is already running: it creates a
// database named idemtest_<random hex> and drops it at the end, forcing
// its connections off.
//
// The server is the one at the URL in IDEMPOTENCY_POSTGRES_URL, or else the
// local one at DefaultURL (user postgres, trust authentication), when it
// answers. A test without a server is skipped with a message saying so,
// unless IDEMPOTENCY_REQUIRE_POSTGRES=1 (as CI sets it), which fails it
// instead. The user must be allowed to create databases. Only databases
// this package created are ever dropped.
package pgtest

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"net/url"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/go-idempotency/idempotency/internal/faultproxy"
)

// URLEnv names the environment variable holding the URL of the server to
// use (any database on it: the tests create their own), for example
// postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable.
const URLEnv = "IDEMPOTENCY_POSTGRES_URL"

// RequireEnv is the environment variable that, set to 1, turns a missing
// server from a skipped test into a failed one.
const RequireEnv = "IDEMPOTENCY_REQUIRE_POSTGRES"

// DefaultURL is the server used when URLEnv is not set: a local server
// with trust authentication, as a distribution's package sets it up.
const DefaultURL = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"

// DatabasePrefix starts the name of every database this package creates.
const DatabasePrefix = "idemtest_"

// connectTimeout bounds each connection to the server made to create or
// drop a database.
const connectTimeout = 5 * time.Second

// ServerURL returns the URL of the server: the value of URLEnv when it is
// set, else DefaultURL.
func ServerURL() string {
	if u := os.Getenv(URLEnv); u != "" {
		return u
	}
	return DefaultURL
}

// withDatabase returns the connection string s (a URL, or keyword=value
// settings) with its database replaced by name.
func withDatabase(s, name string) string {
	if u, err := url.Parse(s); err == nil && (u.Scheme == "postgres" || u.Scheme == "postgresql") {
		u.Path = "/" + name
		u.RawPath = ""
		return u.String()
	}
	// In keyword=value settings the last one of a keyword wins.
	return s + " dbname=" + name
}

// adminExec runs sql on a connection of its own to the server's database
// in cfg.
func adminExec(ctx context.Context, cfg *pgx.ConnConfig, sql string) error {
	ctx, cancel := context.WithTimeout(ctx, connectTimeout)
	defer cancel()
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	_, err = conn.Exec(ctx, sql)
	return err
}

// server parses ServerURL and checks once that the server answers, so that
// a package's tests without a server are skipped without each waiting for a
// connection.
var server = sync.OnceValues(func() (*pgx.ConnConfig, error) {
	cfg, err := pgx.ParseConfig(ServerURL())
	if err != nil {
		return nil, err
	}
	return cfg, adminExec(context.Background(), cfg, "SELECT 1")
})

// Database creates a database of its own for t on the server (see
// ServerURL) and returns its URL. The database is dropped when t ends,
// after the cleanups registered later (closing pools) have run, with its
// connections forced off (DROP DATABASE ... WITH (FORCE), PostgreSQL 13 and
// later). Without a server t is skipped, or failed under RequireEnv=1.
func Database(t testing.TB) string {
	t.Helper()
	cfg, err := server()
	if err != nil {
		msg := fmt.Sprintf("no PostgreSQL server at %s (%v): set %s to a server's URL", ServerURL(), err, URLEnv)
		if os.Getenv(RequireEnv) == "1" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	name := fmt.Sprintf("%s%016x", DatabasePrefix, rand.Uint64())
	if err := adminExec(context.Background(), cfg, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		t.Fatalf("pgtest: creating database %s: %v", name, err)
	}
	t.Cleanup(func() {
		if err := adminExec(context.Background(), cfg, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)"); err != nil {
			t.Errorf("pgtest: dropping database %s: %v", name, err)
		}
	})
	return withDatabase(ServerURL(), name)
}

// Pool returns a pool on a database of its own for t (see Database),
// closed when t ends. configure, when given, adjusts the pool's
// configuration first (MaxConns, a tracer, ...).
func Pool(t testing.TB, configure ...func(*pgxpool.Config)) *pgxpool.Pool {
	t.Helper()
	return PoolOn(t, Database(t), configure...)
}

// PoolOn returns a pool on the database at url, closed when t ends.
func PoolOn(t testing.TB, url string, configure ...func(*pgxpool.Config)) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range configure {
		c(cfg)
	}
	ctx, cancel := context.WithTimeout(context.Background(), connectTimeout)
	defer cancel()
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if err := pool.Ping(ctx); err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	return pool
}

// Terminate ends the server process (backend) pid with
// pg_terminate_backend, from a connection of its own, and waits until it
// is gone: its client's connection is then broken. It fails t when the
// backend does not exist or outlives a few seconds.
func Terminate(t testing.TB, pool *pgxpool.Pool, pid uint32) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), connectTimeout)
	defer cancel()
	var ok bool
	if err := pool.QueryRow(ctx, "SELECT pg_terminate_backend($1, 5000)", int32(pid)).Scan(&ok); err != nil {
		t.Fatalf("pgtest: terminating backend %d: %v", pid, err)
	}
	if !ok {
		t.Fatalf("pgtest: backend %d did not end", pid)
	}
}

// Proxy starts a faultproxy in front of the server cfg connects to (which
// must be on the loopback interface) and returns it with a copy of cfg that
// connects through it. The proxy is closed when t ends.
func Proxy(t testing.TB, cfg *pgx.ConnConfig) (*faultproxy.Proxy, *pgx.ConnConfig) {
	t.Helper()
	p, err := faultproxy.New(net.JoinHostPort(cfg.Host, strconv.Itoa(int(cfg.Port))))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	addr := netip.MustParseAddrPort(p.Addr())
	through := cfg.Copy()
	through.Host, through.Port, through.Fallbacks = addr.Addr().String(), addr.Port(), nil
	return p, through
}

// ProxiedPool returns a pool on the database at url whose connections go
// through a faultproxy (see Proxy), and the proxy. Both end with t.
func ProxiedPool(t testing.TB, url string, configure ...func(*pgxpool.Config)) (*pgxpool.Pool, *faultproxy.Proxy) {
	t.Helper()
	var p *faultproxy.Proxy
	pool := PoolOn(t, url, append([]func(*pgxpool.Config){func(c *pgxpool.Config) {
		p, c.ConnConfig = Proxy(t, c.ConnConfig)
	}}, configure...)...)
	return pool, p
}
