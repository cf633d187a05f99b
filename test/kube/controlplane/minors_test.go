//go:build linux

package controlplane

import (
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A minor the module has no kubelet of is refused, naming those it has;
// and a binary that is not built from k8s.io/kubernetes of the minor asked
// for is refused, so that no test runs silently against another kubelet.
func TestBuildKubeletRefuses(t *testing.T) {
	_, err := BuildKubelet(Dirs{Bin: t.TempDir()}, "1.20", io.Discard)
	if err == nil || !strings.Contains(err.Error(), `PLUGD_KUBELET_MINOR="1.20"`) || !strings.Contains(err.Error(), "1.35, 1.36, 1.37") {
		t.Errorf("minor 1.20: %v", err)
	}

	// This test's own binary, as the newest kubelet: a Go binary without
	// k8s.io/kubernetes in it.
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	bin := t.TempDir()
	if err := os.Symlink(self, filepath.Join(bin, "kubelet")); err != nil {
		t.Fatal(err)
	}
	_, err = BuildKubelet(Dirs{Bin: bin}, "", io.Discard)
	if err == nil || !strings.Contains(err.Error(), `built from k8s.io/kubernetes "", not of minor `+NewestMinor) {
		t.Errorf("a kubelet binary not built from k8s.io/kubernetes: %v", err)
	}
}

func TestKubeletAtLeast(t *testing.T) {
	for _, c := range []struct {
		have, need string
		want       bool
	}{{"1.35", "1.36", false}, {"1.36", "1.36", true}, {"1.37", "1.36", true}, {"1.35", "1.35", true}} {
		if got := (Kubelet{Minor: c.have}).AtLeast(c.need); got != c.want {
			t.Errorf("%s at least %s: %v", c.have, c.need, got)
		}
	}
}
