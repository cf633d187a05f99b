//go:build unix

package unaryconn

import "golang.org/x/sys/unix"

// Idle handles what the peer sent while no call was in flight, reading only
// what has already arrived: PINGs and SETTINGS are answered, window updates
// taken. It reports whether the connection is still usable: a GOAWAY, the
// peer's hang-up, or anything a peer should not send on an idle connection
// (an answer, when no call is in flight) leaves it unusable.
//
// A caller watching idle connections for readability calls it when one is
// readable: a gRPC server that is stopping gracefully sends GOAWAY and a
// PING, and holds the connection, and its Stop, until the PING is answered
// or the connection closed.
//
// Deprecated: Watch does this on every platform, with a goroutine per
// connection instead of the caller's poller, and bounds what a peer may send.
// Idle is kept until pluginmanager's epoll set (hangup.go) moves to Watch.
func (c *Conn) Idle() bool {
	if !c.callMu.TryLock() {
		// A call is in flight: it reads what came itself. Idle is meant
		// for a goroutine watching many connections, which must not wait
		// out one call's deadline.
		return true
	}
	defer c.callMu.Unlock()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.broken != nil {
		return false
	}
	if c.w != nil {
		return true // Watch reads it
	}
	raw, err := c.nc.SyscallConn()
	if err != nil {
		c.broken = err
		return false
	}
	var buf [4096]byte
	// At most 64 KiB a call: a peer that never stops talking gets its turn
	// again when its socket is found readable again, after the others'.
	for range 16 {
		if c.broken != nil {
			return false
		}
		var n int
		var rerr error
		err := raw.Read(func(fd uintptr) bool {
			n, _, rerr = unix.Recvfrom(int(fd), buf[:], unix.MSG_DONTWAIT)
			return true // never wait: only what has arrived
		})
		switch {
		case err != nil:
			c.broken = err
		case rerr == unix.EAGAIN || rerr == unix.EINTR:
			return c.idleFrames()
		case rerr != nil:
			c.broken = rerr
		case n == 0:
			c.broken = hangupError("the peer closed the connection")
		default:
			c.rest = append(c.rest, buf[:n]...)
			if !c.idleFrames() {
				return false
			}
		}
	}
	return c.broken == nil
}
