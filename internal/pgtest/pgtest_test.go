package pgtest

import (
	"context"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
)

func TestWithDatabase(t *testing.T) {
	for in, want := range map[string]string{
		"postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable": "postgres://postgres@127.0.0.1:5432/idemtest_x?sslmode=disable",
		"postgresql://u:p@localhost/app":                              "postgresql://u:p@localhost/idemtest_x",
		"postgres://127.0.0.1":                                        "postgres://127.0.0.1/idemtest_x",
		"host=127.0.0.1 user=postgres dbname=postgres":                "host=127.0.0.1 user=postgres dbname=postgres dbname=idemtest_x",
	} {
		got := withDatabase(in, "idemtest_x")
		if got != want {
			t.Errorf("withDatabase(%q) = %q; want %q", in, got, want)
		}
		cfg, err := pgx.ParseConfig(got)
		if err != nil || cfg.Database != "idemtest_x" {
			t.Errorf("%q parses to database %q (%v)", got, cfg.Database, err)
		}
	}
}

// TestDatabase: a test's database exists while it runs, is its own (no
// tables), and is gone once the test ended.
func TestDatabase(t *testing.T) {
	var name string
	t.Run("owner", func(t *testing.T) {
		pool := Pool(t)
		if err := pool.QueryRow(context.Background(), "SELECT current_database()").Scan(&name); err != nil {
			t.Fatal(err)
		}
		if !strings.HasPrefix(name, DatabasePrefix) {
			t.Fatalf("database %q", name)
		}
		var tables int
		if err := pool.QueryRow(context.Background(),
			"SELECT count(*) FROM pg_tables WHERE schemaname = 'public'").Scan(&tables); err != nil || tables != 0 {
			t.Fatalf("%d tables in a new database (%v)", tables, err)
		}
		// A connection still open when the test ends does not keep the
		// database from being dropped.
		conn, err := pgx.Connect(context.Background(), pool.Config().ConnConfig.ConnString())
		if err != nil {
			t.Fatal(err)
		}
		_ = conn // left open on purpose
	})
	if name == "" {
		t.Skip("no database was made")
	}
	cfg, err := pgx.ParseConfig(ServerURL())
	if err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.ConnectConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	var exists bool
	if err := conn.QueryRow(context.Background(), "SELECT EXISTS (SELECT FROM pg_database WHERE datname = $1)", name).Scan(&exists); err != nil {
		t.Fatal(err)
	}
	if exists {
		t.Fatalf("database %s outlived its test", name)
	}
}

// TestRequire: without a server, a test is skipped, or fails under
// IDEMPOTENCY_REQUIRE_POSTGRES=1. It runs this package's helper test in a
// child process pointed at a port where nothing listens.
func TestRequire(t *testing.T) {
	if os.Getenv("PGTEST_CHILD") == "1" {
		Database(t)
		return
	}
	if testing.Short() {
		t.Skip("runs a child test process")
	}
	for require, want := range map[string]string{"": "--- SKIP", "1": "--- FAIL"} {
		cmd := exec.Command(os.Args[0], "-test.run", "^TestRequire$", "-test.v")
		cmd.Env = append(os.Environ(), "PGTEST_CHILD=1", URLEnv+"=postgres://nobody@127.0.0.1:1/none?connect_timeout=2", RequireEnv+"="+require)
		out, _ := cmd.CombinedOutput()
		if !strings.Contains(string(out), want) || !strings.Contains(string(out), URLEnv) {
			t.Errorf("%s=%q: want %s with a message naming %s; got:\n%s", RequireEnv, require, want, URLEnv, out)
		}
	}
}
