// Package dirtrust says whether a directory plugd takes sockets from, or
// puts its own socket in, is safe from other users: that nobody but plugd's
// user and root can put a socket there, replace one, or swap the directory
// itself for one of their own. The registry directory (the plugin manager)
// and the status socket's directory (the daemon) are held to this one rule.
package dirtrust

import "fmt"

// maxLinks bounds the symlinks followed on the way to a directory, as the
// kernel bounds them (ELOOP).
const maxLinks = 40

// Untrusted is why a directory cannot be trusted: Dir is the directory
// checked, At the directory or symlink at fault (Dir itself, or one on the
// way to it), and Why says what is wrong there, why it matters and what to
// do.
type Untrusted struct {
	Dir, At string
	Why     string
}

func (e *Untrusted) Error() string {
	if e.At == e.Dir {
		return fmt.Sprintf("%s %s", e.Dir, e.Why)
	}
	return fmt.Sprintf("%s is reached through %s, which %s", e.Dir, e.At, e.Why)
}
