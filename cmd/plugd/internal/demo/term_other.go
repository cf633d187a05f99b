//go:build !unix

package demo

import "os"

// terminalWidth reports no terminal where the demo cannot ask it for its
// width: the demo then prints its lines one after another.
func terminalWidth(*os.File) (func() int, bool) { return nil, false }
