//go:build !linux

package unaryconn

import "errors"

// epollSet is Linux's epoll set (poll_linux.go); elsewhere each watch is a
// goroutine.
type epollSet struct{}

func (p *Poller) pollLocked(*watch) error { return errors.ErrUnsupported }

func (p *Poller) unpoll(*watch) {}

func (c *Conn) pollStep(*watch) {}
