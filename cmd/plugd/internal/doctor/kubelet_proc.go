package doctor

import (
	"bytes"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// Bounds on what the doctor reads of a process: the kubelet's command line
// is a few KiB, its status file about 1.5 KiB.
const (
	maxCmdline = 64 << 10
	maxStatus  = 8 << 10
	// maxImpostors is how many processes named kubelet but not taken for it
	// a finding lists; it counts the others.
	maxImpostors = 5
)

// runningKubelet is a process the doctor takes for the node's kubelet, and
// the root directory it uses.
type runningKubelet struct {
	pid     int
	rootDir string
	flag    bool   // the root came from --root-dir, not the default
	mountNS string // what the doctor assumed of its mount namespace (checkMountNS)
}

func (k *runningKubelet) registry() string { return filepath.Join(k.rootDir, "plugins_registry") }

// shownRoot is the root directory as a finding shows it: it comes from a
// command line, so it is escaped and cut.
func (k *runningKubelet) shownRoot() string { return shown(k.rootDir) }

func (k *runningKubelet) shownRegistry() string { return shown(k.registry()) }

// namedKubelet is a process whose command line says it is the kubelet
// (argv[0] kubelet, or k3s agent|server), and what the doctor found of it.
type namedKubelet struct {
	runningKubelet
	program  string // what argv[0] names: kubelet or k3s
	uid, exe string // its real and effective uid, its executable; "" where unreadable
	why      string // why it is not taken for the kubelet; "" when it is
}

// findKubelets lists the processes in procDir whose command line says they
// are the kubelet, and decides which are: a process is the kubelet only if
// it runs as root or as plugd's own user (real and effective uid), and its
// executable (/proc/PID/exe) is named kubelet (k3s for k3s), so not a
// script interpreter or any other program started with argv[0] "kubelet".
// Any local user can start a process with any argv[0] and any
// --root-dir; only root (or plugd's user) can start one that passes.
// Every process is looked at, so that one that is not the kubelet cannot
// hide one that is by coming first. A root process whose executable is
// named kubelet may still be a kubelet in a container (kind, a test
// cluster), whose root directory is not this host's: one in another mount
// namespace than init's is not taken (checkMountNS).
func findKubelets(procDir string, self int) []namedKubelet {
	ents, err := os.ReadDir(procDir)
	if err != nil {
		return nil
	}
	host := hostMountNS{init: mountNS(filepath.Join(procDir, "1")), self: mountNS(filepath.Join(procDir, "self"))}
	var out []namedKubelet
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid <= 0 {
			continue
		}
		dir := filepath.Join(procDir, e.Name())
		k, ok := namedAsKubelet(dir)
		if !ok {
			continue
		}
		k.pid = pid
		k.uid, k.why = checkOwner(dir, self)
		if k.why == "" {
			k.exe, k.why = checkExe(dir, k.program)
		}
		if k.why == "" {
			k.mountNS, k.why = checkMountNS(mountNS(dir), host)
		}
		out = append(out, k)
	}
	return out
}

// namedAsKubelet reads the command line in dir and says whether it is the
// kubelet's, with the root directory it names.
func namedAsKubelet(dir string) (namedKubelet, bool) {
	b, err := readUpTo(filepath.Join(dir, "cmdline"), maxCmdline)
	if err != nil || len(b) == 0 {
		return namedKubelet{}, false
	}
	args := strings.Split(string(bytes.TrimRight(b, "\x00")), "\x00")
	k := namedKubelet{program: filepath.Base(args[0])}
	switch k.program {
	case "kubelet":
		k.rootDir = "/var/lib/kubelet"
	case "k3s":
		if len(args) < 2 || (args[1] != "agent" && args[1] != "server") {
			return k, false
		}
		k.rootDir = "/var/lib/rancher/k3s/agent/kubelet"
	default:
		return k, false
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
	return k, true
}

// checkOwner reads the real and effective uid of the process in dir, and
// says why it is not the kubelet's if they are not root's or self's.
func checkOwner(dir string, self int) (uid, why string) {
	b, err := readUpTo(filepath.Join(dir, "status"), maxStatus)
	if err != nil {
		return "", "its owner cannot be read: " + err.Error()
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 3 || f[0] != "Uid:" {
			continue
		}
		real, effective := f[1], f[2]
		uid = real
		if effective != real {
			uid = real + " (effective " + effective + ")"
		}
		for _, id := range []string{real, effective} {
			if id != "0" && id != strconv.Itoa(self) {
				return uid, "it runs as uid " + uid + ", neither root nor plugd's user"
			}
		}
		return uid, ""
	}
	return "", "its status has no Uid line"
}

// checkExe reads which program the process in dir runs, and says why it is
// not the kubelet if the program is not named want. A binary replaced on
// disk since it started (an upgrade) still counts.
func checkExe(dir, want string) (exe, why string) {
	exe, err := os.Readlink(filepath.Join(dir, "exe"))
	if err != nil {
		return "", "its executable cannot be read: " + err.Error()
	}
	if filepath.Base(strings.TrimSuffix(exe, " (deleted)")) != want {
		return exe, "it runs " + shown(exe) + ", not a program named " + want
	}
	return exe, ""
}

// hostMountNS is what the doctor compares a kubelet's mount namespace
// with: init's (pid 1 of the process table read), the host's when the
// table is the host's; and plugd's own, for when init's cannot be read
// (a kernel or sandbox that hides pid 1's namespaces even from root).
type hostMountNS struct{ init, self string }

// mountNS is the mount namespace of the process in dir, as the kernel
// names it ("mnt:[4026531841]"), or "" where it cannot be read.
func mountNS(dir string) string {
	ns, err := os.Readlink(filepath.Join(dir, "ns", "mnt"))
	if err != nil {
		return ""
	}
	return ns
}

// checkMountNS says what the doctor assumes of a kubelet in the mount
// namespace ns (assumed, shown in its findings), or why it is not taken:
// in another namespace than init's, it is a kubelet in a container, and
// the paths it names are in that container's view. Where the namespaces
// cannot be compared it is taken as the host's, and says so.
func checkMountNS(ns string, host hostMountNS) (assumed, why string) {
	switch {
	case ns == "":
		return "its mount namespace cannot be read: taken as the host's", ""
	case host.init == ns:
		return "in init's mount namespace " + ns + ": the host's", ""
	case host.init != "":
		return "", "it runs in the mount namespace " + shown(ns) + ", not init's (" + shown(host.init) + "): a kubelet in a container, whose directories are not the host's"
	case host.self == ns:
		return "in plugd's own mount namespace " + ns + " (init's cannot be read): taken as the host's", ""
	}
	return "in the mount namespace " + shown(ns) + ", not plugd's (" + shown(host.self) + "), and init's cannot be read to tell the host's: taken as the host's", ""
}

// readUpTo reads at most max bytes of the file at path.
func readUpTo(path string, max int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return io.ReadAll(io.LimitReader(f, max))
}
