//go:build unix

package pluginmanager

import (
	"errors"
	"io/fs"
	"syscall"
)

// modeBitsTellAccess says a file's mode bits say who may write to it.
const modeBitsTellAccess = true

// refused reports whether err is a connection refused: a socket file that
// nobody listens on.
func refused(err error) bool { return errors.Is(err, syscall.ECONNREFUSED) }

// socketFile reports whether the file at path, as fi describes it, is a
// unix socket.
func socketFile(_ string, fi fs.FileInfo) bool { return fi.Mode()&fs.ModeSocket != 0 }
