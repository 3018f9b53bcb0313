package main

import (
	"io"
	"math/rand/v2"
	"net"
	"sync"
	"sync/atomic"
)

// flakyProxy is a loopback TCP proxy that loses answers: for each connection
// it forwards the request to the target and, with probability drop, closes
// the client's connection once the target has answered, without relaying the
// answer: the request has run but its answer never arrives.
type flakyProxy struct {
	ln      net.Listener
	target  string
	drop    float64
	dropped atomic.Int64

	mu     sync.Mutex
	rnd    *rand.Rand
	conns  map[net.Conn]struct{}
	closed bool
	wg     sync.WaitGroup
}

// startFlakyProxy listens on a free loopback port and proxies to target
// (host:port) until Close.
func startFlakyProxy(target string, drop float64, seed uint64) (*flakyProxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &flakyProxy{
		ln:     ln,
		target: target,
		drop:   drop,
		rnd:    rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)),
		conns:  make(map[net.Conn]struct{}),
	}
	p.wg.Add(1)
	go p.serve()
	return p, nil
}

// Addr returns the proxy's host:port.
func (p *flakyProxy) Addr() string { return p.ln.Addr().String() }

// Dropped returns how many answers the proxy has thrown away.
func (p *flakyProxy) Dropped() int64 { return p.dropped.Load() }

// Close stops the proxy, closes every open connection and waits for its
// goroutines.
func (p *flakyProxy) Close() error {
	err := p.ln.Close()
	p.mu.Lock()
	p.closed = true
	for c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
	return err
}

func (p *flakyProxy) serve() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.wg.Add(1)
		go p.handle(c)
	}
}

// track registers c for Close; it reports false, and closes c, when the
// proxy is closing.
func (p *flakyProxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		c.Close()
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *flakyProxy) untrack(c net.Conn) {
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
	c.Close()
}

func (p *flakyProxy) handle(client net.Conn) {
	defer p.wg.Done()
	if !p.track(client) {
		return
	}
	defer p.untrack(client)
	server, err := net.Dial("tcp", p.target)
	if err != nil {
		return
	}
	if !p.track(server) {
		return
	}
	defer p.untrack(server)

	p.mu.Lock()
	drop := p.rnd.Float64() < p.drop
	p.mu.Unlock()

	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		_, _ = io.Copy(server, client)
		if tc, ok := server.(*net.TCPConn); ok {
			_ = tc.CloseWrite()
		}
	}()

	if drop {
		// Read the whole answer, which the server ends by closing the
		// connection (the client does not keep connections alive): by then
		// the server has finished with the request. Then hang up on the
		// client without relaying any of it.
		if n, _ := io.Copy(io.Discard, server); n > 0 {
			p.dropped.Add(1)
		}
		return
	}
	_, _ = io.Copy(client, server)
}
