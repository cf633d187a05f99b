package doctor

import (
	"bytes"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/plugd/plugd/api"
)

// roots is what Check found of kubelet root directories: the running
// kubelet, if one is visible, and registration sockets outside the
// directory plugd watches.
type roots struct {
	kubelet *runningKubelet
	sockets []rootSocket
}

type runningKubelet struct {
	pid     int
	rootDir string
	flag    bool // the root came from --root-dir, not the default
}

func (k *runningKubelet) registry() string { return filepath.Join(k.rootDir, "plugins_registry") }

type rootSocket struct{ root, path string }

func (r roots) socketsOutside() []string {
	var out []string
	for _, s := range r.sockets {
		out = append(out, s.path)
	}
	return out
}

// findRoots finds the running kubelet and the sockets under the other
// kubelet roots.
func findRoots(in Input) roots {
	var r roots
	if in.ProcDir != "" {
		r.kubelet = findKubelet(in.ProcDir)
	}
	dirs := slices.Clone(in.KubeletRoots)
	if r.kubelet != nil && !slices.Contains(dirs, r.kubelet.rootDir) {
		dirs = append(dirs, r.kubelet.rootDir)
	}
	for _, root := range dirs {
		reg := filepath.Join(root, "plugins_registry")
		if sameDir(reg, in.RegistryDir) {
			continue
		}
		seen := 0
		_ = filepath.WalkDir(reg, func(path string, d fs.DirEntry, err error) error {
			if err != nil || seen >= maxRootWalk {
				return filepath.SkipDir
			}
			seen++
			if d.IsDir() {
				if path != reg && (strings.HasPrefix(d.Name(), ".") || strings.Count(strings.TrimPrefix(path, reg), "/") > 2) {
					return filepath.SkipDir
				}
				return nil
			}
			if d.Type()&fs.ModeSocket != 0 && !strings.HasPrefix(d.Name(), ".") {
				r.sockets = append(r.sockets, rootSocket{root, path})
			}
			return nil
		})
	}
	return r
}

// findKubelet looks for a kubelet among the processes in procDir, and the
// root directory it uses: its --root-dir, or the default.
func findKubelet(procDir string) *runningKubelet {
	ents, err := os.ReadDir(procDir)
	if err != nil {
		return nil
	}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join(procDir, e.Name(), "cmdline"))
		if err != nil || len(b) == 0 {
			continue
		}
		args := strings.Split(string(bytes.TrimRight(b, "\x00")), "\x00")
		k := &runningKubelet{pid: pid}
		switch filepath.Base(args[0]) {
		case "kubelet":
			k.rootDir = "/var/lib/kubelet"
		case "k3s":
			if len(args) < 2 || (args[1] != "agent" && args[1] != "server") {
				continue
			}
			k.rootDir = "/var/lib/rancher/k3s/agent/kubelet"
		default:
			continue
		}
		for i, a := range args[1:] {
			switch {
			case strings.HasPrefix(a, "--root-dir="):
				k.rootDir, k.flag = strings.TrimPrefix(a, "--root-dir="), true
			case a == "--root-dir" && i+2 < len(args):
				k.rootDir, k.flag = args[i+2], true
			case strings.HasPrefix(a, "--kubelet-arg=root-dir="):
				k.rootDir, k.flag = strings.TrimPrefix(a, "--kubelet-arg=root-dir="), true
			}
		}
		return k
	}
	return nil
}

// sameDir says a and b are one directory.
func sameDir(a, b string) bool {
	if filepath.Clean(a) == filepath.Clean(b) {
		return true
	}
	fa, errA := os.Stat(a)
	fb, errB := os.Stat(b)
	return errA == nil && errB == nil && os.SameFile(fa, fb)
}

// otherRoots reports a kubelet that watches another directory than plugd,
// and sockets written under another kubelet root than the one in use.
func (c *checker) otherRoots() {
	k := c.roots.kubelet
	if k != nil && !sameDir(k.registry(), c.in.RegistryDir) {
		how := "default root directory"
		if k.flag {
			how = "--root-dir " + k.rootDir
		}
		c.add(api.Finding{Severity: api.SeverityError, Check: "other-kubelet-root",
			Summary:  fmt.Sprintf("the running kubelet registers plugins from %s, but plugd watches %s", k.registry(), c.in.RegistryDir),
			Evidence: []string{fmt.Sprintf("kubelet pid %d, %s", k.pid, how)},
			Remedy:   fmt.Sprintf("point plugd at the kubelet's directory: registryDir %s (and the DaemonSet's hostPath)", k.registry())})
	}
	for _, s := range c.roots.sockets {
		f := api.Finding{Severity: api.SeverityWarning, Check: "other-kubelet-root", Socket: s.path,
			Summary:  fmt.Sprintf("a registration socket is under the kubelet root %s, not in %s", s.root, c.in.RegistryDir),
			Evidence: []string{"socket: " + s.path}}
		switch {
		case k != nil && sameDir(s.root, k.rootDir):
			f.Remedy = "the kubelet uses this root: point plugd at " + k.registry()
		case k != nil:
			f.Evidence = append(f.Evidence, fmt.Sprintf("the running kubelet (pid %d) uses root %s", k.pid, k.rootDir))
			f.Remedy = fmt.Sprintf("the plugin writes under the wrong kubelet root: set its kubelet directory to %s (a Helm chart's kubeletDir, node-driver-registrar's --kubelet-registration-path, the DaemonSet's hostPath)", k.rootDir)
		default:
			f.Remedy = fmt.Sprintf("if this node's kubelet uses %s, point plugd at %s; otherwise the plugin writes under the wrong kubelet root: set its kubelet directory to %s", s.root, filepath.Join(s.root, "plugins_registry"), filepath.Dir(c.in.RegistryDir))
		}
		c.add(f)
	}
}
