package pluginmanager

import "golang.org/x/sys/unix"

// statSocket reports the identity of the unix socket at path, without following
// a symlink. ok is false if there is nothing there or it is not a socket.
// APFS and HFS+ keep a birth time.
func statSocket(path string) (id fileID, ok bool) {
	var st unix.Stat_t
	if err := unix.Lstat(path, &st); err != nil {
		return fileID{}, false
	}
	if st.Mode&unix.S_IFMT != unix.S_IFSOCK {
		return fileID{}, false
	}
	id = fileID{dev: uint64(st.Dev), ino: st.Ino}
	if t := st.Btim; t.Sec != 0 || t.Nsec != 0 {
		id.sec, id.nsec = t.Sec, t.Nsec
	} else {
		id.sec, id.nsec = st.Ctim.Sec, st.Ctim.Nsec
	}
	return id, true
}
