// Package purgeloop is the background purge of the SQL stores (pgstore,
// sqlitestore): every interval, batches of expired records until one comes
// back short.
package purgeloop

import (
	"context"
	"time"
)

// Run purges every interval until quit is closed: it calls purge with
// batch until purge deletes fewer than batch records or fails, and hands a
// failure to onError (nil: none) unless quit was closed meanwhile. purge's
// context is cancelled when quit is closed, so that Close does not wait
// for a purge stuck on the database.
func Run(quit <-chan struct{}, interval time.Duration, batch int, purge func(ctx context.Context, batch int) (int, error), onError func(error)) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-quit:
			cancel()
		case <-ctx.Done():
		}
	}()
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-quit:
			return
		case <-t.C:
		}
		for {
			n, err := purge(ctx, batch)
			if err != nil {
				if ctx.Err() == nil && onError != nil {
					onError(err)
				}
				break
			}
			if n < batch {
				break
			}
		}
	}
}
