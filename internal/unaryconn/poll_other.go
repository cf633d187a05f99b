//go:build !linux

package unaryconn

import "errors"

// poller is Linux's epoll set (poll_linux.go); elsewhere each watch is a
// goroutine.
type poller struct{}

func (c *Conn) pollLocked(*watch) error { return errors.ErrUnsupported }

func (c *Conn) unpollLocked(*watch) {}
