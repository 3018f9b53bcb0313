package faultproxy

import (
	"bufio"
	"io"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// lineServer answers every line with "echo: " + line and calls seen with
// each line it receives, without its newline, and with "" when a
// connection ends.
func lineServer(t *testing.T, seen func(line string)) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer seen("")
				defer c.Close()
				r := bufio.NewReader(c)
				for {
					line, err := r.ReadString('\n')
					if err != nil {
						return
					}
					seen(strings.TrimSuffix(line, "\n"))
					if _, err := io.WriteString(c, "echo: "+line); err != nil {
						return
					}
				}
			}()
		}
	}()
	return ln.Addr().String()
}

// echoServer is a lineServer that counts the lines it received.
func echoServer(t *testing.T) (addr string, lines *atomic.Int64) {
	t.Helper()
	lines = new(atomic.Int64)
	addr = lineServer(t, func(line string) {
		if line != "" {
			lines.Add(1)
		}
	})
	return addr, lines
}

// recordingServer is a lineServer that reports on seen each line it
// received and "" for each connection that ended.
func recordingServer(t *testing.T) (addr string, seen <-chan string) {
	t.Helper()
	ch := make(chan string, 64)
	return lineServer(t, func(line string) { ch <- line }), ch
}

// next returns what the upstream reports next on seen.
func next(t *testing.T, seen <-chan string) string {
	t.Helper()
	select {
	case s := <-seen:
		return s
	case <-time.After(2 * time.Second):
		t.Fatal("the upstream reported nothing")
		return ""
	}
}

// quiet fails the test if the upstream reports anything on seen within d.
func quiet(t *testing.T, seen <-chan string, d time.Duration) {
	t.Helper()
	select {
	case s := <-seen:
		t.Fatalf("the upstream reported %q while it should have seen nothing", s)
	case <-time.After(d):
	}
}

// closed reports whether ch is closed, waiting up to d for it.
func closed(ch <-chan struct{}, d time.Duration) bool {
	select {
	case <-ch:
		return true
	default:
	}
	select {
	case <-ch:
		return true
	case <-time.After(d):
		return false
	}
}

// dial connects to addr; the test closes the connection when it ends.
func dial(t *testing.T, addr string) (net.Conn, *bufio.Reader) {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c, bufio.NewReader(c)
}

// write sends s on c, failing the test on an error.
func write(t *testing.T, c net.Conn, s string) {
	t.Helper()
	_ = c.SetWriteDeadline(time.Now().Add(2 * time.Second))
	if _, err := io.WriteString(c, s); err != nil {
		t.Fatal(err)
	}
}

// readLine reads a line from r, which reads c, within timeout.
func readLine(c net.Conn, r *bufio.Reader, timeout time.Duration) (string, error) {
	_ = c.SetReadDeadline(time.Now().Add(timeout))
	line, err := r.ReadString('\n')
	return strings.TrimSuffix(line, "\n"), err
}

