//go:build unix

package printer

import (
	"io"
	"os"

	"golang.org/x/sys/unix"
)

// terminalWidth is the width of the terminal w writes to, or 0 if w is not a
// terminal.
func terminalWidth(w io.Writer) int {
	f, ok := w.(*os.File)
	if !ok {
		return 0
	}
	ws, err := unix.IoctlGetWinsize(int(f.Fd()), unix.TIOCGWINSZ)
	if err != nil {
		return 0
	}
	return int(ws.Col)
}
