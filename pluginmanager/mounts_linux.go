package pluginmanager

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// A bind mount over a directory of sockets hides them, and its umount
// shows them again, and neither makes an inotify event: the watch would see
// it only at the next resync (Options.ResyncInterval, 30 s), keeping a
// hidden socket's plugin registered meanwhile (its held connection still
// answers). On Linux the mount table tells: the kernel marks
// /proc/self/mountinfo with POLLPRI whenever a mount or an umount happens
// in plugd's mount namespace. watchMounts waits for that, and when the
// mounts on the way to the registry directory or below it have changed
// (mountsOn), tells the watcher, which looks at the whole tree again
// (watcher.remounted): within mountSettle of the change, plus a walk.

// mountSettle is how long a change of the mount table is let settle
// before the table is read: a pod starting mounts a dozen things at once,
// and one read of the table covers them all.
const mountSettle = 100 * time.Millisecond

// watchMounts calls changed, from a goroutine of its own, whenever the
// mounts on the way to dir (and to what its symlinks resolve to), or
// below it, change. stop ends that goroutine and returns once it has
// exited.
func watchMounts(dir string, changed func(), log *slog.Logger) (stop func(), err error) {
	dirs := []string{filepath.Clean(dir)}
	if real, err := filepath.EvalSymlinks(dir); err == nil && real != dirs[0] {
		dirs = append(dirs, real)
	}
	table, err := unix.Open("/proc/self/mountinfo", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("watching the mount table: %w", err)
	}
	wake, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		unix.Close(table)
		return nil, fmt.Errorf("watching the mount table: %w", err)
	}
	last, _ := readMountsOn(dirs)
	var wg sync.WaitGroup
	wg.Go(func() {
		for waitMounts(table, wake, log) {
			if now, err := readMountsOn(dirs); err == nil && now != last {
				last = now
				changed()
			}
		}
	})
	return func() {
		unix.Write(wake, []byte{1, 0, 0, 0, 0, 0, 0, 0})
		wg.Wait()
		unix.Close(table)
		unix.Close(wake)
	}, nil
}

// waitMounts waits for the mount table (table) to change, then for
// mountSettle more, and reports true; or false once wake is written to.
func waitMounts(table, wake int, log *slog.Logger) bool {
	fds := []unix.PollFd{{Fd: int32(wake), Events: unix.POLLIN}, {Fd: int32(table), Events: unix.POLLPRI}}
	for {
		_, err := unix.Poll(fds, -1)
		switch {
		case errors.Is(err, unix.EINTR):
			continue
		case err != nil:
			log.Warn("cannot watch the mount table; a bind mount over a directory of sockets is seen at the next resync", "err", err)
			return false
		case fds[0].Revents != 0:
			return false
		case fds[1].Revents&(unix.POLLPRI|unix.POLLERR) == 0:
			continue
		}
		for {
			_, err := unix.Poll(fds[:1], int(mountSettle/time.Millisecond))
			if !errors.Is(err, unix.EINTR) {
				break
			}
		}
		return fds[0].Revents == 0
	}
}

// readMountsOn reads the mount table and returns mountsOn of it.
func readMountsOn(dirs []string) (string, error) {
	table, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return "", err
	}
	return mountsOn(table, dirs), nil
}

// mountsOn is the mounts of table (the text of /proc/self/mountinfo) whose
// mount point is one of dirs, on the way to one, or below one, each as its
// mount ID and mount point, in the table's order: what changes when a
// directory of the registry's tree is mounted over, unmounted or mounted
// again, and not when a pod mounts something elsewhere.
func mountsOn(table []byte, dirs []string) string {
	var b strings.Builder
	for line := range bytes.Lines(table) {
		// ID, parent ID, major:minor, root, mount point, ...
		f := strings.Fields(string(line))
		if len(f) < 5 {
			continue
		}
		point := unescapeMount(f[4])
		if slices.ContainsFunc(dirs, func(dir string) bool { return onTheWay(point, dir) }) {
			b.WriteString(f[0] + " " + point + "\n")
		}
	}
	return b.String()
}

// onTheWay reports whether the mount point point is dir, on the way to it,
// or below it.
func onTheWay(point, dir string) bool {
	return point == dir || point == "/" || strings.HasPrefix(dir, point+"/") || strings.HasPrefix(point, dir+"/")
}

// unescapeMount undoes the octal escapes of a mount point in the mount
// table (space, tab, newline and backslash are written \040, \011, \012
// and \134).
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) && isOctal(s[i+1]) && isOctal(s[i+2]) && isOctal(s[i+3]) {
			b.WriteByte((s[i+1]-'0')<<6 | (s[i+2]-'0')<<3 | (s[i+3] - '0'))
			i += 3
			continue
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

func isOctal(c byte) bool { return c >= '0' && c <= '7' }
