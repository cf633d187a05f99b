package daemon

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/plugd/plugd/internal/confine"
	"github.com/plugd/plugd/internal/smallfile"
)

// systemDirs are directories plugd refuses as its registry directory. It
// watches everything beneath the directory (an inotify watch for each
// subdirectory) and dials every socket there: at / or /run that is every
// service's socket on the machine, each told it was registered.
var systemDirs = []string{
	"/", "/bin", "/boot", "/dev", "/dev/shm", "/etc", "/home", "/lib", "/lib32", "/lib64", "/libx32",
	"/media", "/mnt", "/opt", "/root", "/run", "/run/user", "/sbin", "/srv", "/tmp",
	"/usr", "/usr/bin", "/usr/lib", "/usr/local", "/usr/sbin", "/usr/share",
	"/var", "/var/cache", "/var/lib", "/var/log", "/var/run", "/var/tmp",
}

// pseudoFilesystems hold no plugins' sockets, only the kernel's files.
var pseudoFilesystems = []string{"/proc", "/sys"}

// checkRegistryDir refuses a registry directory that is a system directory,
// named or reached through symlinks; dir is absolute and clean.
func checkRegistryDir(dir string) error {
	resolved := confine.ResolveExisting(dir)
	for _, p := range slices.Compact([]string{dir, resolved}) {
		through := ""
		if p != dir {
			through = fmt.Sprintf(" (through symlinks, %s)", p)
		}
		switch {
		case p == "/var/lib/kubelet":
			return fmt.Errorf("registryDir %s%s is the kubelet's root directory, which holds every pod's volumes and every plugin's endpoint: plugd would dial each socket there; the kubelet's plugins register in /var/lib/kubelet/plugins_registry", dir, through)
		case slices.Contains(systemDirs, p) || isUserDir(p):
			return fmt.Errorf("registryDir %s%s is a system directory: plugd would watch every directory beneath it and dial every socket there, those of other services too; use a directory of plugd's own, such as /run/plugd/plugins, or /var/lib/kubelet/plugins_registry for the kubelet's plugins", dir, through)
		}
		for _, fsys := range pseudoFilesystems {
			if confine.Within(p, fsys) {
				return fmt.Errorf("registryDir %s%s is in %s, which holds the kernel's files and no plugin's socket; use a directory of plugd's own, such as /run/plugd/plugins", dir, through, fsys)
			}
		}
	}
	return nil
}

// isUserDir says whether dir is the home or the runtime directory of plugd's
// user, which hold that user's own services' sockets.
func isUserDir(dir string) bool {
	home, _ := os.UserHomeDir()
	for _, d := range []string{home, os.Getenv("XDG_RUNTIME_DIR")} {
		if d != "" && filepath.IsAbs(d) && filepath.Clean(d) == dir {
			return true
		}
	}
	return false
}

// checkStatusSocket refuses a status socket inside the registry directory:
// plugd would find it there and dial its own status API as a plugin,
// forever. Both paths are absolute and clean.
func checkStatusSocket(socket, dir string) error {
	rs, rd := confine.ResolveExisting(socket), confine.ResolveExisting(dir)
	if confine.Within(socket, dir) || confine.Within(rs, rd) {
		return fmt.Errorf("status.socket %s is inside registryDir %s: plugd would find its own status socket there and dial it as a plugin; put it beside the directory, such as %s", socket, dir, filepath.Join(filepath.Dir(dir), "plugd.sock"))
	}
	return nil
}

// statusTCP checks status.tcp and returns the address to listen on. Unless
// non-loopback addresses are allowed, the host must be a loopback IP
// address, or "localhost", which is taken as 127.0.0.1 without asking
// /etc/hosts or DNS (RFC 6761): a name resolved there could be pointed at a
// network address, and the resolution at start and the one at listen could
// differ. What is checked is then what is bound.
func statusTCP(addr string, allowNonLoopback bool) (string, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", fmt.Errorf("status.tcp is %q: it must be host:port, such as 127.0.0.1:9090", addr)
	}
	if strings.EqualFold(strings.TrimSuffix(host, "."), "localhost") {
		host = "127.0.0.1"
		addr = net.JoinHostPort(host, port)
	}
	if allowNonLoopback {
		return addr, nil
	}
	ip := net.ParseIP(host)
	switch {
	case ip == nil:
		return "", fmt.Errorf("status.tcp is %q: without status.allowNonLoopback it must be a loopback IP address, such as 127.0.0.1:9090 or [::1]:9090 (or localhost, which means 127.0.0.1): a host name is resolved through /etc/hosts and DNS, which could point it at a network address", addr)
	case !ip.IsLoopback():
		return "", fmt.Errorf("status.tcp is %q, which is not a loopback address: the status API has no authentication; use 127.0.0.1, or set status.allowNonLoopback to expose it", addr)
	}
	return addr, nil
}

// maxConfigSize bounds the configuration file: the commented example with
// every setting is 8 KiB.
const maxConfigSize = 1 << 20

// readConfigFile reads a configuration file: a regular file of at most
// maxConfigSize, read without blocking. /dev/zero would never end, and a
// FIFO would hold plugd (and a reload on SIGHUP) until someone writes to it.
func readConfigFile(path string) ([]byte, error) {
	b, err := smallfile.Read(path, maxConfigSize)
	var se *smallfile.Error
	switch {
	case errors.As(err, &se) && se.Kind != "":
		return nil, fmt.Errorf("config %w: plugd reads its configuration whole, at start and on SIGHUP; give the path of a YAML file", err)
	case errors.As(err, &se):
		return nil, fmt.Errorf("config %w, more than any configuration: is it the right file?", err)
	case err != nil:
		return nil, fmt.Errorf("reading config: %w", err)
	}
	return b, nil
}
