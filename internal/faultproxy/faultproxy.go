// Package faultproxy is a TCP proxy for tests that injects network faults
// between a client and a server on the same machine:
//
//   - a stall that holds the bytes in flight with every connection open,
//     in both directions (Stall) or only the upstream's replies while
//     requests still reach it (StallReplies, StallRepliesFor), until
//     Restore or for a set time;
//   - a cut that closes every connection and refuses new ones (Cut);
//   - a cut (CutOn) or a timed stall (StallOn) triggered by a byte pattern
//     in the middle of a request.
//
// The proxy listens on a free loopback port and forwards only to a loopback
// upstream; New refuses any other address.
package faultproxy

import (
	"bytes"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// Mode says what a cut trigger (see Proxy.CutOn) does when it fires.
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

// StallMode says what a stall trigger (see Proxy.StallOn) holds when it
// fires.
type StallMode int

const (
	// StallBefore holds the bytes holding the pattern and everything sent
	// after them, in both directions and on every connection, for the
	// trigger's duration: the request reaches the upstream only when the
	// stall ends.
	StallBefore StallMode = iota + 1
	// StallAfter forwards the bytes holding the pattern and then holds the
	// upstream's replies on every connection for the trigger's duration:
	// the request takes effect upstream and its reply arrives late.
	StallAfter
)

// untimed is the duration of a stall that lasts until Restore.
const untimed time.Duration = -1

// Proxy forwards TCP connections from its own loopback address to an
// upstream address, with faults switched on and off by its methods. It is
// safe for concurrent use. The zero value is not usable; call New.
type Proxy struct {
	upstream string
	ln       net.Listener

	mu       sync.Mutex
	stall    *stall          // non-nil while stalled
	ended    []chan struct{} // closed when the stall in progress ends
	refusing bool
	conns    map[*link]struct{}
	trigger  *trigger
	closed   bool

	wg     sync.WaitGroup
	faults atomic.Int64
}

// stall is the stall in progress.
type stall struct {
	requests bool          // client bytes are held too, not only replies
	wake     chan struct{} // closed when this stall ends or is replaced
	timer    *time.Timer   // ends a timed stall
}

// stop stops s's timer and wakes what it holds.
func (s *stall) stop() {
	if s.timer != nil {
		s.timer.Stop()
	}
	close(s.wake)
}

// trigger is an armed pattern trigger: a cut (cut set) or a stall (stall
// set).
type trigger struct {
	pattern []byte
	cut     Mode
	stall   StallMode
	d       time.Duration // how long a stall lasts
	fired   chan struct{} // closed when the trigger has fired
	ended   chan struct{} // closed when the stall it started ends
}

// link is one proxied connection: the client side and the upstream side.
type link struct {
	client, upstream net.Conn
	once             sync.Once
	gone             chan struct{} // closed by close
	swallow          atomic.Bool   // discard upstream bytes (the reply being lost)
	swallowed        chan struct{}
	swallowOnce      sync.Once
}

func (l *link) close() {
	l.once.Do(func() {
		close(l.gone)
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
		return nil, fmt.Errorf("faultproxy: upstream %q is not a loopback address", upstream)
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

// Faults returns the number of faults injected so far: each Stall,
// StallReplies, StallRepliesFor and Cut, and each trigger that fired.
func (p *Proxy) Faults() int64 { return p.faults.Load() }

// Stall stops forwarding in both directions until Restore: connections
// stay open and the bytes sent meanwhile are held. Restore lets them flow
// on, each connection's in the order they were sent. Bytes a client sent
// before closing its connection still reach the upstream then, as bytes
// already in the network do, though their replies are lost; held bytes of
// a connection the proxy closes (Cut, Close) are lost.
//
// A stall started while another is in progress replaces it without
// releasing anything in between: the new one says what is held and until
// when, bytes it does not hold flow on, and the channels of the stalls it
// replaced are closed when it ends.
func (p *Proxy) Stall() {
	p.startStall(true, untimed, nil)
}

// StallReplies holds the upstream's replies on every connection until
// Restore, as a frozen or overloaded server does: connections stay open
// and client bytes still reach the upstream and take effect there. Restore
// lets the held replies flow on, each connection's in order; the held
// replies of a connection closed meanwhile, by its client or by the proxy,
// are dropped. It replaces a stall in progress as Stall does.
func (p *Proxy) StallReplies() {
	p.startStall(false, untimed, nil)
}

// StallRepliesFor is StallReplies for d: the proxy restores itself after
// d, unless Restore or another stall came first. The returned channel is
// closed when the stall ends, by its timer, Restore or Close, or at the end
// of a stall that replaced it.
func (p *Proxy) StallRepliesFor(d time.Duration) <-chan struct{} {
	ended := make(chan struct{})
	p.startStall(false, max(d, 0), ended)
	return ended
}

// startStall starts a stall as startStallLocked does and counts it as a
// fault.
func (p *Proxy) startStall(requests bool, d time.Duration, ended chan struct{}) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.startStallLocked(requests, d, ended)
	p.faults.Add(1)
}

// startStallLocked starts a stall of client bytes too when requests is
// set, else of replies only, that ends after d unless d is untimed, and
// closes ended (if not nil) when the stall ends.
func (p *Proxy) startStallLocked(requests bool, d time.Duration, ended chan struct{}) {
	if ended != nil {
		p.ended = append(p.ended, ended)
	}
	if p.closed {
		p.endStallLocked()
		return
	}
	if p.stall != nil {
		p.stall.stop()
	}
	s := &stall{requests: requests, wake: make(chan struct{})}
	if d != untimed {
		s.timer = time.AfterFunc(d, func() {
			p.mu.Lock()
			defer p.mu.Unlock()
			if p.stall == s { // not replaced or ended meanwhile
				p.endStallLocked()
			}
		})
	}
	p.stall = s
}

// endStallLocked ends the stall in progress, if any, and closes the
// channels waiting for its end.
func (p *Proxy) endStallLocked() {
	if p.stall != nil {
		p.stall.stop()
		p.stall = nil
	}
	for _, c := range p.ended {
		close(c)
	}
	p.ended = nil
}

// Cut closes every open connection and refuses new ones (each is accepted
// and closed at once) until Restore.
func (p *Proxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cutLocked()
	p.faults.Add(1)
}

// cutLocked closes every connection and refuses new ones.
func (p *Proxy) cutLocked() {
	p.refusing = true
	for l := range p.conns {
		l.close()
		delete(p.conns, l)
	}
}

// Restore ends a stall, timed or not, and a Cut: held bytes flow on and
// new connections are forwarded. A pending stall timer is stopped, so it
// cannot end a later stall. Restore does not disarm a pending trigger.
func (p *Proxy) Restore() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.refusing = false
	p.endStallLocked()
}

// CutOn arms a one-shot trigger: the next chunk of client bytes that
// contains pattern (also across chunk boundaries) makes the proxy cut, as
// mode says. The returned channel is closed when the trigger has fired and
// the proxy is cut. Arming replaces a pending trigger, of CutOn or StallOn.
func (p *Proxy) CutOn(pattern []byte, mode Mode) <-chan struct{} {
	tr := &trigger{pattern: bytes.Clone(pattern), cut: mode, fired: make(chan struct{})}
	p.arm(tr)
	return tr.fired
}

// StallOn arms a one-shot trigger: the next chunk of client bytes that
// contains pattern (also across chunk boundaries), when it is about to be
// forwarded, starts a stall of d, as mode says. The stall replaces one in
// progress, as Stall does, and Restore ends it early. The fired channel is
// closed when the stall has started, before the chunk is forwarded (with
// StallAfter) or held (with StallBefore); the ended channel is closed when
// the stall ends, and neither is closed if the trigger never fires. Arming
// replaces a pending trigger, of CutOn or StallOn.
func (p *Proxy) StallOn(pattern []byte, mode StallMode, d time.Duration) (fired, ended <-chan struct{}) {
	tr := &trigger{pattern: bytes.Clone(pattern), stall: mode, d: max(d, 0),
		fired: make(chan struct{}), ended: make(chan struct{})}
	p.arm(tr)
	return tr.fired, tr.ended
}

func (p *Proxy) arm(tr *trigger) {
	p.mu.Lock()
	p.trigger = tr
	p.mu.Unlock()
}

// Close stops the proxy: it closes the listener and every connection, ends
// a stall and waits for its goroutines. A stall started after Close ends at
// once. It is safe to call more than once.
func (p *Proxy) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	err := p.ln.Close()
	p.cutLocked()
	p.endStallLocked()
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
		l := &link{client: c, upstream: up, gone: make(chan struct{}), swallowed: make(chan struct{})}
		p.mu.Lock()
		if p.closed || p.refusing {
			p.mu.Unlock()
			l.close()
			continue
		}
		p.conns[l] = struct{}{}
		p.wg.Add(2)
		p.mu.Unlock()
		go p.pump(l, true)
		go p.pump(l, false)
	}
}

