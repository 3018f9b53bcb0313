package main

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/go-idempotency/idempotency/internal/redisrecord"
	"github.com/go-idempotency/idempotency/internal/wire"
	"github.com/go-idempotency/idempotency/servercheck"
)

// redisBackend works on redisstore's records: one hash per record at
// prefix + storage key (see redisstore/README.md, Record layout, and
// internal/redisrecord).
type redisBackend struct {
	client redis.UniversalClient
	where  string
	prefix string
}

func (b *redisBackend) describe() string { return fmt.Sprintf("%s, prefix %q", b.where, b.prefix) }

// location returns the Redis key of the record stored under key.
func (b *redisBackend) location(key string) string { return b.prefix + key }

func (b *redisBackend) close() { b.client.Close() }

// node returns the client of the node that holds rkey: the master of its
// slot on a Cluster, the client itself otherwise.
func (b *redisBackend) node(ctx context.Context, rkey string) (redis.Cmdable, error) {
	if cc, ok := b.client.(*redis.ClusterClient); ok {
		return cc.MasterForKey(ctx, rkey)
	}
	return b.client, nil
}

// readScript reads a record key in one round trip: see read.lua.
//
//go:embed read.lua
var readLua string

var readScript = redis.NewScript(readLua)

// What idemctl reads of each value of a record: list and stats enough for
// a head and a payload's headers (a larger value is read in part, and its
// length counted), inspect that much more than its body preview.
const (
	scanReadLimit    = 4 << 10
	inspectReadLimit = 64 << 10
)

// parseRead turns a reply of read.lua into a rawRecord; nil when there is
// no key.
func parseRead(reply any, now time.Time) (*rawRecord, error) {
	a, ok := reply.([]any)
	if !ok || len(a) != 3 {
		return nil, fmt.Errorf("read.lua: unexpected reply %v", reply)
	}
	typ, ok1 := a[0].(string)
	pttl, ok2 := a[1].(int64)
	fields, ok3 := a[2].([]any)
	if !ok1 || !ok2 || !ok3 || len(fields)%3 != 0 {
		return nil, fmt.Errorf("read.lua: unexpected reply %v", reply)
	}
	if typ == "none" || pttl == -2 {
		return nil, nil
	}
	r := &rawRecord{typ: typ, pttl: time.Duration(pttl) * time.Millisecond, now: now}
	if pttl < 0 {
		r.pttl = -1
	}
	for i := 0; i < len(fields); i += 3 {
		name, ok1 := fields[i].(string)
		size, ok2 := fields[i+1].(int64)
		value, ok3 := fields[i+2].(string)
		if !ok1 || !ok2 || !ok3 {
			return nil, fmt.Errorf("read.lua: unexpected field %v", fields[i:i+3])
		}
		r.fields = append(r.fields, rawField{name: name, size: size, value: value})
	}
	return r, nil
}

// read reads the record key of storage key key, with its body up to
// bodyLimit bytes; it returns nil when there is none.
func (b *redisBackend) read(ctx context.Context, key string, bodyLimit int) (*record, *rawRecord, error) {
	rkey := b.location(key)
	node, err := b.node(ctx, rkey)
	if err != nil {
		return nil, nil, err
	}
	reply, err := readScript.Run(ctx, node, []string{rkey}, inspectReadLimit+max(bodyLimit, 0)).Result()
	if err != nil {
		return nil, nil, err
	}
	now, err := node.Time(ctx).Result()
	if err != nil {
		return nil, nil, err
	}
	raw, err := parseRead(reply, now)
	if err != nil || raw == nil {
		return nil, nil, err
	}
	return decodeRedis(key, rkey, raw, bodyLimit), raw, nil
}

func (b *redisBackend) inspect(ctx context.Context, key string, bodyLimit int) (*record, error) {
	rec, _, err := b.read(ctx, key, bodyLimit)
	return rec, err
}

// deleteScript deletes a record key only while it holds what was read:
// see delete.lua.
//
//go:embed delete.lua
var deleteLua string

var deleteScript = redis.NewScript(deleteLua)

