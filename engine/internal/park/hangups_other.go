//go:build !linux

package park

import "errors"

// hangups is Linux's (hangups_linux.go): elsewhere polls are not parked
// but held on their goroutine, as net/http holds any request.
type hangups struct{}

func newHangups() (*hangups, error) { return nil, errors.New("parked polls need epoll") }

func (h *hangups) start(func(int, uint32)) {}
func (h *hangups) add(int, uint32) error   { return errors.New("parked polls need epoll") }
func (h *hangups) remove(int)              {}
func (h *hangups) close()                  {}