// hold blocks while a stall holds the direction of l that up names (client
// to upstream when set). It reports false when l was closed meanwhile.
func (p *Proxy) hold(l *link, up bool) bool {
	for {
		p.mu.Lock()
		s, closed := p.stall, p.closed
		_, open := p.conns[l]
		p.mu.Unlock()
		if closed || !open {
			return false
		}
		if s == nil || (up && !s.requests) {
			return true
		}
		select {
		case <-s.wake:
		case <-l.gone:
			return false
		}
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
			if !p.hold(l, up) {
				return
			}
			if !up && l.swallow.Load() {
				l.swallowOnce.Do(func() { close(l.swallowed) })
				continue
			}
			if up {
				if tr := p.match(&tail, chunk); tr != nil {
					if tr.cut != 0 {
						p.fireCut(l, tr, chunk)
						return
					}
					if !p.fireStall(l, tr, chunk) {
						return
					}
					continue
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

// fireCut carries out a cut trigger on l, whose client just sent chunk.
func (p *Proxy) fireCut(l *link, tr *trigger, chunk []byte) {
	if tr.cut == CutAfterReply {
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

// fireStall carries out a stall trigger on l, whose client just sent
// chunk, and forwards chunk when the stall lets it through. It reports
// false when l is closed or broken.
func (p *Proxy) fireStall(l *link, tr *trigger, chunk []byte) bool {
	p.mu.Lock()
	p.startStallLocked(tr.stall == StallBefore, tr.d, tr.ended)
	p.mu.Unlock()
	p.faults.Add(1)
	close(tr.fired)
	if tr.stall == StallBefore && !p.hold(l, true) {
		return false
	}
	_, err := l.upstream.Write(chunk)
	return err == nil
}

// forget stops tracking l and closes it. It untracks l first, so that once
// either side sees the connection closed, bytes of l that a stall holds
// are no longer forwarded.
func (p *Proxy) forget(l *link) {
	p.mu.Lock()
	delete(p.conns, l)
	p.mu.Unlock()
	l.close()
}
