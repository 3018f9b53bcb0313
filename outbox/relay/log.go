package relay

import (
	"context"
	"log/slog"
)

// logged returns an observer that logs e to l (see WithLogger) and then
// passes it to next, when next is not nil.
func logged(l *slog.Logger, next func(context.Context, Event)) func(context.Context, Event) {
	return func(ctx context.Context, e Event) {
		logEvent(ctx, l, e)
		if next != nil {
			next(ctx, e)
		}
	}
}

// logEvent logs e, at the level WithLogger gives its kind.
func logEvent(ctx context.Context, l *slog.Logger, e Event) {
	relay := slog.String("relay", e.Relay)
	msg := func() []slog.Attr {
		return []slog.Attr{relay, slog.String("id", e.ID), slog.String("topic", e.Topic), slog.Int("attempt", e.Attempt)}
	}
	switch e.Kind {
	case EventRetried:
		l.LogAttrs(ctx, slog.LevelWarn, "relay: publish failed; the message is retried",
			append(msg(), slog.Duration("backoff", e.Backoff), slog.Any("error", e.Err))...)
	case EventDead:
		text := "relay: publish failed on the last attempt; the message is dead"
		if e.Reclaimed {
			text = "relay: the claim ran out on the last attempt; the message is dead"
		}
		l.LogAttrs(ctx, slog.LevelError, text, append(msg(), slog.Any("error", e.Err))...)
	case EventReclaimed:
		l.LogAttrs(ctx, slog.LevelWarn, "relay: a claim ran out before its relay marked an outcome; the message is taken back", msg()...)
	case EventFenced:
		l.LogAttrs(ctx, slog.LevelWarn, "relay: the claim was taken back meanwhile; another relay presents the message again",
			append(msg(), slog.Bool("published", e.Published))...)
	case EventError:
		l.LogAttrs(ctx, slog.LevelError, "relay: a statement failed; the relay carries on", relay, slog.Any("error", e.Err))
	case EventPublished:
		l.LogAttrs(ctx, slog.LevelDebug, "relay: published", append(msg(), slog.Duration("age", e.Age))...)
	case EventPurged:
		l.LogAttrs(ctx, slog.LevelDebug, "relay: purged messages past the retention", relay, slog.Int("count", e.Count))
	}
}
