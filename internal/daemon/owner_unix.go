//go:build unix

package daemon

import (
	"io/fs"
	"syscall"
)

// fileOwner is the uid that owns the file fi describes; ok is false where
// the OS says nothing of it, and then its mode bits say nothing of who may
// write to it either.
func fileOwner(fi fs.FileInfo) (uid int, ok bool) {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return 0, false
	}
	return int(st.Uid), true
}
