//go:build unix

package pluginmanager

import (
	"errors"
	"io/fs"
	"syscall"
)

// refused reports whether err is a connection refused: a socket file that
// nobody listens on.
func refused(err error) bool { return errors.Is(err, syscall.ECONNREFUSED) }

// maybeSocket reports whether a file of this mode may be a unix socket,
// for statSocket to tell: here, whether it is one.
func maybeSocket(mode fs.FileMode) bool { return mode&fs.ModeSocket != 0 }
