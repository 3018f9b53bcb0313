package main

import (
	"context"
	"fmt"
	"strconv"

	"github.com/go-idempotency/idempotency/internal/redisrecord"
	"github.com/go-idempotency/idempotency/pgstore"
	"github.com/go-idempotency/idempotency/redisstore"
)

var keyCmd = &command{
	name:    "key",
	summary: "scope + client key → storage key, Redis key and table row",
	usage:   "[-scope SCOPE] -key KEY [-prefix P] [-table T] [-json]",
	help: `
Computes where the middleware keeps the record of a request: the storage key
idempotency.StorageKey(scope, key), a hex SHA-256 of the scope and the client's
key, which is also the key_hash of the middleware's logs and events; the Redis
key (the redisstore prefix and the storage key); and the pgstore row (the table
and its key column). It needs no connection.

-key is the Idempotency-Key header's value as the client sent it: a bare token
(abc) or a quoted string ("abc", with \" and \\ escapes); it is parsed as the
middleware parses it. -scope is what the route's idempotency.WithKeyScope
function returned for the request (the user or tenant); leave it out for
routes without one.`,
	examples: `  idemctl key -scope user-42 -key 8e03978e-40d5-43e8-bc93-6894a57f9324
  idemctl key -key '"order-1001"' -prefix payments-api:idem:
  idemctl key -scope tenant-7 -key abc -json | jq -r .redis_key`,
	run: runKey,
}

func runKey(_ context.Context, c *cli, cmd *command, args []string) int {
	var t target
	fs := newFlagSet(cmd, &t)
	prefix := fs.String("prefix", redisstore.DefaultPrefix, "the redisstore key `prefix`")
	table := fs.String("table", pgstore.DefaultTable, "the pgstore `table`")
	asJSON := fs.Bool("json", false, "print JSON")
	pos, status, ok := parse(c, cmd, fs, args)
	if !ok {
		return status
	}
	if !t.keySet {
		return c.usageFailed(cmd, usagef("-key is required"))
	}
	key, err := t.storageKey(pos, *prefix)
	if err != nil {
		return c.fail(cmd, err)
	}
	tb, err := parseTable(*table)
	if err != nil {
		return c.fail(cmd, err)
	}
	out := struct {
		Scope      string `json:"scope"`
		Key        string `json:"key"`
		StorageKey string `json:"storage_key"`
		RedisKey   string `json:"redis_key"`
		Channel    string `json:"redis_channel"`
		Table      string `json:"postgres_table"`
		SQL        string `json:"postgres_query"`
	}{
		Scope: t.scope, Key: t.key, StorageKey: key,
		RedisKey: *prefix + key, Channel: redisrecord.Channel(*prefix + key),
		Table: tb.String(), SQL: fmt.Sprintf("SELECT * FROM %s WHERE key = '%s';", tb.Quoted(), key),
	}
	if *asJSON {
		return c.printJSON(cmd, out)
	}
	fmt.Fprintf(c.stdout, "scope          %s\n", strconv.Quote(out.Scope))
	fmt.Fprintf(c.stdout, "key            %s\n", strconv.Quote(out.Key))
	fmt.Fprintf(c.stdout, "storage key    %s\n", out.StorageKey)
	fmt.Fprintf(c.stdout, "redis key      %s\n", out.RedisKey)
	fmt.Fprintf(c.stdout, "redis channel  %s\n", out.Channel)
	fmt.Fprintf(c.stdout, "postgres       %s\n", out.SQL)
	return exitOK
}
