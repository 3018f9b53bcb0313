package redisstore

import (
	"context"
	"strings"
	"sync"

	"github.com/redis/go-redis/v9"
)

// completeAndWait runs sc, a complete script, and WAIT in one pipeline on one
// connection to the record's master, so that WAIT counts the replicas that
// acknowledged the script's write. On a Cluster it follows the redirects
// the client would follow for the script alone (see clusterCompleteAndWait).
// It reports a WAIT shortfall to the WithWAITErrorHandler.
func (s *Store) completeAndWait(ctx context.Context, sc *flaggedScript, rkey string, args []any) ([]any, error) {
	var c, w *redis.Cmd
	if cc, ok := s.client.(*redis.ClusterClient); ok {
		var err error
		if c, w, err = s.clusterCompleteAndWait(ctx, cc, sc, rkey, args); err != nil {
			return nil, err
		}
	} else {
		c, w = s.completeWAITPipeline(ctx, s.calls, false, sc, rkey, args)
	}
	reply, err := c.Slice()
	if err != nil {
		return nil, err
	}
	if code, ok := intAt(reply, 0); ok && code == fencedOK && s.cfg.onWAIT != nil {
		acked, werr := w.Int64()
		if werr != nil {
			s.cfg.onWAIT(ctx, &WAITError{Key: rkey, Replicas: s.cfg.waitN, Err: werr})
		} else if acked < int64(s.cfg.waitN) {
			s.cfg.onWAIT(ctx, &WAITError{Key: rkey, Replicas: s.cfg.waitN, Acked: int(acked)})
		}
	}
	return reply, nil
}

// completeWAITPipeline sends sc, a complete script, and WAIT in one pipeline
// of node (one connection), preceded by ASKING when asking is set, and
// returns their commands. It sends the script with EVALSHA, and again with
// EVAL when the server answers NOSCRIPT; when the server refuses the flags
// line, the Store switches to the plain scripts as run does.
func (s *Store) completeWAITPipeline(ctx context.Context, node redis.Cmdable, asking bool, sc *flaggedScript, rkey string, args []any) (c, w *redis.Cmd) {
	pipe := node.Pipeline()
	keys := []string{rkey}
	send := func(script *redis.Script, sha bool) (*redis.Cmd, *redis.Cmd) {
		if asking {
			// ASKING lets the node importing the slot serve the next
			// command, the script, once.
			_ = pipe.Process(ctx, redis.NewStatusCmd(ctx, "asking"))
		}
		var c *redis.Cmd
		if sha {
			c = script.EvalSha(ctx, pipe, keys, args...)
		} else {
			c = script.Eval(ctx, pipe, keys, args...)
		}
		w := pipe.Do(ctx, "WAIT", s.cfg.waitN, millis(s.cfg.waitTimeout))
		_, _ = pipe.Exec(ctx)
		return c, w
	}
	run := func(script *redis.Script) (*redis.Cmd, *redis.Cmd) {
		c, w := send(script, true)
		if redis.HasErrorPrefix(c.Err(), "NOSCRIPT") {
			c, w = send(script, false)
		}
		return c, w
	}
	script := s.script(sc)
	c, w = run(script)
	if script == sc.flagged && flagsLineRefused(c.Err()) {
		s.plainScripts.Store(true)
		c, w = run(sc.plain)
	}
	return c, w
}

// clusterCompleteAndWait runs completeWAITPipeline on the master of the
// record's slot in cc's slot map and follows what the Cluster answers, as
// cc itself does for a single command, but keeping WAIT on the connection
// that ran the script:
//
//   - MOVED (the slot has moved, or its master failed over): it runs the
//     pipeline again on the node named;
//   - ASK (the slot is being migrated and the record has left): it runs
//     the pipeline on the node named, after ASKING;
//   - READONLY (a node that was the master is now a replica), CLUSTERDOWN
//     or a connection error (the master is gone): it runs the pipeline on
//     the slot's master in the reloaded map.
//
// On each of these it reloads cc's slot map first, so the Store's other
// calls find the record's master too. It tries at most 1 + cc's
// MaxRedirects times (4 by default), and stops when ctx ends. Running the
// script again is safe: a complete retried with the same token gives the
// first run's answer. It returns the commands of the last attempt.
func (s *Store) clusterCompleteAndWait(ctx context.Context, cc *redis.ClusterClient, sc *flaggedScript, rkey string, args []any) (c, w *redis.Cmd, err error) {
	node, err := cc.MasterForKey(ctx, rkey)
	if err != nil {
		return nil, nil, err
	}
	var closers []func() error
	defer func() {
		for _, closeNode := range closers {
			_ = closeNode()
		}
	}()
	asking := false
	for attempt := 0; ; attempt++ {
		c, w = s.completeWAITPipeline(ctx, node, asking, sc, rkey, args)
		refused := c.Err()
		if refused == nil || attempt >= cc.Options().MaxRedirects || ctx.Err() != nil {
			return c, w, nil
		}
		var next *redis.Client
		var closeNext func() error
		if addr, ok := redis.IsMovedError(refused); ok {
			next, closeNext = clusterNodeAt(ctx, cc, addr)
			asking = false
		} else if addr, ok := redis.IsAskError(refused); ok {
			next, closeNext = clusterNodeAt(ctx, cc, addr)
			asking = true
		} else if topologyError(refused) {
			reloadSlotMap(ctx, cc)
			next, _ = cc.MasterForKey(ctx, rkey)
			asking = false
		}
		if closeNext != nil {
			closers = append(closers, closeNext)
		}
		if next == nil {
			return c, w, nil
		}
		node = next
	}
}

// clusterNodeAt returns a client for the node at addr, which a MOVED or ASK
// reply named: cc's own client for it, after reloading cc's slot map
// (ForEachShard does, and visits every node the map lists, replicas
// included). The map lists only nodes that serve slots, so a master that
// serves none yet (one just added, importing its first slot) is not in it;
// clusterNodeAt then returns a client of its own for addr, made with the
// options of cc's node clients, and the function that closes it. It
// returns nil when cc knows no node at all.
func clusterNodeAt(ctx context.Context, cc *redis.ClusterClient, addr string) (node *redis.Client, closeNode func() error) {
	var (
		mu           sync.Mutex
		found, known *redis.Client
	)
	_ = cc.ForEachShard(ctx, func(_ context.Context, n *redis.Client) error {
		mu.Lock()
		defer mu.Unlock()
		known = n
		if sameAddr(n.Options().Addr, addr) {
			found = n
		}
		return nil
	})
	if found != nil {
		return found, nil
	}
	if known == nil {
		return nil, nil
	}
	opt := *known.Options()
	opt.Addr, opt.NodeAddress = addr, addr
	node = redis.NewClient(&opt)
	return node, node.Close
}

// sameAddr reports whether the "host:port" addresses a and b are the same:
// Redis writes an IPv6 host in a redirect without brackets.
func sameAddr(a, b string) bool {
	split := func(addr string) (host, port string) {
		i := strings.LastIndexByte(addr, ':')
		if i < 0 {
			return addr, ""
		}
		return strings.Trim(addr[:i], "[]"), addr[i+1:]
	}
	ha, pa := split(a)
	hb, pb := split(b)
	return pa == pb && strings.EqualFold(ha, hb)
}
