package peercred

import "golang.org/x/sys/unix"

// Supported says whether the kernel tells who is at the other end of a unix
// socket: here, LOCAL_PEERCRED (and LOCAL_PEERPID).
const Supported = true

func of(fd int) (Peer, bool) {
	cred, err := unix.GetsockoptXucred(fd, unix.SOL_LOCAL, unix.LOCAL_PEERCRED)
	if err != nil || cred.Ngroups < 1 {
		return Peer{}, false
	}
	p := Peer{UID: cred.Uid, GID: cred.Groups[0]}
	if pid, err := unix.GetsockoptInt(fd, unix.SOL_LOCAL, unix.LOCAL_PEERPID); err == nil {
		p.PID = uint32(pid)
	}
	return p, true
}
