package daemon

import (
	"net"
	"strconv"

	"golang.org/x/sys/unix"
)

// peerUID is the uid of the process at the other end of c (SO_PEERCRED).
func peerUID(c *net.UnixConn) (string, bool) {
	raw, err := c.SyscallConn()
	if err != nil {
		return "", false
	}
	var cred *unix.Ucred
	var credErr error
	if err := raw.Control(func(fd uintptr) {
		cred, credErr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil || credErr != nil {
		return "", false
	}
	return strconv.FormatUint(uint64(cred.Uid), 10), true
}

// openFileLimit is how many file descriptors plugd may open (RLIMIT_NOFILE,
// which the Go runtime raised to its hard limit at start), 0 if unknown.
func openFileLimit() uint64 {
	var r unix.Rlimit
	if unix.Getrlimit(unix.RLIMIT_NOFILE, &r) != nil || r.Cur == unix.RLIM_INFINITY {
		return 0
	}
	return r.Cur
}
