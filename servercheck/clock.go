package servercheck

import "time"

// clockOffset returns a server's clock minus this host's, from the time the
// server gave in a reply sent between before and after.
func clockOffset(server, before, after time.Time) time.Duration {
	return server.Sub(before.Add(after.Sub(before) / 2))
}

// describeOffset says how a server's clock stands against this host's.
func describeOffset(d time.Duration) string {
	d = d.Round(time.Millisecond)
	switch {
	case d > 0:
		return d.String() + " ahead of this host"
	case d < 0:
		return (-d).String() + " behind this host"
	}
	return "in step with this host"
}

// describeAge renders how long ago something happened: to the millisecond
// under a minute, to the second above.
func describeAge(d time.Duration) string {
	if d < time.Minute {
		return d.Round(time.Millisecond).String()
	}
	return d.Round(time.Second).String()
}
