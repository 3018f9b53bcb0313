package main

import (
	"context"
	"encoding/hex"
	"flag"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/internal/pgname"
	"github.com/go-idempotency/idempotency/pgstore"
	"github.com/go-idempotency/idempotency/redisstore"
	"github.com/go-idempotency/idempotency/servercheck"
)

// connFlags are the flags that say where the records are.
type connFlags struct {
	redis, sentinel, master string
	cluster                 bool
	postgres                string
	sqlite                  string
	prefix, table           string
	timeout                 time.Duration

	// withSQLite adds -sqlite (and SQLITE_PATH): the command (check) takes
	// an SQLite file of sqlitestore, which is a checker, not a backend.
	withSQLite bool
}

// register adds the connection flags to fs.
func (f *connFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.redis, "redis", "", "Redis `address` (host:port) or URL (redis://[user:password@]host:port[/db]); env REDIS_URL, then REDIS_ADDR")
	fs.BoolVar(&f.cluster, "cluster", false, "-redis names the seed nodes of a Redis Cluster, comma-separated")
	fs.StringVar(&f.sentinel, "sentinel", "", "Redis behind Sentinel: the sentinels' `addresses`, comma-separated (with -master)")
	fs.StringVar(&f.master, "master", "", "the master `name` the sentinels monitor")
	fs.StringVar(&f.postgres, "postgres", "", "PostgreSQL connection `URL`; env DATABASE_URL")
	fs.StringVar(&f.prefix, "prefix", redisstore.DefaultPrefix, "the redisstore key `prefix` (redisstore.WithPrefix)")
	if f.withSQLite {
		fs.StringVar(&f.sqlite, "sqlite", "", "the SQLite `file` of sqlitestore (never created); env SQLITE_PATH")
		fs.StringVar(&f.table, "table", pgstore.DefaultTable, "the `table`: pgstore's, optionally schema.table (pgstore.WithTable), or sqlitestore's (sqlitestore.WithTable)")
	} else {
		fs.StringVar(&f.table, "table", pgstore.DefaultTable, "the pgstore `table`, optionally schema.table (pgstore.WithTable)")
	}
	fs.DurationVar(&f.timeout, "timeout", 30*time.Second, "give up after this `duration` (0: never)")
}

// connected connects to the store the flags (or the environment) name and
// returns what fn returns with it, all within -timeout: the exit status of
// cmd, which fails when the store cannot be reached.
func (f *connFlags) connected(ctx context.Context, c *cli, cmd *command, fn func(context.Context, backend) int) int {
	return f.checked(ctx, c, cmd, func(ctx context.Context, s checker) int {
		b, ok := s.(backend)
		if !ok {
			return c.fail(cmd, fmt.Errorf("%s: idemctl %s reads Redis and PostgreSQL only; check reads an SQLite file", s.describe(), cmd.name))
		}
		return fn(ctx, b)
	})
}

// checked is connected for check, whose store may be an SQLite file.
func (f *connFlags) checked(ctx context.Context, c *cli, cmd *command, fn func(context.Context, checker) int) int {
	if f.timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, f.timeout)
		defer cancel()
	}
	s, err := f.open(ctx, c)
	if err != nil {
		return c.fail(cmd, err)
	}
	defer s.close()
	return fn(ctx, s)
}

