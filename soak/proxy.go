package soak

import (
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// proxy is a TCP proxy between the plugin's ssh and the sandbox's sshd
// that can add latency: each chunk read from one side is written to the
// other delay after it arrived, so a slow link is slow without being
// narrow. The plugin's ssh_port names the proxy for the whole soak; the
// ssh-slow fault sets the delay for a while.
type proxy struct {
	ln       net.Listener
	upstream string
	delay    atomic.Int64 // nanoseconds added to each chunk, each way
	wg       sync.WaitGroup
	mu       sync.Mutex // guards conns
	conns    map[net.Conn]bool
}

func newProxy(upstream string) (*proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &proxy{ln: ln, upstream: upstream, conns: map[net.Conn]bool{}}
	p.wg.Add(1)
	go p.serve()
	return p, nil
}

func (p *proxy) port() int { return p.ln.Addr().(*net.TCPAddr).Port }

func (p *proxy) setDelay(d time.Duration) { p.delay.Store(int64(d)) }

func (p *proxy) serve() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			p.handle(c)
		}()
	}
}

func (p *proxy) track(c net.Conn, on bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if on {
		p.conns[c] = true
	} else {
		delete(p.conns, c)
	}
}

func (p *proxy) handle(c net.Conn) {
	defer c.Close()
	u, err := net.DialTimeout("tcp", p.upstream, 5*time.Second)
	if err != nil {
		return // sshd is down: the client sees the connection closed
	}
	defer u.Close()
	p.track(c, true)
	p.track(u, true)
	defer p.track(c, false)
	defer p.track(u, false)
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); p.pipe(u, c) }()
	go func() { defer wg.Done(); p.pipe(c, u) }()
	wg.Wait()
}

// chunk is bytes read and when.
type chunk struct {
	b  []byte
	at time.Time
}

// pipe copies src to dst, each chunk held until its delay has passed. A
// reader and a writer goroutine, so that the delay is latency: chunks
// behind one are not held up by more than their own delay.
func (p *proxy) pipe(dst, src net.Conn) {
	ch := make(chan chunk, 256)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for c := range ch {
			if d := time.Duration(p.delay.Load()); d > 0 {
				time.Sleep(time.Until(c.at.Add(d)))
			}
			if _, err := dst.Write(c.b); err != nil {
				for range ch {
				}
				return
			}
		}
		if tc, ok := dst.(*net.TCPConn); ok {
			tc.CloseWrite()
		}
	}()
	buf := make([]byte, 32*1024)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			ch <- chunk{b: append([]byte(nil), buf[:n]...), at: time.Now()}
		}
		if err != nil {
			if err != io.EOF {
				dst.Close()
			}
			break
		}
	}
	close(ch)
	<-done
}

// close stops accepting and closes every connection, then waits for its
// goroutines.
func (p *proxy) close() {
	p.ln.Close()
	p.mu.Lock()
	for c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}
