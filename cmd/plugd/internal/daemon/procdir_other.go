//go:build !linux

package daemon

import (
	"errors"
	"runtime"
)

// checkProcDir refuses doctor.procDir where there is no proc file system
// to find processes in.
func checkProcDir(string) error {
	return errors.New("is set, but " + runtime.GOOS + " has no proc file system to find a kubelet's process in")
}
