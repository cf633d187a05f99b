//go:build !linux && !darwin

package peercred

// Supported says whether the OS tells who is at the other end of a unix
// socket: not here (Windows has no such option for AF_UNIX).
const Supported = false

func of(int) (Peer, bool) { return Peer{}, false }
