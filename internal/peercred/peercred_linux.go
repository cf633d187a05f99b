package peercred

import "golang.org/x/sys/unix"

// Supported says whether the kernel tells who is at the other end of a unix
// socket: here, SO_PEERCRED.
const Supported = true

func of(fd int) (Peer, bool) {
	cred, err := unix.GetsockoptUcred(fd, unix.SOL_SOCKET, unix.SO_PEERCRED)
	if err != nil {
		return Peer{}, false
	}
	return Peer{PID: uint32(cred.Pid), UID: cred.Uid, GID: cred.Gid}, true
}
