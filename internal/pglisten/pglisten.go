// Package pglisten keeps one PostgreSQL connection LISTENing on a channel:
// the connection of pgstore's waiters and of the outbox relay's wake-ups.
package pglisten

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"
)

// Events are what Run reports of its connections; a nil function is not
// called. They are called from Run's goroutine.
type Events struct {
	// Listening: a connection, whose backend has pid, started LISTENing.
	// A notification sent before it did is lost.
	Listening func(pid uint32)
	// Notified: a notification with payload arrived.
	Notified func(payload string)
	// Dropped: the listening connection broke, stopped answering, or ctx
	// ended; it is being closed.
	Dropped func()
}

// Run keeps a connection made with cfg LISTENing on channel until ctx
// ends, reporting to ev. A connection counts as dead when it breaks, or
// when it has been silent for health and a ping gets no reply within as
// long; it is then closed (on a goroutine of its own: a connection to a
// server that stopped answering can take long to close) and another is
// connected, each attempt within twice health, with a pause between failed
// attempts of 50ms doubling up to maxPause.
func Run(ctx context.Context, cfg *pgx.ConnConfig, channel string, health, maxPause time.Duration, ev Events) {
	var pause time.Duration
	for ctx.Err() == nil {
		conn, err := connect(ctx, cfg, channel, 2*health)
		if err != nil {
			pause = min(max(2*pause, 50*time.Millisecond), maxPause)
			t := time.NewTimer(pause)
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
			}
			continue
		}
		pause = 0
		if ev.Listening != nil {
			ev.Listening(conn.PgConn().PID())
		}
		listen(ctx, conn, health, ev.Notified)
		if ev.Dropped != nil {
			ev.Dropped()
		}
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			conn.Close(ctx)
		}()
	}
}

// connect opens a connection and LISTENs on channel, within timeout.
func connect(ctx context.Context, cfg *pgx.ConnConfig, channel string, timeout time.Duration) (*pgx.Conn, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{channel}.Sanitize()); err != nil {
		closeCtx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		conn.Close(closeCtx)
		return nil, err
	}
	return conn, nil
}

// listen passes the notifications of conn to notified until conn fails,
// stays silent through a ping, or ctx ends.
func listen(ctx context.Context, conn *pgx.Conn, health time.Duration, notified func(string)) {
	for {
		wctx, cancel := context.WithTimeout(ctx, health)
		n, err := conn.WaitForNotification(wctx)
		silent := errors.Is(wctx.Err(), context.DeadlineExceeded)
		cancel()
		switch {
		case err == nil:
			if notified != nil {
				notified(n.Payload)
			}
			continue
		case ctx.Err() != nil || !silent || conn.IsClosed():
			return
		}
		pctx, cancel := context.WithTimeout(ctx, health)
		err = conn.Ping(pctx)
		cancel()
		if err != nil {
			return
		}
	}
}
