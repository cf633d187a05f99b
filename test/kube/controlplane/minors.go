//go:build linux

package controlplane

import (
	"debug/buildinfo"
	"fmt"
	"io"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/plugd/plugd/internal/testenv"
)

// MinorEnv names the environment variable that picks the kubelet's minor.
const MinorEnv = "PLUGD_KUBELET_MINOR"

// NewestMinor is the minor of this module's k8s.io/kubernetes: its
// kubelet is cmd/kubelet, built by Build beside the API server and etcd.
const NewestMinor = "1.37"

// OlderMinors are the kubelet minors built each in a module of its own,
// minors/vMINOR, against the same API server and etcd (NewestMinor): a
// kubelet may be older than its API server by up to three minors.
var OlderMinors = []string{"1.35", "1.36"}

// Kubelet is a kubelet binary and the k8s.io/kubernetes it was built from.
type Kubelet struct {
	Minor   string // e.g. "1.35"
	Path    string // the binary
	Version string // the version of k8s.io/kubernetes in it, e.g. "v1.35.4"
}

// BuildKubelet returns the kubelet of minor ("" means NewestMinor), built
// by Build for the newest and here, into d.Bin/vMINOR, for an older one;
// it checks that the binary is built from k8s.io/kubernetes of that minor,
// so that a test never runs silently against another kubelet than the one
// asked for.
func BuildKubelet(d Dirs, minor string, log io.Writer) (Kubelet, error) {
	if minor == "" {
		minor = NewestMinor
	}
	k := Kubelet{Minor: minor, Path: filepath.Join(d.Bin, "kubelet")}
	switch {
	case minor == NewestMinor:
	case slices.Contains(OlderMinors, minor):
		dir := filepath.Join(d.Bin, "v"+minor)
		start := time.Now()
		if err := testenv.Build(dir, "test/kube/minors/v"+minor+"/kubelet"); err != nil {
			return Kubelet{}, err
		}
		fmt.Fprintf(log, "built the kubelet of minor %s in %s\n", minor, time.Since(start).Round(time.Second))
		k.Path = filepath.Join(dir, "kubelet")
	default:
		return Kubelet{}, fmt.Errorf("%s=%q: no such kubelet minor here; set it to one of %s (or leave it empty for %s)",
			MinorEnv, minor, strings.Join(append(slices.Clone(OlderMinors), NewestMinor), ", "), NewestMinor)
	}
	bi, err := buildinfo.ReadFile(k.Path)
	if err != nil {
		return Kubelet{}, fmt.Errorf("the kubelet of minor %s: %w", minor, err)
	}
	for _, m := range bi.Deps {
		if m.Path == "k8s.io/kubernetes" {
			k.Version = m.Version
		}
	}
	if !strings.HasPrefix(k.Version, "v"+minor+".") {
		return Kubelet{}, fmt.Errorf("%s is built from k8s.io/kubernetes %q, not of minor %s", k.Path, k.Version, minor)
	}
	return k, nil
}

// AtLeast says the kubelet's minor is minor or newer.
func (k Kubelet) AtLeast(minor string) bool { return minorNumber(k.Minor) >= minorNumber(minor) }

// minorNumber is the minor of "1.N": N.
func minorNumber(minor string) int {
	var major, n int
	fmt.Sscanf(minor, "%d.%d", &major, &n)
	return n
}
