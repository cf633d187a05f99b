//go:build !unix

package cli

import "io"

// terminalWidth is 0 where plugctl cannot ask the terminal: tables then use
// $COLUMNS or a fixed width.
func terminalWidth(io.Writer) int { return 0 }