func newProxy(t *testing.T, upstream string) *Proxy {
	t.Helper()
	p, err := New(upstream)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

// roundTrip sends line on a fresh connection and returns the reply line.
func roundTrip(addr, line string, timeout time.Duration) (string, error) {
	c, err := net.DialTimeout("tcp", addr, timeout)
	if err != nil {
		return "", err
	}
	defer c.Close()
	return send(c, line, timeout)
}

func send(c net.Conn, line string, timeout time.Duration) (string, error) {
	_ = c.SetDeadline(time.Now().Add(timeout))
	if _, err := io.WriteString(c, line+"\n"); err != nil {
		return "", err
	}
	reply, err := bufio.NewReader(c).ReadString('\n')
	return strings.TrimSuffix(reply, "\n"), err
}

func TestForwardsAndRefusesNonLoopback(t *testing.T) {
	up, _ := echoServer(t)
	p := newProxy(t, up)
	if got, err := roundTrip(p.Addr(), "hi", 2*time.Second); err != nil || got != "echo: hi" {
		t.Fatalf("round trip = %q, %v", got, err)
	}
	for _, bad := range []string{"10.0.0.1:6379", "192.168.1.1:80", "example.com:80", "8.8.8.8:53", "nonsense"} {
		if _, err := New(bad); err == nil {
			t.Errorf("New(%q) accepted a non-loopback upstream", bad)
		}
	}
}

func TestStallHoldsBytesUntilRestore(t *testing.T) {
	up, lines := echoServer(t)
	p := newProxy(t, up)
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := send(c, "before", time.Second); err != nil {
		t.Fatal(err)
	}
	p.Stall()
	if _, err := send(c, "held", 100*time.Millisecond); err == nil {
		t.Fatal("a reply came through a stalled proxy")
	}
	if lines.Load() != 1 {
		t.Fatalf("upstream saw %d lines while stalled, want 1", lines.Load())
	}
	p.Restore()
	_ = c.SetDeadline(time.Now().Add(2 * time.Second))
	reply, err := bufio.NewReader(c).ReadString('\n')
	if err != nil || reply != "echo: held\n" {
		t.Fatalf("after restore: %q, %v", reply, err)
	}
}

func TestCut(t *testing.T) {
	up, _ := echoServer(t)
	p := newProxy(t, up)
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := send(c, "a", time.Second); err != nil {
		t.Fatal(err)
	}
	p.Cut()
	if _, err := send(c, "b", time.Second); err == nil {
		t.Fatal("a cut connection still answered")
	}
	if _, err := roundTrip(p.Addr(), "c", time.Second); err == nil {
		t.Fatal("a cut proxy forwarded a new connection")
	}
	p.Restore()
	if got, err := roundTrip(p.Addr(), "d", time.Second); err != nil || got != "echo: d" {
		t.Fatalf("after restore: %q, %v", got, err)
	}
	if p.Faults() != 1 {
		t.Fatalf("Faults = %d, want 1", p.Faults())
	}
}

func TestPatternAcrossChunks(t *testing.T) {
	p := &Proxy{}
	p.CutOn([]byte("SECRET"), CutBefore)
	var tail []byte
	for _, chunk := range []string{"has S", "EC", "RET inside"} {
		tr := p.match(&tail, []byte(chunk))
		if fires := chunk == "RET inside"; (tr != nil) != fires {
			t.Fatalf("chunk %q: fired %v, want %v", chunk, tr != nil, fires)
		}
	}
	if tr := p.match(&tail, []byte("SECRET")); tr != nil {
		t.Fatal("a trigger fired twice")
	}
}

func TestCutOnPattern(t *testing.T) {
	t.Run("before", func(t *testing.T) {
		up, lines := echoServer(t)
		p := newProxy(t, up)
		fired := p.CutOn([]byte("SECRET"), CutBefore)
		if got, err := roundTrip(p.Addr(), "plain", time.Second); err != nil || got != "echo: plain" {
			t.Fatalf("unrelated line: %q, %v", got, err)
		}
		if _, err := roundTrip(p.Addr(), "has SECRET inside", time.Second); err == nil {
			t.Fatal("the triggering line was answered")
		}
		<-fired
		if lines.Load() != 1 {
			t.Fatalf("upstream saw %d lines, want 1: the triggering one must not arrive", lines.Load())
		}
		if _, err := roundTrip(p.Addr(), "x", 200*time.Millisecond); err == nil {
			t.Fatal("the proxy is not cut after the trigger")
		}
	})
	t.Run("after reply", func(t *testing.T) {
		up, lines := echoServer(t)
		p := newProxy(t, up)
		fired := p.CutOn([]byte("SECRET"), CutAfterReply)
		c, err := net.Dial("tcp", p.Addr())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if _, err := send(c, "has SECRET inside", time.Second); err == nil {
			t.Fatal("the reply to the triggering line came through")
		}
		<-fired
		if lines.Load() != 1 {
			t.Fatalf("upstream saw %d lines, want 1: the triggering one arrives", lines.Load())
		}
		p.Restore()
		if got, err := roundTrip(p.Addr(), "again", time.Second); err != nil || got != "echo: again" {
			t.Fatalf("after restore: %q, %v", got, err)
		}
	})
}

func TestStallRepliesHoldsOnlyReplies(t *testing.T) {
	up, seen := recordingServer(t)
	p := newProxy(t, up)
	c, r := dial(t, p.Addr())
	write(t, c, "before\n")
	if got, err := readLine(c, r, 2*time.Second); err != nil || got != "echo: before" {
		t.Fatalf("before the stall: %q, %v", got, err)
	}
	if got := next(t, seen); got != "before" {
		t.Fatalf("upstream saw %q, want %q", got, "before")
	}
	p.StallReplies()
	write(t, c, "one\ntwo\n")
	for _, want := range []string{"one", "two"} {
		if got := next(t, seen); got != want {
			t.Fatalf("upstream saw %q while the replies were stalled, want %q", got, want)
		}
	}
	c2, r2 := dial(t, p.Addr())
	write(t, c2, "three\n")
	if got := next(t, seen); got != "three" {
		t.Fatalf("upstream saw %q from a new connection, want %q", got, "three")
	}
	if got, err := readLine(c, r, 100*time.Millisecond); err == nil {
		t.Fatalf("a reply came through stalled replies: %q", got)
	}
	if got, err := readLine(c2, r2, 100*time.Millisecond); err == nil {
		t.Fatalf("a reply came through stalled replies on a new connection: %q", got)
	}
	p.Restore()
	for _, want := range []string{"echo: one", "echo: two"} {
		if got, err := readLine(c, r, 2*time.Second); err != nil || got != want {
			t.Fatalf("after restore: %q, %v; want %q", got, err, want)
		}
	}
	if got, err := readLine(c2, r2, 2*time.Second); err != nil || got != "echo: three" {
		t.Fatalf("after restore, new connection: %q, %v", got, err)
	}
	if p.Faults() != 1 {
		t.Fatalf("Faults = %d, want 1", p.Faults())
	}
}

func TestStallRepliesDropsRepliesOfAClosedConnection(t *testing.T) {
	up, seen := recordingServer(t)
	p := newProxy(t, up)
	c, _ := dial(t, p.Addr())
	p.StallReplies()
	write(t, c, "lost\n")
	if got := next(t, seen); got != "lost" {
		t.Fatalf("upstream saw %q, want %q", got, "lost")
	}
	c.Close()
	// The client's departure reaches the upstream during the stall.
	if got := next(t, seen); got != "" {
		t.Fatalf("upstream saw %q, want the connection closed", got)
	}
	p.mu.Lock()
	open := len(p.conns)
	p.mu.Unlock()
	if open != 0 {
		t.Fatalf("%d connections still tracked, holding replies for a closed client", open)
	}
	p.Restore()
	if got, err := roundTrip(p.Addr(), "fresh", 2*time.Second); err != nil || got != "echo: fresh" {
		t.Fatalf("new connection after restore: %q, %v", got, err)
	}
}

func TestStallForwardsHeldRequestsOfAClosedConnection(t *testing.T) {
	up, seen := recordingServer(t)
	p := newProxy(t, up)
	c, _ := dial(t, p.Addr())
	p.Stall()
	write(t, c, "late\n")
	c.Close()
	quiet(t, seen, 100*time.Millisecond)
	p.Restore()
	// Bytes already on their way arrive although their sender is gone.
	if got := next(t, seen); got != "late" {
		t.Fatalf("upstream saw %q after restore, want %q", got, "late")
	}
	if got := next(t, seen); got != "" {
		t.Fatalf("upstream saw %q, want the connection closed", got)
	}
}

func TestTimedStallRestoresOnItsOwn(t *testing.T) {
	const d = 150 * time.Millisecond
	up, seen := recordingServer(t)
	p := newProxy(t, up)
	c, r := dial(t, p.Addr())
	start := time.Now()
	ended := p.StallRepliesFor(d)
	write(t, c, "x\n")
	got, err := readLine(c, r, d+2*time.Second)
	took := time.Since(start)
	if err != nil || got != "echo: x" {
		t.Fatalf("reply: %q, %v", got, err)
	}
	if took < d {
		t.Fatalf("the reply came after %v through a stall of %v", took, d)
	}
	if !closed(ended, 0) {
		t.Fatal("the reply came through before the stall's channel was closed")
	}
	if got := next(t, seen); got != "x" {
		t.Fatalf("upstream saw %q, want %q", got, "x")
	}
	if p.Faults() != 1 {
		t.Fatalf("Faults = %d, want 1", p.Faults())
	}
}

func TestTimedStallAndRestore(t *testing.T) {
	t.Run("restore before the timer", func(t *testing.T) {
		up, _ := echoServer(t)
		p := newProxy(t, up)
		const d = 100 * time.Millisecond
		ended := p.StallRepliesFor(d)
		p.Restore()
		if !closed(ended, 2*time.Second) {
			t.Fatal("Restore did not close the stall's channel")
		}
		if got, err := roundTrip(p.Addr(), "a", 2*time.Second); err != nil || got != "echo: a" {
			t.Fatalf("after restore: %q, %v", got, err)
		}
		// A later stall outlives the first one's timer.
		c, r := dial(t, p.Addr())
		p.Stall()
		write(t, c, "b\n")
		if got, err := readLine(c, r, 2*d); err == nil {
			t.Fatalf("the stopped timer of an earlier stall ended a later one: %q", got)
		}
		p.Restore()
		if got, err := readLine(c, r, 2*time.Second); err != nil || got != "echo: b" {
			t.Fatalf("after the second restore: %q, %v", got, err)
		}
	})

	t.Run("restore after the timer", func(t *testing.T) {
		up, _ := echoServer(t)
		p := newProxy(t, up)
		if !closed(p.StallRepliesFor(20*time.Millisecond), 2*time.Second) {
			t.Fatal("the timed stall did not end")
		}
		p.Restore()
		p.Restore()
		if got, err := roundTrip(p.Addr(), "a", 2*time.Second); err != nil || got != "echo: a" {
			t.Fatalf("after restore: %q, %v", got, err)
		}
		if err := p.Close(); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("replaced by an untimed stall", func(t *testing.T) {
		up, seen := recordingServer(t)
		p := newProxy(t, up)
		c, r := dial(t, p.Addr())
		const d = 100 * time.Millisecond
		ended := p.StallRepliesFor(d)
		p.StallReplies()
		write(t, c, "x\n")
		if got := next(t, seen); got != "x" {
			t.Fatalf("upstream saw %q, want %q", got, "x")
		}
		if got, err := readLine(c, r, 3*d); err == nil {
			t.Fatalf("the replaced stall's timer ended the new one: %q", got)
		}
		if closed(ended, 0) {
			t.Fatal("the replaced stall's channel was closed while the proxy still stalls")
		}
		p.Restore()
		if !closed(ended, 2*time.Second) {
			t.Fatal("Restore did not close the replaced stall's channel")
		}
		if got, err := readLine(c, r, 2*time.Second); err != nil || got != "echo: x" {
			t.Fatalf("after restore: %q, %v", got, err)
		}
		if p.Faults() != 2 {
			t.Fatalf("Faults = %d, want 2", p.Faults())
		}
	})

	t.Run("narrowed by a later stall", func(t *testing.T) {
		up, seen := recordingServer(t)
		p := newProxy(t, up)
		c, r := dial(t, p.Addr())
		p.Stall()
		write(t, c, "x\n")
		quiet(t, seen, 50*time.Millisecond)
		p.StallReplies()
		if got := next(t, seen); got != "x" {
			t.Fatalf("upstream saw %q, want the request the new stall no longer holds", got)
		}
		if got, err := readLine(c, r, 100*time.Millisecond); err == nil {
			t.Fatalf("a reply came through stalled replies: %q", got)
		}
		p.Restore()
		if got, err := readLine(c, r, 2*time.Second); err != nil || got != "echo: x" {
			t.Fatalf("after restore: %q, %v", got, err)
		}
	})

	t.Run("replaced by a timed stall", func(t *testing.T) {
		up, _ := echoServer(t)
		p := newProxy(t, up)
		const d = 100 * time.Millisecond
		start := time.Now()
		long := p.StallRepliesFor(time.Minute)
		short := p.StallRepliesFor(d)
		if !closed(short, d+2*time.Second) || !closed(long, 2*time.Second) {
			t.Fatal("the stalls' channels were not closed when the replacing stall ended")
		}
		if took := time.Since(start); took < d {
			t.Fatalf("the stall ended after %v, want at least %v", took, d)
		}
		if got, err := roundTrip(p.Addr(), "a", 2*time.Second); err != nil || got != "echo: a" {
			t.Fatalf("after the stall: %q, %v", got, err)
		}
	})
}

func TestStallOnPattern(t *testing.T) {
	t.Run("after", func(t *testing.T) {
		up, seen := recordingServer(t)
		p := newProxy(t, up)
		fired, ended := p.StallOn([]byte("SECRET"), StallAfter, time.Minute)
		c, r := dial(t, p.Addr())
		c2, r2 := dial(t, p.Addr())
		write(t, c, "plain\n")
		if got, err := readLine(c, r, 2*time.Second); err != nil || got != "echo: plain" {
			t.Fatalf("unrelated line: %q, %v", got, err)
		}
		if got := next(t, seen); got != "plain" {
			t.Fatalf("upstream saw %q, want %q", got, "plain")
		}
		write(t, c, "has SECRET inside\n")
		if !closed(fired, 2*time.Second) {
			t.Fatal("the trigger did not fire")
		}
		if got := next(t, seen); got != "has SECRET inside" {
			t.Fatalf("upstream saw %q, want the triggering line", got)
		}
		write(t, c2, "other\n")
		if got := next(t, seen); got != "other" {
			t.Fatalf("upstream saw %q, want %q", got, "other")
		}
		if got, err := readLine(c, r, 100*time.Millisecond); err == nil {
			t.Fatalf("the reply to the triggering line came through: %q", got)
		}
		if got, err := readLine(c2, r2, 100*time.Millisecond); err == nil {
			t.Fatalf("a reply on another connection came through: %q", got)
		}
		if closed(ended, 0) {
			t.Fatal("the stall ended early")
		}
		p.Restore()
		if !closed(ended, 2*time.Second) {
			t.Fatal("Restore did not close the trigger's ended channel")
		}
		if got, err := readLine(c, r, 2*time.Second); err != nil || got != "echo: has SECRET inside" {
			t.Fatalf("after restore: %q, %v", got, err)
		}
		if got, err := readLine(c2, r2, 2*time.Second); err != nil || got != "echo: other" {
			t.Fatalf("after restore, other connection: %q, %v", got, err)
		}
		if p.Faults() != 1 {
			t.Fatalf("Faults = %d, want 1", p.Faults())
		}
	})

	t.Run("before", func(t *testing.T) {
		up, seen := recordingServer(t)
		p := newProxy(t, up)
		fired, ended := p.StallOn([]byte("SECRET"), StallBefore, time.Minute)
		c, r := dial(t, p.Addr())
		c2, r2 := dial(t, p.Addr())
		write(t, c2, "first\n")
		if got, err := readLine(c2, r2, 2*time.Second); err != nil || got != "echo: first" {
			t.Fatalf("unrelated line: %q, %v", got, err)
		}
		if got := next(t, seen); got != "first" {
			t.Fatalf("upstream saw %q, want %q", got, "first")
		}
		write(t, c, "has SECRET inside\n")
		if !closed(fired, 2*time.Second) {
			t.Fatal("the trigger did not fire")
		}
		write(t, c2, "other\n")
		quiet(t, seen, 100*time.Millisecond)
		if got, err := readLine(c2, r2, 10*time.Millisecond); err == nil {
			t.Fatalf("a reply came through the stall: %q", got)
		}
		p.Restore()
		if !closed(ended, 2*time.Second) {
			t.Fatal("Restore did not close the trigger's ended channel")
		}
		got := map[string]bool{next(t, seen): true, next(t, seen): true}
		if !got["has SECRET inside"] || !got["other"] {
			t.Fatalf("upstream saw %v after restore, want the held lines", got)
		}
		if got, err := readLine(c, r, 2*time.Second); err != nil || got != "echo: has SECRET inside" {
			t.Fatalf("after restore: %q, %v", got, err)
		}
		if got, err := readLine(c2, r2, 2*time.Second); err != nil || got != "echo: other" {
			t.Fatalf("after restore, other connection: %q, %v", got, err)
		}
		if p.Faults() != 1 {
			t.Fatalf("Faults = %d, want 1", p.Faults())
		}
	})

	t.Run("timed", func(t *testing.T) {
		const d = 150 * time.Millisecond
		for _, mode := range []StallMode{StallBefore, StallAfter} {
			up, seen := recordingServer(t)
			p := newProxy(t, up)
			c, r := dial(t, p.Addr())
			start := time.Now()
			fired, ended := p.StallOn([]byte("SECRET"), mode, d)
			write(t, c, "SECRET\n")
			got, err := readLine(c, r, d+2*time.Second)
			took := time.Since(start)
			if err != nil || got != "echo: SECRET" {
				t.Fatalf("mode %d: reply %q, %v", mode, got, err)
			}
			if took < d {
				t.Fatalf("mode %d: the reply came after %v through a stall of %v", mode, took, d)
			}
			if !closed(fired, 0) || !closed(ended, 0) {
				t.Fatalf("mode %d: the reply came through before the trigger's channels were closed", mode)
			}
			if got := next(t, seen); got != "SECRET" {
				t.Fatalf("mode %d: upstream saw %q", mode, got)
			}
		}
	})

	t.Run("arming replaces a pending trigger", func(t *testing.T) {
		up, _ := echoServer(t)
		p := newProxy(t, up)
		cut := p.CutOn([]byte("CUT"), CutBefore)
		stalled, _ := p.StallOn([]byte("HOLD"), StallAfter, 0)
		if got, err := roundTrip(p.Addr(), "CUT me", 2*time.Second); err != nil || got != "echo: CUT me" {
			t.Fatalf("the replaced cut trigger fired: %q, %v", got, err)
		}
		if got, err := roundTrip(p.Addr(), "HOLD me", 2*time.Second); err != nil || got != "echo: HOLD me" {
			t.Fatalf("through a stall of 0: %q, %v", got, err)
		}
		if closed(cut, 0) || !closed(stalled, 0) {
			t.Fatal("the wrong trigger fired")
		}
		stalled, _ = p.StallOn([]byte("HOLD"), StallBefore, time.Minute)
		p.CutOn([]byte("CUT"), CutBefore)
		if got, err := roundTrip(p.Addr(), "HOLD me", 2*time.Second); err != nil || got != "echo: HOLD me" {
			t.Fatalf("the replaced stall trigger fired: %q, %v", got, err)
		}
		if closed(stalled, 0) {
			t.Fatal("the replaced stall trigger fired")
		}
		if p.Faults() != 1 {
			t.Fatalf("Faults = %d, want 1", p.Faults())
		}
	})
}

func TestCloseWhileStalled(t *testing.T) {
	for _, tc := range []struct {
		name  string
		stall func(t *testing.T, p *Proxy, c net.Conn) <-chan struct{} // nil when untimed
	}{
		{"Stall", func(t *testing.T, p *Proxy, c net.Conn) <-chan struct{} {
			p.Stall()
			write(t, c, "held\n")
			return nil
		}},
		{"StallReplies", func(t *testing.T, p *Proxy, c net.Conn) <-chan struct{} {
			p.StallReplies()
			write(t, c, "held\n")
			return nil
		}},
		{"StallRepliesFor", func(t *testing.T, p *Proxy, c net.Conn) <-chan struct{} {
			ended := p.StallRepliesFor(time.Minute)
			write(t, c, "held\n")
			return ended
		}},
		{"StallOn", func(t *testing.T, p *Proxy, c net.Conn) <-chan struct{} {
			fired, ended := p.StallOn([]byte("held"), StallBefore, time.Minute)
			write(t, c, "held\n")
			if !closed(fired, 2*time.Second) {
				t.Fatal("the trigger did not fire")
			}
			return ended
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			up, _ := echoServer(t)
			p := newProxy(t, up)
			c, r := dial(t, p.Addr())
			ended := tc.stall(t, p, c)
			done := make(chan error, 1)
			go func() { done <- p.Close() }()
			select {
			case err := <-done:
				if err != nil {
					t.Fatal(err)
				}
			case <-time.After(2 * time.Second):
				t.Fatal("Close blocked on a stalled proxy")
			}
			if ended != nil && !closed(ended, 0) {
				t.Fatal("Close did not close the stall's channel")
			}
			if got, err := readLine(c, r, 2*time.Second); err == nil {
				t.Fatalf("a held reply came through after Close: %q", got)
			}
			if !closed(p.StallRepliesFor(time.Minute), 0) {
				t.Fatal("a stall started after Close did not end at once")
			}
			p.Restore()
		})
	}
}
