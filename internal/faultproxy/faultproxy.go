// Package faultproxy is a TCP proxy for tests that injects network faults
// between a client and a server on the same machine: latency, a stall that
// holds bytes in flight, dropped connections, a cut that closes every
// connection and refuses new ones, and a cut triggered by a byte pattern in
// the middle of a request.
//
// The proxy listens on a free loopback port and forwards only to a loopback
// upstream; New refuses any other address.
package faultproxy

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// ErrNotLoopback is returned by New for an upstream address that is not on
// the loopback interface.
var ErrNotLoopback = errors.New("faultproxy: upstream is not a loopback address")

// Mode says what a pattern trigger (see Proxy.CutOn) does when it fires.
type Mode int

const (
	// CutBefore cuts the proxy before the bytes holding the pattern are
	// forwarded: the request never reaches the upstream.
	CutBefore Mode = iota + 1
	// CutAfterReply forwards the bytes holding the pattern, discards the
	// upstream's reply once it arrives and then cuts the proxy: the request
	// took effect upstream and the client never learns its outcome.
	CutAfterReply
)

// Proxy forwards TCP connections from its own loopback address to an
// upstream address, with faults switched on and off by its methods. It is
// safe for concurrent use. The zero value is not usable; call New.
type Proxy struct {
	upstream string
	ln       net.Listener

	mu       sync.Mutex
	latency  time.Duration
	resume   chan struct{} // non-nil while stalled; closed by Restore
	refusing bool
	conns    map[*link]struct{}
	trigger  *trigger
	closed   bool

	wg     sync.WaitGroup
	faults atomic.Int64
	conned atomic.Int64
}

type trigger struct {
	pattern []byte
	mode    Mode
	fired   chan struct{}
}

// link is one proxied connection: the client side and the upstream side.
type link struct {
	client, upstream net.Conn
	once             sync.Once
	swallow          atomic.Bool // discard upstream bytes (the reply being lost)
	swallowed        chan struct{}
	swallowOnce      sync.Once
}

func (l *link) close() {
	l.once.Do(func() {
		l.client.Close()
		l.upstream.Close()
	})
}

// New starts a proxy on a free loopback port forwarding to upstream
// ("host:port", where host is a loopback IP or "localhost"). Close stops it.
func New(upstream string) (*Proxy, error) {
	host, _, err := net.SplitHostPort(upstream)
	if err != nil {
		return nil, fmt.Errorf("faultproxy: upstream %q: %w", upstream, err)
	}
	if ip := net.ParseIP(host); host != "localhost" && (ip == nil || !ip.IsLoopback()) {
		return nil, fmt.Errorf("%w: %q", ErrNotLoopback, upstream)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("faultproxy: listen: %w", err)
	}
	p := &Proxy{upstream: upstream, ln: ln, conns: make(map[*link]struct{})}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Addr returns the proxy's address, "127.0.0.1:<port>".
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Faults returns the number of faults injected so far: each Stall, Drop and
// Cut, and each trigger that fired.
func (p *Proxy) Faults() int64 { return p.faults.Load() }

// Connections returns the number of client connections accepted and
// forwarded so far.
func (p *Proxy) Connections() int64 { return p.conned.Load() }

// SetLatency delays every chunk of bytes, in both directions, by d. Zero
// removes the delay.
func (p *Proxy) SetLatency(d time.Duration) {
	p.mu.Lock()
	p.latency = d
	p.mu.Unlock()
}

// Stall stops forwarding in both directions: connections stay open and the
// bytes sent meanwhile are held until Restore (or lost when a connection is
// closed first).
func (p *Proxy) Stall() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.resume == nil {
		p.resume = make(chan struct{})
	}
	p.faults.Add(1)
}

// Drop closes every open connection; new connections are accepted as usual.
func (p *Proxy) Drop() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closeAllLocked()
	p.faults.Add(1)
}

// Cut closes every open connection and refuses new ones (each is accepted
// and closed at once) until Restore.
func (p *Proxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cutLocked()
	p.faults.Add(1)
}

func (p *Proxy) cutLocked() {
	p.refusing = true
	p.closeAllLocked()
}

func (p *Proxy) closeAllLocked() {
	for l := range p.conns {
		l.close()
		delete(p.conns, l)
	}
}

// Restore ends a Stall or a Cut: held bytes flow on and new connections are
// forwarded. It does not change the latency or disarm a pending trigger.
func (p *Proxy) Restore() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.refusing = false
	if p.resume != nil {
		close(p.resume)
		p.resume = nil
	}
}

