//go:build !linux

package daemon

import "net"

// peerUID is not known here: every local client counts as one.
func peerUID(*net.UnixConn) (string, bool) { return "", false }

// openFileLimit is not known here.
func openFileLimit() uint64 { return 0 }
