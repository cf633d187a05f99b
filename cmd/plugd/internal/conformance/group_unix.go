//go:build unix

package conformance

import (
	"os/exec"
	"syscall"
)

// ownGroup makes cmd's process lead a process group of its own, so that
// signalGroup reaches whatever the plugin started (a wrapper script's
// children) with it.
func ownGroup(cmd *exec.Cmd) { cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true} }

// signalGroup sends sig to the process group led by cmd's process.
func signalGroup(cmd *exec.Cmd, sig syscall.Signal) error {
	return syscall.Kill(-cmd.Process.Pid, sig)
}
