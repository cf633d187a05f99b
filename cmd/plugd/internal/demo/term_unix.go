//go:build unix

package demo

import (
	"os"

	"golang.org/x/sys/unix"
)

// terminalWidth reports whether f is a terminal and, if it is, returns a
// function that gives its current width. TERM=dumb terminals cannot move the
// cursor, so they count as no terminal.
func terminalWidth(f *os.File) (func() int, bool) {
	fd := int(f.Fd())
	if _, err := unix.IoctlGetWinsize(fd, unix.TIOCGWINSZ); err != nil || os.Getenv("TERM") == "dumb" {
		return nil, false
	}
	return func() int {
		ws, err := unix.IoctlGetWinsize(fd, unix.TIOCGWINSZ)
		if err != nil || ws.Col == 0 {
			return 80
		}
		return int(ws.Col)
	}, true
}