// open connects to the store the flags (or the environment) name: a
// backend, or with withSQLite an SQLite file.
func (f *connFlags) open(ctx context.Context, c *cli) (checker, error) {
	if f.prefix == "" {
		return nil, usagef("-prefix is empty")
	}
	redisAddr, pgURL, sqlitePath := f.redis, f.postgres, f.sqlite
	if f.sentinel != "" && redisAddr != "" {
		return nil, usagef("-sentinel and -redis name two Redis deployments: give one")
	}
	if f.sentinel != "" && f.master == "" {
		return nil, usagef("-sentinel needs -master, the name the sentinels monitor")
	}
	isRedis := redisAddr != "" || f.sentinel != ""
	switch {
	case isRedis && pgURL != "":
		return nil, usagef("both Redis and PostgreSQL given: give one")
	case sqlitePath != "" && isRedis:
		return nil, usagef("both Redis and SQLite given: give one")
	case sqlitePath != "" && pgURL != "":
		return nil, usagef("both PostgreSQL and SQLite given: give one")
	case isRedis, pgURL != "", sqlitePath != "":
	default:
		var set, flags []string
		envRedis := c.getenv("REDIS_URL")
		if envRedis == "" {
			envRedis = c.getenv("REDIS_ADDR")
		}
		if envRedis != "" {
			set, flags = append(set, "REDIS_URL (or REDIS_ADDR)"), append(flags, "-redis")
		}
		envPG := c.getenv("DATABASE_URL")
		if envPG != "" {
			set, flags = append(set, "DATABASE_URL"), append(flags, "-postgres")
		}
		envSQLite := c.getenv("SQLITE_PATH")
		if envSQLite != "" && f.withSQLite {
			set, flags = append(set, "SQLITE_PATH"), append(flags, "-sqlite")
		}
		switch {
		case len(set) > 1:
			both := ""
			if len(set) == 2 {
				both = "both "
			}
			return nil, usagef("%s%s are set: choose with %s", both, joinList(set, "and"), joinList(flags, "or"))
		case envRedis != "":
			redisAddr, isRedis = envRedis, true
		case envPG != "":
			pgURL = envPG
		case envSQLite != "" && f.withSQLite:
			sqlitePath = envSQLite
		case f.withSQLite:
			return nil, usagef("no store: give -redis, -sentinel, -postgres or -sqlite (or set REDIS_URL, DATABASE_URL or SQLITE_PATH)")
		case envSQLite != "":
			return nil, usagef("no store: give -redis, -sentinel or -postgres (or set REDIS_URL or DATABASE_URL); SQLITE_PATH is set, and of idemctl's commands check alone reads an SQLite file")
		default:
			return nil, usagef("no store: give -redis, -sentinel or -postgres (or set REDIS_URL or DATABASE_URL)")
		}
	}
	if sqlitePath != "" {
		return &sqliteFile{path: sqlitePath, table: f.table}, nil
	}
	if isRedis {
		client, where, err := f.redisClient(redisAddr, c.getenv("REDIS_PASSWORD"))
		if err != nil {
			return nil, err
		}
		return &redisBackend{client: client, where: where, prefix: f.prefix}, nil
	}
	b, err := openPostgres(ctx, pgURL, f.table)
	if err != nil {
		return nil, err
	}
	return b, nil
}

// openPostgres connects to the PostgreSQL server at url, for the table
// named table (a -table flag): pgstore's records, or the outbox.
func openPostgres(ctx context.Context, url, table string) (*pgBackend, error) {
	t, err := parseTable(table)
	if err != nil {
		return nil, err
	}
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		return nil, usagef("PostgreSQL connection string: %v", err)
	}
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("connecting to PostgreSQL: %w", err)
	}
	return &pgBackend{conn: conn, table: t, where: fmt.Sprintf("postgres %s:%d/%s", cfg.Host, cfg.Port, cfg.Database)}, nil
}

// redisClient returns a client for the deployment the flags name, and a
// description of it.
func (f *connFlags) redisClient(addr, password string) (redis.UniversalClient, string, error) {
	const (
		dialTimeout = 5 * time.Second
		ioTimeout   = 5 * time.Second
	)
	switch {
	case f.sentinel != "":
		opt := &redis.FailoverOptions{
			MasterName:            f.master,
			SentinelAddrs:         splitList(f.sentinel),
			Password:              password,
			DialTimeout:           dialTimeout,
			ReadTimeout:           ioTimeout,
			WriteTimeout:          ioTimeout,
			MaxRetries:            -1,
			ContextTimeoutEnabled: true,
		}
		return redis.NewFailoverClient(opt), fmt.Sprintf("redis sentinel master %q", f.master), nil
	case f.cluster:
		var opt *redis.ClusterOptions
		if strings.Contains(addr, "://") {
			var err error
			if opt, err = redis.ParseClusterURL(addr); err != nil {
				return nil, "", usagef("-redis: %v", err)
			}
		} else {
			opt = &redis.ClusterOptions{Addrs: splitList(addr), Password: password}
		}
		opt.DialTimeout, opt.ReadTimeout, opt.WriteTimeout = dialTimeout, ioTimeout, ioTimeout
		opt.MaxRetries, opt.ContextTimeoutEnabled = -1, true
		return redis.NewClusterClient(opt), "redis cluster " + strings.Join(opt.Addrs, ","), nil
	}
	var opt *redis.Options
	if strings.Contains(addr, "://") {
		var err error
		if opt, err = redis.ParseURL(addr); err != nil {
			return nil, "", usagef("-redis: %v", err)
		}
	} else {
		if strings.Contains(addr, ",") {
			return nil, "", usagef("-redis %q names several nodes: add -cluster for a Redis Cluster", addr)
		}
		opt = &redis.Options{Addr: addr, Password: password}
	}
	opt.DialTimeout, opt.ReadTimeout, opt.WriteTimeout = dialTimeout, ioTimeout, ioTimeout
	opt.MaxRetries, opt.ContextTimeoutEnabled = -1, true
	return redis.NewClient(opt), "redis " + opt.Addr, nil
}

