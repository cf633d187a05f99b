//go:build !windows

package plugin

import (
	"errors"
	"syscall"
)

// refused says a dial found a socket nobody listens on.
func refused(err error) bool { return errors.Is(err, syscall.ECONNREFUSED) }
