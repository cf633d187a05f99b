package conformance

import (
	"os/exec"
	"syscall"
)

// ownGroup does nothing: Windows has no process group to signal at once.
func ownGroup(*exec.Cmd) {}

// signalGroup kills cmd's process: Windows has no SIGTERM, and no process
// group to kill at once, so processes the plugin started stay.
func signalGroup(cmd *exec.Cmd, _ syscall.Signal) error { return cmd.Process.Kill() }
