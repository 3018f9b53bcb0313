package relay

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/go-idempotency/idempotency/outbox"
)

// listenerHealth is how long the listening connection may stay silent
// before the relay pings it, and how long the ping's reply may take before
// the connection counts as dead and is replaced.
const listenerHealth = 5 * time.Second

// listen keeps a connection LISTENing on the table's channel until ctx
// ends, and puts a wake-up on wake for every notification, and whenever a
// new connection starts listening (a notification may have been lost while
// none did). A connection that breaks or stops answering is replaced, with
// a growing pause between failed attempts; meanwhile the poll interval
// bounds the latency.
func (r *Relay) listen(ctx context.Context, wake chan<- struct{}) {
	var pause time.Duration
	for ctx.Err() == nil {
		conn, err := r.connectListener(ctx)
		if err != nil {
			pause = min(max(2*pause, 50*time.Millisecond), r.cfg.poll)
			t := time.NewTimer(pause)
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
			}
			continue
		}
		pause = 0
		signal(wake)
		r.listenOn(ctx, conn, wake)
		closeCtx, cancel := context.WithTimeout(context.Background(), time.Second)
		conn.Close(closeCtx)
		cancel()
	}
}

// connectListener opens a connection and LISTENs on the table's channel.
func (r *Relay) connectListener(ctx context.Context) (*pgx.Conn, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*listenerHealth)
	defer cancel()
	conn, err := pgx.ConnectConfig(ctx, r.cfg.listener)
	if err != nil {
		return nil, err
	}
	if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{outbox.Channel(r.cfg.table.Name())}.Sanitize()); err != nil {
		closeCtx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		conn.Close(closeCtx)
		return nil, err
	}
	return conn, nil
}

// listenOn passes the notifications of conn on to wake until conn fails,
// stays silent through a ping, or ctx ends.
func (r *Relay) listenOn(ctx context.Context, conn *pgx.Conn, wake chan<- struct{}) {
	for {
		wctx, cancel := context.WithTimeout(ctx, listenerHealth)
		_, err := conn.WaitForNotification(wctx)
		silent := errors.Is(wctx.Err(), context.DeadlineExceeded)
		cancel()
		switch {
		case err == nil:
			signal(wake)
			continue
		case ctx.Err() != nil || !silent || conn.IsClosed():
			return
		}
		pctx, cancel := context.WithTimeout(ctx, listenerHealth)
		err = conn.Ping(pctx)
		cancel()
		if err != nil {
			return
		}
	}
}
