//go:build unix

package doctor

import (
	"os"
	"strconv"
	"syscall"
)

// ownerOf is a file's owner and group, with their names.
func ownerOf(fi os.FileInfo) string {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return ""
	}
	return "uid " + describeID(strconv.FormatUint(uint64(st.Uid), 10), true) + ", gid " + describeID(strconv.FormatUint(uint64(st.Gid), 10), false)
}
