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

// socketFile reports whether the file at path, as fi describes it, is a
// unix socket.
func socketFile(_ string, fi fs.FileInfo) bool { return fi.Mode()&fs.ModeSocket != 0 }

// peerOf asks the kernel who is at the other end of a connection (peerCred,
// per OS).
func peerOf(c *unaryconn.Conn) peer {
	raw, err := c.SyscallConn()
	if err != nil {
		return peer{}
	}
	var who peer
	raw.Control(func(fd uintptr) { who, _ = peerCred(int(fd)) })
	return who
}
