package relay

import (
	"context"
	"time"

	"github.com/go-idempotency/idempotency/internal/pglisten"
	"github.com/go-idempotency/idempotency/outbox"
)

// listenerHealth is how long the listening connection may stay silent
// before the relay pings it, and how long the ping's reply may take before
// the connection counts as dead and is replaced.
const listenerHealth = 5 * time.Second

// listenPostgres keeps a connection LISTENing on the table's channel until ctx
// ends, and puts a wake-up on wake for every notification, and whenever a
// new connection starts listening (a notification may have been lost while
// none did). A connection that breaks or stops answering is replaced, with
// a pause of up to the poll interval between failed attempts; meanwhile
// the poll interval bounds the latency.
func (r *Relay) listenPostgres(ctx context.Context, wake chan<- struct{}) {
	pglisten.Run(ctx, r.cfg.listener, outbox.Channel(r.cfg.table.Name()), listenerHealth, r.cfg.poll, pglisten.Events{
		Listening: func(uint32) { signal(wake) },
		Notified:  func(string) { signal(wake) },
	})
}
