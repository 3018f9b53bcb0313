package faultproxy

import (
	"bufio"
	"errors"
	"io"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// echoServer answers every line with "echo: " + line and counts the lines
// it received.
func echoServer(t *testing.T) (addr string, lines *atomic.Int64) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	lines = new(atomic.Int64)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				r := bufio.NewReader(c)
				for {
					line, err := r.ReadString('\n')
					if err != nil {
						return
					}
					lines.Add(1)
					if _, err := io.WriteString(c, "echo: "+line); err != nil {
						return
					}
				}
			}()
		}
	}()
	return ln.Addr().String(), lines
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
		} else if bad != "nonsense" && !errors.Is(err, ErrNotLoopback) {
			t.Errorf("New(%q) = %v, want ErrNotLoopback", bad, err)
		}
	}
	if p.Connections() != 1 {
		t.Fatalf("Connections = %d, want 1", p.Connections())
	}
}

func TestLatency(t *testing.T) {
	up, _ := echoServer(t)
	p := newProxy(t, up)
	p.SetLatency(60 * time.Millisecond)
	start := time.Now()
	if _, err := roundTrip(p.Addr(), "slow", 2*time.Second); err != nil {
		t.Fatal(err)
	}
	// One delay each way.
	if took := time.Since(start); took < 120*time.Millisecond {
		t.Fatalf("round trip took %v with 60ms latency each way", took)
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

func TestDropAndCut(t *testing.T) {
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
	p.Drop()
	if _, err := send(c, "b", time.Second); err == nil {
		t.Fatal("a dropped connection still answered")
	}
	if got, err := roundTrip(p.Addr(), "c", time.Second); err != nil || got != "echo: c" {
		t.Fatalf("new connection after Drop: %q, %v", got, err)
	}
	p.Cut()
	if _, err := roundTrip(p.Addr(), "d", time.Second); err == nil {
		t.Fatal("a cut proxy forwarded a new connection")
	}
	p.Restore()
	if got, err := roundTrip(p.Addr(), "e", time.Second); err != nil || got != "echo: e" {
		t.Fatalf("after restore: %q, %v", got, err)
	}
	if p.Faults() != 2 {
		t.Fatalf("Faults = %d, want 2", p.Faults())
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
		// The pattern is split over two writes.
		io.WriteString(c, "has SEC")
		time.Sleep(20 * time.Millisecond) // let the first half go as its own chunk
		if _, err := send(c, "RET inside", time.Second); err == nil {
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
