package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
)

// The managers under test, by the name the benchmark reports them under.
// plugd is measured twice where idle cost matters: with liveness probing at
// its default and with probing off.
const (
	plugd        = "plugd"
	plugdNoProbe = "plugd-noprobe"
	kubelet      = "kubelet"
)

// The binary each manager runs from, under the bench module.
var managerPackages = map[string]string{
	plugd:   "github.com/plugd/plugd/bench/cmd/plugd-manager",
	kubelet: "github.com/plugd/plugd/bench/cmd/kubelet-manager",
}

// buildManagers builds the binaries of the managers named into dir, with the
// go command on PATH; it must run inside the bench module.
func buildManagers(dir string, names []string) error {
	args := []string{"build", "-o", dir + string(filepath.Separator)}
	for _, n := range names {
		args = append(args, managerPackages[n])
	}
	fmt.Fprintf(os.Stderr, "building %v (the kubelet's takes a minute or two the first time)\n", names)
	out, err := exec.Command("go", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("building the managers under test (run the benchmark inside the bench directory: cd bench && go run .): %w\n%s", err, out)
	}
	return nil
}

// launch says which manager a session runs, and how.
type launch struct {
	bin     string // directory of the manager binaries
	name    string // plugd, plugd-noprobe or kubelet
	profile string // if set, the manager writes profiles of its run to this path + ".cpu.pprof" and ".heap.pprof"
}

// command returns the command line that runs the manager on dir.
func (l launch) command(dir string) (string, []string) {
	args := []string{"-dir", dir}
	if l.profile != "" {
		args = append(args, "-cpuprofile", l.profile+".cpu.pprof", "-memprofile", l.profile+".heap.pprof")
	}
	pkg := l.name
	if l.name == plugdNoProbe {
		pkg = plugd
		args = append(args, "-probe-interval=-1ns")
	}
	if !slices.Contains([]string{plugd, kubelet}, pkg) {
		panic("unknown manager " + l.name)
	}
	return filepath.Join(l.bin, filepath.Base(managerPackages[pkg])), args
}
