// Package peercred asks the kernel who is at the other end of a unix socket
// connection: the plugin manager, to apply Options.AllowedPeers, and the
// daemon, to bound the status API's streams per user.
package peercred

import "syscall"

// Peer is the process at the other end of a connection: its pid, effective
// uid and gid (on macOS the first of its groups).
type Peer struct{ PID, UID, GID uint32 }

// Of returns the peer of c, a unix socket connection; false if the OS does
// not tell (see Supported) or c is closed.
func Of(c syscall.Conn) (Peer, bool) {
	raw, err := c.SyscallConn()
	if err != nil {
		return Peer{}, false
	}
	var p Peer
	var ok bool
	if raw.Control(func(fd uintptr) { p, ok = of(int(fd)) }) != nil {
		return Peer{}, false
	}
	return p, ok
}