// CutOn arms a one-shot trigger: the next chunk of client bytes that
// contains pattern (also across chunk boundaries) makes the proxy cut, as
// mode says. The returned channel is closed when the trigger has fired and
// the proxy is cut. Arming replaces a pending trigger. It panics on an empty
// pattern or an unknown mode.
func (p *Proxy) CutOn(pattern []byte, mode Mode) <-chan struct{} {
	if len(pattern) == 0 {
		panic("faultproxy: CutOn needs a pattern")
	}
	if mode != CutBefore && mode != CutAfterReply {
		panic("faultproxy: CutOn: unknown mode")
	}
	tr := &trigger{pattern: bytes.Clone(pattern), mode: mode, fired: make(chan struct{})}
	p.mu.Lock()
	p.trigger = tr
	p.mu.Unlock()
	return tr.fired
}

// Close stops the proxy: it closes the listener and every connection and
// waits for its goroutines. It is safe to call more than once.
func (p *Proxy) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	err := p.ln.Close()
	p.closeAllLocked()
	if p.resume != nil {
		close(p.resume)
		p.resume = nil
	}
	p.mu.Unlock()
	p.wg.Wait()
	return err
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		if p.closed || p.refusing {
			p.mu.Unlock()
			c.Close()
			continue
		}
		p.mu.Unlock()
		up, err := net.DialTimeout("tcp", p.upstream, 2*time.Second)
		if err != nil {
			c.Close()
			continue
		}
		l := &link{client: c, upstream: up, swallowed: make(chan struct{})}
		p.mu.Lock()
		if p.closed || p.refusing {
			p.mu.Unlock()
			l.close()
			continue
		}
		p.conns[l] = struct{}{}
		p.conned.Add(1)
		p.wg.Add(2)
		p.mu.Unlock()
		go p.pump(l, true)
		go p.pump(l, false)
	}
}

// gate blocks while the proxy is stalled and then applies the latency. It
// reports false when the link was closed meanwhile.
func (p *Proxy) gate(l *link) bool {
	for {
		p.mu.Lock()
		resume, latency, closed := p.resume, p.latency, p.closed
		_, open := p.conns[l]
		p.mu.Unlock()
		if closed || !open {
			return false
		}
		if resume == nil {
			if latency > 0 {
				time.Sleep(latency)
			}
			return true
		}
		<-resume
	}
}

// pump copies one direction of l: from the client to the upstream when
// up is set, else back.
func (p *Proxy) pump(l *link, up bool) {
	defer p.wg.Done()
	defer p.forget(l)
	src, dst := l.client, l.upstream
	if !up {
		src, dst = l.upstream, l.client
	}
	buf := make([]byte, 32<<10)
	var tail []byte // the last bytes seen, for patterns across chunks
	for {
		n, err := src.Read(buf)
		if n > 0 {
			chunk := buf[:n]
			if !p.gate(l) {
				return
			}
			if !up && l.swallow.Load() {
				l.swallowOnce.Do(func() { close(l.swallowed) })
				continue
			}
			if up {
				if tr := p.match(&tail, chunk); tr != nil {
					p.fire(l, tr, chunk)
					return
				}
			}
			if _, werr := dst.Write(chunk); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// match reports the armed trigger when its pattern occurs in tail+chunk,
// and keeps the end of the stream in tail.
func (p *Proxy) match(tail *[]byte, chunk []byte) *trigger {
	p.mu.Lock()
	tr := p.trigger
	p.mu.Unlock()
	if tr == nil {
		return nil
	}
	window := append(*tail, chunk...)
	found := bytes.Contains(window, tr.pattern)
	if keep := len(tr.pattern) - 1; len(window) > keep {
		window = window[len(window)-keep:]
	}
	*tail = append((*tail)[:0], window...)
	if !found {
		return nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.trigger != tr {
		return nil // another connection fired it first
	}
	p.trigger = nil
	return tr
}

// fire carries out a trigger on l, whose client just sent chunk.
func (p *Proxy) fire(l *link, tr *trigger, chunk []byte) {
	if tr.mode == CutAfterReply {
		l.swallow.Store(true)
		if _, err := l.upstream.Write(chunk); err == nil {
			select {
			case <-l.swallowed:
			case <-time.After(5 * time.Second):
			}
		}
	}
	p.mu.Lock()
	p.cutLocked()
	p.mu.Unlock()
	p.faults.Add(1)
	close(tr.fired)
}

func (p *Proxy) forget(l *link) {
	l.close()
	p.mu.Lock()
	delete(p.conns, l)
	p.mu.Unlock()
}
