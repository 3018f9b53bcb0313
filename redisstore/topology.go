package redisstore

import (
	"context"
	"errors"

	"github.com/redis/go-redis/v9"
)

// reloadSlotMapAfter has a Cluster client reload its slot map, in the
// background, after a call of the Store failed with an error that says the
// map may be out of date: a redirect, or a master that no longer answers
// as one (see topologyError; a call that ran out of time may have met a
// master that stopped answering too). go-redis reloads its map on MOVED
// and READONLY, but not when the master it knows is unreachable: without
// this, the calls to a dead master's slots keep failing after its replica
// took over, until the client's periodic reload (every 60 seconds by
// default). ReloadState runs one reload at a time and waits 200ms before
// the next, so a burst of failing calls costs a reload every 200ms or so.
func (s *Store) reloadSlotMapAfter(err error) {
	cc, ok := s.client.(*redis.ClusterClient)
	if !ok {
		return
	}
	_, moved := redis.IsMovedError(err)
	if moved || topologyError(err) || errors.Is(err, context.DeadlineExceeded) {
		cc.ReloadState(context.Background())
	}
}

// runReloading runs sc as run does. On a Cluster, when the call failed
// because the master that the client's slot map names for the key no
// longer is one or cannot be reached (topologyError: after a failover,
// go-redis keeps sending to the old master until its map is reloaded), it
// reloads the map and runs sc once more, on the master the new map names.
// Running it again is safe: a script retried with the same arguments gives
// the first run's answer.
func (s *Store) runReloading(ctx context.Context, sc *flaggedScript, keys []string, args ...any) ([]any, error) {
	reply, err := s.run(ctx, sc, keys, args...)
	cc, ok := s.client.(*redis.ClusterClient)
	if err == nil || !ok || !topologyError(err) || ctx.Err() != nil {
		return reply, err
	}
	reloadSlotMap(ctx, cc)
	return s.run(ctx, sc, keys, args...)
}

// topologyError reports whether err says that the node asked no longer
// serves the record's slot as its master, or could not be reached: a
// replica refusing a write (READONLY), a Cluster without a master for some
// slot (CLUSTERDOWN), or an error other than a Redis reply and the end of
// the caller's context, such as a refused or broken connection.
func topologyError(err error) bool {
	if redis.IsReadOnlyError(err) || redis.IsClusterDownError(err) {
		return true
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return false
	}
	var rerr redis.Error
	return !errors.As(err, &rerr)
}

// reloadSlotMap makes cc load its slot map from the Cluster before it
// returns: ForEachMaster reloads the map before it visits the masters
// (ReloadState only schedules a reload). The visit does nothing.
func reloadSlotMap(ctx context.Context, cc *redis.ClusterClient) {
	_ = cc.ForEachMaster(ctx, func(context.Context, *redis.Client) error { return nil })
}
