package doctor

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/plugd/plugd/api"
	"github.com/plugd/plugd/internal/textsafe"
)

// roots is what Check found of kubelet root directories: the running
// kubelets, if any are visible, the processes that only call themselves
// the kubelet, and registration sockets outside the directory plugd
// watches.
type roots struct {
	// kubelet is the running kubelet: the one that watches plugd's
	// directory, else the first found; nil if none is.
	kubelet   *runningKubelet
	kubelets  []runningKubelet
	impostors []namedKubelet
	sockets   []rootSocket
}

type rootSocket struct{ root, path string }

func (r roots) socketsOutside() []string {
	var out []string
	for _, s := range r.sockets {
		out = append(out, shown(s.path))
	}
	return out
}

// maxShown bounds text from outside plugd's configuration (a process's
// command line, a file name under another kubelet root) in a finding: it
// is escaped (textsafe) and cut to this many bytes, a path's longest.
const maxShown = 4096

// shown is text from outside, as a finding shows it.
func shown(s string) string { return textsafe.Printable(s, maxShown) }

// findRoots finds the running kubelets and the sockets under the other
// kubelet roots.
func findRoots(in Input) roots {
	var r roots
	if in.ProcDir != "" {
		for _, k := range findKubelets(in.ProcDir, os.Geteuid()) {
			if k.why != "" {
				r.impostors = append(r.impostors, k)
			} else {
				r.kubelets = append(r.kubelets, k.runningKubelet)
			}
		}
		for i := range r.kubelets {
			if r.kubelet == nil || sameDir(r.kubelets[i].registry(), in.RegistryDir) {
				r.kubelet = &r.kubelets[i]
			}
		}
	}
	dirs := slices.Clone(in.KubeletRoots)
	for _, k := range r.kubelets {
		if !slices.Contains(dirs, k.rootDir) {
			dirs = append(dirs, k.rootDir)
		}
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

// sameDir says a and b are one directory.
func sameDir(a, b string) bool {
	if filepath.Clean(a) == filepath.Clean(b) {
		return true
	}
	fa, errA := os.Stat(a)
	fb, errB := os.Stat(b)
	return errA == nil && errB == nil && os.SameFile(fa, fb)
}

// otherRoots reports each running kubelet that watches another directory
// than plugd, the processes that only call themselves the kubelet, and
// sockets written under another kubelet root than the one in use.
func (c *checker) otherRoots() {
	for i := range c.roots.kubelets {
		k := &c.roots.kubelets[i]
		if sameDir(k.registry(), c.in.RegistryDir) {
			continue
		}
		how := "default root directory"
		if k.flag {
			how = "--root-dir " + k.shownRoot()
		}
		c.add(api.Finding{Severity: api.SeverityError, Check: "other-kubelet-root",
			Summary:  fmt.Sprintf("the running kubelet registers plugins from %s, but plugd watches %s", k.shownRegistry(), c.in.RegistryDir),
			Evidence: []string{fmt.Sprintf("kubelet pid %d, %s", k.pid, how), "kubelet pid " + strconv.Itoa(k.pid) + " " + k.mountNS},
			Remedy:   fmt.Sprintf("point plugd at the kubelet's directory: registryDir %s (and the DaemonSet's hostPath)", k.shownRegistry())})
	}
	c.impostors()
	k := c.roots.kubelet
	for _, s := range c.roots.sockets {
		f := api.Finding{Severity: api.SeverityWarning, Check: "other-kubelet-root", Socket: shown(s.path),
			Summary:  fmt.Sprintf("a registration socket is under the kubelet root %s, not in %s", s.root, c.in.RegistryDir),
			Evidence: []string{"socket: " + shown(s.path)}}
		switch {
		case k != nil && sameDir(s.root, k.rootDir):
			f.Remedy = "the kubelet uses this root: point plugd at " + k.shownRegistry()
		case k != nil:
			f.Evidence = append(f.Evidence, fmt.Sprintf("the running kubelet (pid %d) uses root %s", k.pid, k.shownRoot()))
			f.Remedy = fmt.Sprintf("the plugin writes under the wrong kubelet root: set its kubelet directory to %s (a Helm chart's kubeletDir; the DaemonSet's hostPath mounted at node-driver-registrar's --plugin-registration-path, which picks the directory its registration socket is made in; and its --kubelet-registration-path, the driver socket's path on the host, under the same root)", k.shownRoot())
		default:
			f.Remedy = fmt.Sprintf("if this node's kubelet uses %s, point plugd at %s; otherwise the plugin writes under the wrong kubelet root: set its kubelet directory to %s", s.root, filepath.Join(s.root, "plugins_registry"), filepath.Dir(c.in.RegistryDir))
		}
		c.add(f)
	}
}

// impostors reports the processes that call themselves the kubelet but
// are not taken for it, so that an operator sees why the doctor believed
// another process, or none.
func (c *checker) impostors() {
	im := c.roots.impostors
	if len(im) == 0 {
		return
	}
	f := api.Finding{Severity: api.SeverityInfo, Check: "kubelet-process-ignored",
		Summary: fmt.Sprintf("%d processes call themselves the kubelet but are not taken for it: the kubelet runs as root (or plugd's user) a program named kubelet, in init's mount namespace", len(im)),
		Remedy:  "nothing, if they are yours (a test, a kubelet in a user namespace or a container); otherwise see who started them: ps -o pid,user,args -p PID"}
	for i, k := range im {
		if i == maxImpostors {
			f.Evidence = append(f.Evidence, fmt.Sprintf("and %d more", len(im)-i))
			break
		}
		root := "the default root directory"
		if k.flag {
			root = "--root-dir " + k.shownRoot()
		}
		f.Evidence = append(f.Evidence, fmt.Sprintf("pid %d, named %s, %s: not taken, as %s", k.pid, k.program, root, k.why))
	}
	c.add(f)
}
