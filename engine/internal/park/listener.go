package park

import (
	"errors"
	"net"
	"sync"
)

// Listener is the server's listener when polls are parked: the
// connections its inner listener accepts, and those parked polls give
// back. Its one goroutine accepts from the inner listener; Close stops
// it and waits.
type Listener struct {
	inner net.Listener
	back  chan net.Conn
	fresh chan accepted
	// done is closed by Close; stopped when the accepting goroutine has
	// returned.
	done      chan struct{}
	stopped   chan struct{}
	closeOnce sync.Once
	closeErr  error
}

type accepted struct {
	conn net.Conn
	err  error
}

// NewListener returns a Listener over inner and starts accepting.
func NewListener(inner net.Listener) *Listener {
	l := &Listener{inner: inner, back: make(chan net.Conn), fresh: make(chan accepted),
		done: make(chan struct{}), stopped: make(chan struct{})}
	go l.accept()
	return l
}

func (l *Listener) accept() {
	defer close(l.stopped)
	for {
		c, err := l.inner.Accept()
		select {
		case l.fresh <- accepted{c, err}:
		case <-l.done:
			if c != nil {
				c.Close()
			}
			return
		}
		// Any other error is the server's to judge: it retries the
		// temporary ones and closes the listener on the rest.
		if errors.Is(err, net.ErrClosed) {
			return
		}
	}
}

// Accept returns the next connection, given back or new.
func (l *Listener) Accept() (net.Conn, error) {
	select {
	case c := <-l.back:
		return c, nil
	case a := <-l.fresh:
		return a.conn, a.err
	case <-l.done:
		return nil, net.ErrClosed
	}
}

// give hands c back to the server; false if the server no longer
// accepts (the caller closes c).
func (l *Listener) give(c net.Conn) bool {
	select {
	case l.back <- c:
		return true
	case <-l.done:
		return false
	case <-l.stopped:
		return false
	}
}

// Close stops accepting and waits for the accepting goroutine.
func (l *Listener) Close() error {
	l.closeOnce.Do(func() {
		close(l.done)
		l.closeErr = l.inner.Close()
		<-l.stopped
	})
	return l.closeErr
}

// Addr is the inner listener's address.
func (l *Listener) Addr() net.Addr { return l.inner.Addr() }
