//go:build unix

package pluginmanager

import (
	"math"
	"os"
	"syscall"
)

// openFileLimit is the process's limit of open files (RLIMIT_NOFILE, as
// Go's runtime raised it at start), 0 if it is unknown or unlimited.
func openFileLimit() int {
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil || rl.Cur > math.MaxInt32 {
		return 0
	}
	return int(rl.Cur)
}

// openFiles is the number of files the process has open, -1 if unknown.
// /dev/fd lists them on Linux (a link to /proc/self/fd) and macOS.
func openFiles() int {
	d, err := os.Open("/dev/fd")
	if err != nil {
		return -1
	}
	defer d.Close()
	names, err := d.Readdirnames(-1)
	if err != nil {
		return -1
	}
	return len(names) - 1 // not the one reading
}
