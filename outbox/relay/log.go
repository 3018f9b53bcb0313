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
	state := func(attrs []slog.Attr) []slog.Attr {
		if e.State != "" {
			attrs = append(attrs, slog.String("state", string(e.State)))
		}
		return attrs
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
	case EventRefused:
		l.LogAttrs(ctx, slog.LevelError, "relay: the sink refused the message permanently; the message is dead",
			append(msg(), slog.Any("error", e.Err))...)
	case EventUnreadable:
		l.LogAttrs(ctx, slog.LevelError, "relay: a claimed row cannot be read; the message is dead, its batch goes on",
			append(msg(), slog.Any("error", e.Err))...)
	case EventSuspended:
		l.LogAttrs(ctx, slog.LevelWarn, "relay: the sink suspended the message until an operator resumes it",
			append(msg(), slog.String("reason", e.Reason))...)
	case EventReclaimed:
		l.LogAttrs(ctx, slog.LevelWarn, "relay: a claim ran out before its relay marked an outcome; the message is taken back", msg()...)
	case EventClaimLost:
		l.LogAttrs(ctx, slog.LevelWarn, "relay: the claim on the message is lost; the sink's context is cancelled",
			state(append(msg(), slog.Any("error", e.Err)))...)
	case EventFenced:
		l.LogAttrs(ctx, slog.LevelWarn, "relay: the claim was lost meanwhile; the mark changed nothing",
			state(append(msg(), slog.Bool("published", e.Published)))...)
	case EventCanceled:
		l.LogAttrs(ctx, slog.LevelInfo, "relay: the message was canceled while the relay presented it; the mark changed nothing",
			append(msg(), slog.Bool("published", e.Published))...)
	case EventError:
		l.LogAttrs(ctx, slog.LevelError, "relay: a statement failed; the relay carries on", relay, slog.Any("error", e.Err))
	case EventPublished:
		l.LogAttrs(ctx, slog.LevelDebug, "relay: published", append(msg(), slog.Duration("age", e.Age))...)
	case EventPurged:
		l.LogAttrs(ctx, slog.LevelDebug, "relay: purged messages past the retention", relay, slog.Int("count", e.Count))
	case EventReleased:
		l.LogAttrs(ctx, slog.LevelDebug, "relay: handed back claimed messages unpresented", relay, slog.Int("count", e.Count))
	case EventExtended:
		l.LogAttrs(ctx, slog.LevelDebug, "relay: extended the claim of the messages held", relay, slog.Int("count", e.Count))
	}
}
