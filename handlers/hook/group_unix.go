//go:build unix

package hook

import (
	"os/exec"
	"syscall"
)

// ownGroup makes cmd's process lead a process group of its own, so that
// killGroup takes whatever it started with it.
func ownGroup(cmd *exec.Cmd) { cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true} }

// killGroup kills the process group led by pid.
func killGroup(pid int) error {
	return syscall.Kill(-pid, syscall.SIGKILL)
}
