package pluginmanager

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/fsnotify/fsnotify"
	"golang.org/x/sys/unix"
)

// fileID is the identity of a socket file. A socket removed and created again at
// the same path is a different file, and so a new registration, even when the
// filesystem hands out the same inode number again: the birth time tells them
// apart. Filesystems that keep no birth time fall back to the change time,
// which a chmod also moves.
type fileID struct {
	dev, ino  uint64
	sec, nsec int64
}

// statSocket reports the identity of the unix socket at path, without following
// a symlink. ok is false if there is nothing there or it is not a socket.
func statSocket(path string) (id fileID, ok bool) {
	var st unix.Statx_t
	mask := unix.STATX_TYPE | unix.STATX_INO | unix.STATX_BTIME | unix.STATX_CTIME
	if err := unix.Statx(unix.AT_FDCWD, path, unix.AT_SYMLINK_NOFOLLOW, mask, &st); err != nil {
		return fileID{}, false
	}
	if st.Mode&unix.S_IFMT != unix.S_IFSOCK {
		return fileID{}, false
	}
	id = fileID{dev: unix.Mkdev(st.Dev_major, st.Dev_minor), ino: st.Ino}
	if st.Mask&unix.STATX_BTIME != 0 {
		id.sec, id.nsec = st.Btime.Sec, int64(st.Btime.Nsec)
	} else {
		id.sec, id.nsec = st.Ctime.Sec, int64(st.Ctime.Nsec)
	}
	return id, true
}

// hidden reports whether a name is one the manager ignores: a dot-name, which
// plugins use for sockets that are not listening yet.
func hidden(name string) bool { return strings.HasPrefix(name, ".") }

// watchTree adds an fsnotify watch on root and every directory below it that is
// not hidden and not a symlink, and calls found for every socket in them. It
// goes on past errors and returns the first.
func watchTree(w *fsnotify.Watcher, root string, found func(path string, id fileID)) error {
	var first error
	keep := func(err error) {
		if first == nil && err != nil {
			first = err
		}
	}
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) && path != root {
				return nil // removed while we walked: its Remove event follows
			}
			keep(err)
			if d != nil && d.IsDir() {
				return fs.SkipDir
			}
			return nil
		}
		if path != root && hidden(d.Name()) {
			if d.IsDir() {
				return fs.SkipDir
			}
			return nil
		}
		switch {
		case d.IsDir(): // WalkDir never follows a symlink, so this is a real directory
			keep(w.Add(path))
		case d.Type()&fs.ModeSocket != 0:
			if id, ok := statSocket(path); ok {
				found(path, id)
			}
		}
		return nil
	})
	keep(err)
	return first
}

// handleFSEvent turns one fsnotify event into work. Events are only hints: the
// worker reads the file as it is now and decides.
func (m *Manager) handleFSEvent(w *fsnotify.Watcher, ev fsnotify.Event) {
	if hidden(filepath.Base(ev.Name)) {
		return
	}
	switch {
	case ev.Has(fsnotify.Create):
		fi, err := os.Lstat(ev.Name)
		if err != nil {
			m.queue.add(ev.Name) // gone already; the worker forgets it if we knew it
			return
		}
		if fi.IsDir() {
			// Sockets may have appeared in it before the watch was in place.
			if err := watchTree(w, ev.Name, func(path string, _ fileID) { m.queue.add(path) }); err != nil {
				m.log.Warn("watching new directory", "dir", ev.Name, "err", err)
			}
			return
		}
		if fi.Mode()&fs.ModeSocket != 0 {
			m.queue.add(ev.Name)
		}
	case ev.Has(fsnotify.Remove), ev.Has(fsnotify.Rename):
		if ev.Has(fsnotify.Rename) {
			// A directory moved out of the tree keeps its inotify watch; drop it.
			// (An error only means it was not a watched directory.)
			_ = w.Remove(ev.Name)
		}
		// It may have been a socket or a whole directory of them.
		m.queue.add(ev.Name)
		m.enqueueUnder(ev.Name)
	}
}