// deleteArgs returns deleteScript's ARGV for a record key read as raw and
// decoded as rec: a watched record's waiters are told it was released, as
// redisstore's release.lua tells them.
func (b *redisBackend) deleteArgs(key string, raw *rawRecord, rec *record) []any {
	message := ""
	if rec.Watched {
		message = "released"
	}
	args := []any{raw.typ, redisrecord.Channel(b.location(key)), message}
	if raw.typ != "hash" {
		return args
	}
	args = append(args, len(raw.fields))
	for _, f := range raw.fields {
		v := ""
		if f.whole() {
			v = "=" + f.value
		}
		args = append(args, f.name, f.size, v)
	}
	return args
}

// removeAttempts bounds how often remove reads a record that keeps
// changing under it.
const removeAttempts = 5

func (b *redisBackend) remove(ctx context.Context, key string, rule removal) (*record, error) {
	rkey := b.location(key)
	for range removeAttempts {
		rec, raw, err := b.read(ctx, key, 0)
		if err != nil {
			return nil, err
		}
		if rec == nil {
			return nil, errNotFound
		}
		if err := rule.judge(rec); err != nil {
			return rec, err
		}
		n, err := deleteScript.Run(ctx, b.client, []string{rkey}, b.deleteArgs(key, raw, rec)...).Int()
		if err != nil {
			return rec, err
		}
		if n == 1 {
			return rec, nil
		}
	}
	return nil, fmt.Errorf("the record changed under %d attempts in a row; nothing was deleted", removeAttempts)
}

// masters returns the nodes that hold records, with their names.
func (b *redisBackend) masters(ctx context.Context) ([]redis.Cmdable, []string, error) {
	cc, ok := b.client.(*redis.ClusterClient)
	if !ok {
		return []redis.Cmdable{b.client}, []string{b.where}, nil
	}
	var (
		mu    sync.Mutex
		nodes []*redis.Client
	)
	err := cc.ForEachMaster(ctx, func(_ context.Context, c *redis.Client) error {
		mu.Lock()
		nodes = append(nodes, c)
		mu.Unlock()
		return nil
	})
	if err != nil {
		return nil, nil, err
	}
	slices.SortFunc(nodes, func(a, b *redis.Client) int { return strings.Compare(a.Options().Addr, b.Options().Addr) })
	cmdables := make([]redis.Cmdable, len(nodes))
	names := make([]string, len(nodes))
	for i, n := range nodes {
		cmdables[i], names[i] = n, n.Options().Addr
	}
	return cmdables, names, nil
}