func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

// parseTable validates a -table flag as pgstore.WithTable does.
func parseTable(name string) (pgname.Table, error) {
	t, err := pgname.ParseTable(name)
	if err != nil {
		return pgname.Table{}, usagef("-table %v", err)
	}
	return t, nil
}

// target names one record: by -scope and -key, or by a storage key (or
// Redis key) as the argument.
type target struct {
	scope, key string
	keySet     bool
}

func (t *target) register(fs *flag.FlagSet) {
	fs.StringVar(&t.scope, "scope", "", "the record's `scope`: what the middleware's WithKeyScope returned (empty without one)")
	fs.Func("key", "the client's Idempotency-Key `value`, as sent (bare, or quoted with \\\" and \\\\ escapes)", func(v string) error {
		t.key, t.keySet = v, true
		return nil
	})
}

// storageKey returns the storage key the flags and positional arguments
// name. prefix is stripped from a Redis key given as the argument.
func (t *target) storageKey(pos []string, prefix string) (string, error) {
	switch {
	case t.keySet && len(pos) > 0:
		return "", usagef("give -key or a storage key, not both")
	case t.keySet:
		key, err := idempotency.ParseKey(t.key)
		if err != nil {
			return "", usagef("-key: %v", err)
		}
		return idempotency.StorageKey(t.scope, key), nil
	case len(pos) == 0:
		return "", usagef("name a record: -scope and -key, or its storage key")
	case len(pos) > 1:
		return "", usagef("one record at a time: %d arguments given", len(pos))
	case t.scope != "":
		return "", usagef("-scope goes with -key, not with a storage key")
	}
	k := strings.TrimPrefix(pos[0], prefix)
	if !isStorageKey(k) {
		return "", usagef("%q is not a storage key (64 lower-case hex digits, or the prefix %q and them)", pos[0], prefix)
	}
	return k, nil
}

// isStorageKey reports whether k has the form of idempotency.StorageKey's
// result.
func isStorageKey(k string) bool {
	if len(k) != 64 || strings.ToLower(k) != k {
		return false
	}
	_, err := hex.DecodeString(k)
	return err == nil
}

// checker is a store that check judges: a backend, or an SQLite file.
type checker interface {
	// describe names the store for people.
	describe() string
	// check judges the server's settings.
	check(ctx context.Context, opts checkOptions) (servercheck.Report, error)
	close()
}

// joinList joins words as a list in prose, the last two by conj: "a",
// "a or b", "a, b or c".
func joinList(words []string, conj string) string {
	if len(words) < 2 {
		return strings.Join(words, "")
	}
	return strings.Join(words[:len(words)-1], ", ") + " " + conj + " " + words[len(words)-1]
}

// backend is a store idemctl works on.
type backend interface {
	checker
	// location names a record's place: its Redis key or its table.
	location(key string) string
	// inspect returns the record under key with at most bodyLimit bytes of
	// its body, or nil when there is none.
	inspect(ctx context.Context, key string, bodyLimit int) (*record, error)
	// remove deletes the record under key when rule allows it.
	remove(ctx context.Context, key string, rule removal) (*record, error)
	// list passes every record that opts selects to emit.
	list(ctx context.Context, c *cli, opts listOptions, emit func(*record) error) error
	// stats counts the records and their memory.
	stats(ctx context.Context, c *cli, opts statsOptions) (*statsResult, error)
}
