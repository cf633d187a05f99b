//go:build unix

package daemon

import (
	"math"
	"syscall"
)

// openFileLimit is how many file descriptors plugd may open (RLIMIT_NOFILE,
// which the Go runtime raised to its hard limit at start), 0 if unknown or
// unlimited.
func openFileLimit() uint64 {
	var r syscall.Rlimit
	if syscall.Getrlimit(syscall.RLIMIT_NOFILE, &r) != nil || uint64(r.Cur) > math.MaxInt32 {
		return 0
	}
	return uint64(r.Cur)
}
