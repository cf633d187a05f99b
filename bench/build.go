package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"time"
)

// The managers under test, by the name the benchmark reports them under.
// plugd is measured twice where idle cost matters: at its defaults (every
// plugin's connection held and watched, a probe every 5 minutes, which
// never falls in an idle window) and probing every probeInterval, to show
// what frequent probes cost on top.
const (
	plugd        = "plugd"
	plugdProbing = "plugd-probing"
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

// probeInterval is the liveness probe interval plugd-probing runs with:
// plugd's default before issue 12.
const probeInterval = 10 * time.Second

// probeSettle is how long after a burst plugd-probing's probing reaches its steady
// state: a plugin's first probe comes up to 10% later than the interval
// (jitter), then up to a tenth of it more (probes are batched on that grid).
// An idle window that began sooner would see only some of the first probes,
// and how many would depend on where the grid fell.
const probeSettle = probeInterval + probeInterval/10 + probeInterval/10

// launch says which manager a session runs, and how.
type launch struct {
	bin     string // directory of the manager binaries
	name    string // plugd, plugd-probing or kubelet
	profile string // if set, the manager writes profiles of its run to this path + ".cpu.pprof" and ".heap.pprof"
}

// command returns the command line that runs the manager on dir.
func (l launch) command(dir string) (string, []string) {
	args := []string{"-dir", dir}
	if l.profile != "" {
		args = append(args, "-cpuprofile", l.profile+".cpu.pprof", "-memprofile", l.profile+".heap.pprof")
	}
	pkg := l.name
	if l.name == plugdProbing {
		pkg = plugd
		args = append(args, "-probe-interval="+probeInterval.String())
	}
	if !slices.Contains([]string{plugd, kubelet}, pkg) {
		panic("unknown manager " + l.name)
	}
	return filepath.Join(l.bin, filepath.Base(managerPackages[pkg])), args
}