// matchPattern returns the SCAN pattern of record keys: the prefix, its
// glob characters escaped, and 64 characters.
func (b *redisBackend) matchPattern() string {
	var p strings.Builder
	for _, r := range b.prefix {
		if strings.ContainsRune(`*?[]\`, r) {
			p.WriteByte('\\')
		}
		p.WriteRune(r)
	}
	p.WriteString(strings.Repeat("?", 64))
	return p.String()
}

// scan calls batch with the storage keys of each SCAN batch on every node
// holding records, one node after another, and the node.
func (b *redisBackend) scan(ctx context.Context, count int64, pause time.Duration, prog *progress,
	batch func(node redis.Cmdable, keys []string) error) error {
	nodes, names, err := b.masters(ctx)
	if err != nil {
		return err
	}
	pattern := b.matchPattern()
	for i, node := range nodes {
		prog.node = names[i]
		var cursor uint64
		for {
			keys, next, err := node.Scan(ctx, cursor, pattern, count).Result()
			if err != nil {
				return fmt.Errorf("SCAN on %s: %w", names[i], err)
			}
			prog.scanned += int64(len(keys))
			var ours []string
			for _, k := range keys {
				if s := strings.TrimPrefix(k, b.prefix); len(s) == len(k)-len(b.prefix) && isStorageKey(s) {
					ours = append(ours, s)
				}
			}
			if len(ours) > 0 {
				if err := batch(node, ours); err != nil {
					return err
				}
			}
			prog.tick()
			if cursor = next; cursor == 0 {
				break
			}
			if err := sleep(ctx, pause); err != nil {
				return err
			}
		}
	}
	return nil
}

// readBatch reads the records of keys on node in one pipeline; keys gone
// in the meantime are left out.
func (b *redisBackend) readBatch(ctx context.Context, node redis.Cmdable, keys []string) ([]*record, error) {
	recs, err := b.tryReadBatch(ctx, node, keys)
	if redis.HasErrorPrefix(err, "NOSCRIPT") {
		// The first batch on node, or the server lost its scripts (a
		// restart, SCRIPT FLUSH).
		if err := readScript.Load(ctx, node).Err(); err != nil {
			return nil, err
		}
		recs, err = b.tryReadBatch(ctx, node, keys)
	}
	return recs, err
}

func (b *redisBackend) tryReadBatch(ctx context.Context, node redis.Cmdable, keys []string) ([]*record, error) {
	pipe := node.Pipeline()
	cmds := make([]*redis.Cmd, len(keys))
	for i, k := range keys {
		cmds[i] = readScript.EvalSha(ctx, pipe, []string{b.location(k)}, scanReadLimit)
	}
	tm := pipe.Time(ctx)
	_, _ = pipe.Exec(ctx)
	now, err := tm.Result()
	if err != nil {
		return nil, err
	}
	var out []*record
	for i, c := range cmds {
		reply, err := c.Result()
		if redis.HasErrorPrefix(err, "NOSCRIPT") {
			return nil, err
		}
		if err != nil {
			return nil, fmt.Errorf("reading %s: %w", b.location(keys[i]), err)
		}
		raw, err := parseRead(reply, now)
		if err != nil {
			return nil, err
		}
		if raw != nil {
			out = append(out, decodeRedis(keys[i], b.location(keys[i]), raw, 0))
		}
	}
	return out, nil
}

func (b *redisBackend) list(ctx context.Context, c *cli, opts listOptions, emit func(*record) error) error {
	prog := newProgress(c, opts.quiet, "keys")
	defer prog.done()
	return b.scan(ctx, int64(opts.batch), opts.pause, prog, func(node redis.Cmdable, keys []string) error {
		recs, err := b.readBatch(ctx, node, keys)
		if err != nil {
			return err
		}
		for _, r := range recs {
			opts.setAge(r)
			if opts.selects(r) {
				prog.matched++
				if err := emit(r); err != nil {
					return err
				}
			}
		}
		return nil
	})
}

func (b *redisBackend) stats(ctx context.Context, c *cli, opts statsOptions) (*statsResult, error) {
	res := newStatsResult(b.describe())
	prog := newProgress(c, opts.quiet, "keys")
	defer prog.done()
	err := b.scan(ctx, int64(opts.batch), opts.pause, prog, func(node redis.Cmdable, keys []string) error {
		recs, err := b.readBatch(ctx, node, keys)
		if err != nil {
			return err
		}
		pipe := node.Pipeline()
		type sample struct {
			cat *category
			cmd *redis.IntCmd
		}
		var samples []sample
		pending := map[*category]int64{}
		for _, r := range recs {
			cat := res.category(statsCategory(r))
			cat.Records++
			cat.BodyBytes += r.BodyLen
			if cat.Sampled+pending[cat] < int64(opts.sample) {
				pending[cat]++
				samples = append(samples, sample{cat, pipe.MemoryUsage(ctx, b.location(r.Key), 0)})
			}
		}
		if len(samples) > 0 {
			_, _ = pipe.Exec(ctx)
			for _, s := range samples {
				n, err := s.cmd.Result()
				if errors.Is(err, redis.Nil) {
					continue // gone since
				}
				if err != nil {
					return fmt.Errorf("MEMORY USAGE: %w", err)
				}
				s.cat.Sampled++
				s.cat.SampledBytes += n
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	res.Scanned = prog.scanned
	nodes, names, err := b.masters(ctx)
	if err != nil {
		return nil, err
	}
	for i, n := range nodes {
		info := n.InfoMap(ctx, "memory")
		if err := info.Err(); err != nil {
			return nil, err
		}
		used, _ := strconv.ParseInt(info.Item("Memory", "used_memory"), 10, 64)
		limit, _ := strconv.ParseInt(info.Item("Memory", "maxmemory"), 10, 64)
		res.Servers = append(res.Servers, serverMemory{Node: names[i], UsedMemory: used, MaxMemory: limit, Policy: info.Item("Memory", "maxmemory_policy")})
	}
	res.finish()
	return res, nil
}

// statsCategory names the group stats counts r in.
func statsCategory(r *record) string {
	if r.State == stateInProgress {
		if r.leaseLive() {
			return catLive
		}
		return catRanOut
	}
	return r.State
}

func (b *redisBackend) check(ctx context.Context, _ checkOptions) (servercheck.Report, error) {
	return servercheck.Redis(ctx, b.client)
}

// rawRecord is a record key as Redis holds it: its type, expiry and, for a
// hash, every field with (at most) the first bytes of its value, as
// read.lua reads it.
type rawRecord struct {
	typ    string        // TYPE: "hash" for a record
	pttl   time.Duration // PTTL: -1 without expiry
	fields []rawField    // HGETALL's order
	now    time.Time     // the server's TIME
}

// rawField is one field of a record's hash.
type rawField struct {
	name  string
	size  int64  // the value's length
	value string // its first bytes: all of it when len(value) == size
}

// whole reports whether f's value was read in full.
func (f rawField) whole() bool { return int64(len(f.value)) == f.size }

// field returns the field named name.
func (r *rawRecord) field(name string) (rawField, bool) {
	for _, f := range r.fields {
		if f.name == name {
			return f, true
		}
	}
	return rawField{}, false
}

// decodeRedis turns raw, the record key of storage key key at location,
// into a record, judging it as redisstore's acquire.lua does: a value that
// acquire.lua would report as corrupt is shown as corrupt, with its
// reason. bodyLimit bounds the body preview.
func decodeRedis(key, location string, raw *rawRecord, bodyLimit int) *record {
	rec := &record{Key: key, Location: location, ServerTime: raw.now}
	if raw.pttl >= 0 {
		d := raw.pttl
		rec.ExpiresIn = &d
	}
	corrupt := func(problem string) *record {
		rec.State, rec.Problem = stateCorrupt, problem
		return rec
	}
	if raw.typ != "hash" {
		return corrupt("the key holds a " + raw.typ + ", not a hash")
	}
	h, ok := raw.field(redisrecord.HeadField)
	switch {
	case !ok:
		return corrupt("field h is missing")
	case !h.whole():
		return corrupt(fmt.Sprintf("field h is %d bytes long, more than idemctl read", h.size))
	}
	hd, err := redisrecord.ParseHead(h.value)
	if err != nil {
		return corrupt(err.Error())
	}
	rec.Token, rec.Epoch, rec.Fingerprint = hd.Token, hd.Epoch, []byte(hd.Fingerprint)
	if hd.InProgress() {
		rec.State, rec.Watched = stateInProgress, hd.State == redisrecord.Watched
		rec.LeaseEnd = time.UnixMilli(hd.LeaseEnd)
		left := rec.LeaseEnd.Sub(raw.now.Truncate(time.Millisecond))
		rec.LeaseLeft = &left
		return rec
	}
	name := redisrecord.PayloadField(hd.Fingerprint)
	payload, ok := raw.field(name)
	if !ok {
		return corrupt(fmt.Sprintf("field %q (the payload) is missing", name))
	}
	rec.State = stateComplete
	start, end, err := redisrecord.MetaBounds(payload.value, int(payload.size))
	if err != nil {
		return corrupt(err.Error())
	}
	rec.BodyLen = payload.size - int64(end)
	if end > len(payload.value) {
		rec.Unread = "the headers were not read whole: inspect shows them"
		return rec
	}
	resp, err := wire.Decode(payload.value[start:end], "")
	switch {
	case err != nil:
		return corrupt(err.Error())
	case resp.BodyOmitted && rec.BodyLen > 0:
		return corrupt("body present but marked omitted")
	}
	rec.Status, rec.Header, rec.BodyOmitted = resp.Status, resp.Header, resp.BodyOmitted
	rec.Body = []byte(payload.value[end:min(len(payload.value), end+max(bodyLimit, 0))])
	return rec
}
