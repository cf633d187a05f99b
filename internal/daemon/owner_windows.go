package daemon

import "io/fs"

// fileOwner is unknown on Windows, where who may write to a directory is its
// ACL, not its owner and mode bits: the caller checks neither.
func fileOwner(fs.FileInfo) (uid int, ok bool) { return 0, false }
