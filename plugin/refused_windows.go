package plugin

import (
	"errors"
	"syscall"

	"golang.org/x/sys/windows"
)

// refused says a dial found a socket nobody listens on.
func refused(err error) bool {
	return errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, windows.WSAECONNREFUSED)
}
