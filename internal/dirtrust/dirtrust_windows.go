package dirtrust

// Checked says Check checks nothing on Windows: who may change a directory
// is its ACL there, not its owner and mode bits, and plugd does not read
// ACLs.
const Checked = false

// Check accepts every directory on Windows (see Checked).
func Check(dir string, uid int) error { return nil }
