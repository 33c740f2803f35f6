package park

import (
	"errors"
	"sync"

	"golang.org/x/sys/unix"
)

// hangups hears, for every parked connection, that its worker hung up,
// with one goroutine for all of them: the descriptors sit in an epoll set
// of their own (beside the Go runtime's), registered for EPOLLRDHUP only,
// edge-triggered, so that nothing but the peer's close (or a reset, which
// epoll always reports) wakes it. A worker that dies mid-poll closes its
// socket, and its poll ends at once, as it did when net/http's background
// read saw the EOF and cancelled the request's context.
type hangups struct {
	ep   int
	wake int // an eventfd that ends run
	wg   sync.WaitGroup
	// closeOnce guards the closing of ep and wake.
	closeOnce sync.Once
}

func newHangups() (*hangups, error) {
	ep, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return nil, err
	}
	wake, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		unix.Close(ep)
		return nil, err
	}
	// No connection's descriptor can equal the eventfd's while it is open,
	// so its number tells its event apart.
	ev := unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(wake)}
	if err := unix.EpollCtl(ep, unix.EPOLL_CTL_ADD, wake, &ev); err != nil {
		unix.Close(ep)
		unix.Close(wake)
		return nil, err
	}
	return &hangups{ep: ep, wake: wake}, nil
}

// start runs the watcher, which calls hungUp(fd, seq) for each hang-up
// of a registered descriptor, until close.
func (h *hangups) start(hungUp func(fd int, seq uint32)) {
	h.wg.Add(1)
	go func() {
		defer h.wg.Done()
		events := make([]unix.EpollEvent, 128)
		for {
			n, err := unix.EpollWait(h.ep, events, -1)
			if errors.Is(err, unix.EINTR) {
				continue
			}
			if err != nil {
				return
			}
			for _, ev := range events[:n] {
				if int(ev.Fd) == h.wake {
					return
				}
				hungUp(int(ev.Fd), uint32(ev.Pad))
			}
		}
	}()
}

// add registers fd, a parked connection's, as registration seq.
func (h *hangups) add(fd int, seq uint32) error {
	ev := unix.EpollEvent{Events: unix.EPOLLRDHUP | unix.EPOLLET, Fd: int32(fd), Pad: int32(seq)}
	return unix.EpollCtl(h.ep, unix.EPOLL_CTL_ADD, fd, &ev)
}

// remove takes fd out of the set before its poll answers: the connection
// goes back to the server, and its descriptor may be closed and reused.
func (h *hangups) remove(fd int) {
	_ = unix.EpollCtl(h.ep, unix.EPOLL_CTL_DEL, fd, nil)
}

// close stops the watcher and waits for it.
func (h *hangups) close() {
	h.closeOnce.Do(func() {
		var one = [8]byte{1}
		unix.Write(h.wake, one[:])
		h.wg.Wait()
		unix.Close(h.ep)
		unix.Close(h.wake)
	})
}
