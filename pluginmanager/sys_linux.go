package pluginmanager

import "golang.org/x/sys/unix"

// statSocket reports the identity of the unix socket at path, without following
// a symlink. ok is false if there is nothing there or it is not a socket.
func statSocket(path string) (id fileID, ok bool) {
	var st unix.Statx_t
	mask := unix.STATX_TYPE | unix.STATX_INO | unix.STATX_BTIME | unix.STATX_CTIME
	if err := unix.Statx(unix.AT_FDCWD, path, unix.AT_SYMLINK_NOFOLLOW, mask, &st); err != nil {
		return fileID{}, false
	}
	if st.Mode&unix.S_IFMT != unix.S_IFSOCK {
		return fileID{}, false
	}
	id = fileID{dev: unix.Mkdev(st.Dev_major, st.Dev_minor), ino: st.Ino}
	if st.Mask&unix.STATX_BTIME != 0 {
		id.sec, id.nsec = st.Btime.Sec, int64(st.Btime.Nsec)
	} else {
		id.sec, id.nsec = st.Ctime.Sec, int64(st.Ctime.Nsec)
	}
	return id, true
}
