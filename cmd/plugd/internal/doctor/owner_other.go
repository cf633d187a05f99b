//go:build !unix

package doctor

import "os"

// ownerOf is empty where files have no unix owner.
func ownerOf(os.FileInfo) string { return "" }
