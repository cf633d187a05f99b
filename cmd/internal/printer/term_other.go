//go:build !unix

package printer

import "io"

// terminalWidth is 0 where the program cannot ask the terminal: tables then use
// $COLUMNS or a fixed width.
func terminalWidth(io.Writer) int { return 0 }
