//go:build linux

// Command privatemounts runs a command with mounts of its own, so that a
// real kubelet started by the tests changes nothing on the host:
//
//	privatemounts [--overlay DIR=SCRATCH]... [--bind FILE=TARGET]... -- COMMAND [ARG]...
//
// --overlay lays a writable overlay over DIR whose changes go to SCRATCH
// (the kubelet's /var/lib/kubelet and /var/log/pods land there, not on the
// host); --bind mounts FILE over TARGET (a file holding the value the
// kubelet wants over each /proc/sys entry it would otherwise write). Then
// it replaces itself with COMMAND, which keeps its process id.
//
// It must be started in a mount namespace of its own (the tests start it
// with CLONE_NEWNS, which also makes every mount private); it refuses to
// run in its parent's, where its mounts would be the host's. The mounts go
// when the last process in the namespace exits: nothing is left to undo.
package main

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "privatemounts:", err)
		os.Exit(2)
	}
}

func run(args []string) error {
	var overlays, binds [][2]string
	for len(args) > 0 && args[0] != "--" {
		if len(args) < 2 {
			return fmt.Errorf("%s needs a value", args[0])
		}
		a, b, ok := strings.Cut(args[1], "=")
		if !ok || !filepath.IsAbs(a) || !filepath.IsAbs(b) {
			return fmt.Errorf("%s %q: want two absolute paths, PATH=PATH", args[0], args[1])
		}
		switch args[0] {
		case "--overlay":
			overlays = append(overlays, [2]string{a, b})
		case "--bind":
			binds = append(binds, [2]string{a, b})
		default:
			return fmt.Errorf("unknown flag %s", args[0])
		}
		args = args[2:]
	}
	if len(args) < 2 {
		return errors.New("usage: privatemounts [--overlay DIR=SCRATCH]... [--bind FILE=TARGET]... -- COMMAND [ARG]...")
	}
	self, err1 := os.Readlink("/proc/self/ns/mnt")
	parent, err2 := os.Readlink(fmt.Sprintf("/proc/%d/ns/mnt", os.Getppid()))
	if err := errors.Join(err1, err2); err != nil {
		return fmt.Errorf("cannot tell my mount namespace from my parent's: %w", err)
	}
	if self == parent {
		return fmt.Errorf("in my parent's mount namespace (%s): start me with CLONE_NEWNS, or my mounts would be the host's", self)
	}
	// Whatever the namespace inherited, nothing mounted here propagates out.
	if err := syscall.Mount("", "/", "", syscall.MS_REC|syscall.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("making every mount private: %w", err)
	}
	for _, o := range overlays {
		dir, scratch := o[0], o[1]
		upper, work := filepath.Join(scratch, "upper"), filepath.Join(scratch, "work")
		for _, d := range []string{upper, work} {
			if err := os.MkdirAll(d, 0o755); err != nil {
				return err
			}
		}
		opts := fmt.Sprintf("lowerdir=%s,upperdir=%s,workdir=%s", dir, upper, work)
		if err := syscall.Mount("overlay", dir, "overlay", 0, opts); err != nil {
			return fmt.Errorf("overlay on %s: %w", dir, err)
		}
	}
	for _, b := range binds {
		if err := syscall.Mount(b[0], b[1], "", syscall.MS_BIND, ""); err != nil {
			return fmt.Errorf("bind %s over %s: %w", b[0], b[1], err)
		}
	}
	path, err := exec.LookPath(args[1])
	if err != nil {
		return err
	}
	return syscall.Exec(path, args[1:], os.Environ())
}
