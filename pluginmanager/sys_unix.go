//go:build unix

package pluginmanager

import (
	"errors"
	"io/fs"
	"syscall"

	"github.com/plugd/plugd/internal/unaryconn"
)

// refused reports whether err is a connection refused: a socket file that
// nobody listens on.
func refused(err error) bool { return errors.Is(err, syscall.ECONNREFUSED) }

// maybeSocket reports whether a file of this mode may be a unix socket,
// for statSocket to tell: here, whether it is one.
func maybeSocket(mode fs.FileMode) bool { return mode&fs.ModeSocket != 0 }

// peerOf asks the kernel who is at the other end of a connection (peerCred,
// per OS).
func peerOf(c *unaryconn.Conn) peer {
	raw, err := c.SyscallConn()
	if err != nil {
		return peer{}
	}
	var who peer
	raw.Control(func(fd uintptr) { who = peerCred(int(fd)) })
	return who
}
