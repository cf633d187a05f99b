package pluginmanager

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"unicode"
	"unicode/utf8"

	"github.com/fsnotify/fsnotify"

	"github.com/plugd/plugd/internal/confine"
	"github.com/plugd/plugd/internal/dirtrust"
)

// fileID is the identity of a socket file. A socket removed and created again at
// the same path is a different file, and so a new registration, even when the
// filesystem hands out the same inode number again: the birth time tells them
// apart. Filesystems that keep no birth time fall back to the change time,
// which a chmod also moves. statSocket reads it, per OS (sys_*.go).
type fileID struct {
	dev, ino  uint64
	sec, nsec int64
}

// hidden reports whether a name is one the manager ignores: a dot-name, which
// plugins use for sockets that are not listening yet.
func hidden(name string) bool { return strings.HasPrefix(name, ".") }

// unprintable reports whether a name would put control characters (terminal
// escapes, newlines) into logs, the status API and an operator's terminal. No
// plugin needs such a name; one that has it is ignored, with a warning.
func unprintable(name string) bool {
	return !utf8.ValidString(name) || strings.IndexFunc(name, func(r rune) bool { return !unicode.IsPrint(r) }) >= 0
}

// watcher is the filesystem side of the manager: an fsnotify watch on every
// directory of the tree. It belongs to the goroutine running Manager.watch.
type watcher struct {
	fs   *fsnotify.Watcher
	dirs map[string]bool // directories watched, to tell a removed directory from a removed socket

	// The directories below the registry directory (top) are held to its
	// rule (see take); refused are the ones that fail it, each with what
	// was said about it, said again only when that changes.
	top     string
	trust   bool // check them: not with Options.AllowWritableDir
	observe bool // take them anyway, and warn (Options.Observe)
	refused map[string]string
	log     *slog.Logger
}

func (m *Manager) newWatcher(fs *fsnotify.Watcher) *watcher {
	return &watcher{fs: fs, dirs: make(map[string]bool),
		top: m.opts.Dir, trust: !m.opts.AllowWritableDir, observe: m.opts.Observe,
		refused: make(map[string]string), log: m.log}
}

// take reports whether the sockets in dir, a directory below the registry
// directory, are to be registered: not if users other than plugd's and root
// could change it (dirtrust.CheckBelow), for whoever could plant a plugin
// in the registry directory itself. The workers hold sockets to the same
// rule (parts.subdirsTrusted); an observer takes them, and warns.
func (w *watcher) take(dir string) bool {
	if !w.trust {
		return true
	}
	err := dirtrust.CheckBelow(dir, os.Geteuid())
	var u *dirtrust.Untrusted
	if !errors.As(err, &u) {
		// Safe, or gone (its Remove event follows), or unreadable (the
		// walk says so): nothing to say about who may change it.
		if _, was := w.refused[dir]; was && err == nil {
			delete(w.refused, dir)
			if !w.observe {
				w.log.Info("a directory in the registry directory is safe from other users again; registering its plugins", "dir", dir)
			}
		}
		return true
	}
	if w.refused[dir] != err.Error() {
		w.refused[dir] = err.Error()
		if w.observe {
			w.log.Warn("a directory in the registry directory is not safe from other users: they could plant a plugin there, or replace one, for the manager observed as for plugd; fix it, or set Options.AllowWritableDir to accept it",
				"dir", dir, "err", err)
		} else {
			w.log.Warn("not registering the plugins in a directory of the registry directory that users other than plugd's and root could change, until it is fixed; or, to accept it, set Options.AllowWritableDir (plugd: policy.allowWritableRegistryDir)",
				"dir", dir, "err", err)
		}
	}
	return w.observe
}

// watchTree adds an fsnotify watch on root and every directory below it that is
// not hidden, not a symlink and, below the registry directory, safe (take),
// and calls found for every socket in them. It goes on past errors and
// returns the first.
func (w *watcher) watchTree(root string, found func(path string, id fileID)) error {
	var first error
	keep := func(err error) {
		if first == nil && err != nil {
			first = err
		}
	}
	// The registry directory itself may be a symlink (a moved /var/lib, say):
	// that one is the operator's choice, and is followed. WalkDir would not
	// descend into it, unless asked for what is inside it with a trailing slash.
	walkRoot := root
	if fi, err := os.Lstat(root); err == nil && fi.Mode()&fs.ModeSymlink != 0 {
		walkRoot = root + string(filepath.Separator)
	}
	err := filepath.WalkDir(walkRoot, func(path string, d fs.DirEntry, err error) error {
		if path == walkRoot {
			path = root
		}
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
		if path != root && (hidden(d.Name()) || unprintable(d.Name())) {
			if d.IsDir() {
				return fs.SkipDir
			}
			return nil
		}
		switch {
		case d.IsDir(): // WalkDir never follows a symlink, so this is a real directory
			if path != w.top && !w.take(path) {
				return fs.SkipDir
			}
			if err := w.fs.Add(path); err != nil {
				if errors.Is(err, syscall.ENOSPC) {
					err = fmt.Errorf("watching %s: the system's inotify watch limit is reached (raise fs.inotify.max_user_watches); sockets there are found by the periodic resync only: %w", path, err)
				}
				keep(err)
			} else {
				w.dirs[path] = true
			}
		case maybeSocket(d.Type()):
			// A socket, or on Windows maybe one that does not say so.
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
func (m *Manager) handleFSEvent(w *watcher, ev fsnotify.Event) {
	root := m.opts.Dir
	if ev.Name == root || !confine.Within(ev.Name, root) {
		m.handleRootEvent(w, ev)
		return
	}
	name := filepath.Base(ev.Name)
	if hidden(name) {
		return
	}
	if unprintable(name) {
		if ev.Has(fsnotify.Create) {
			m.log.Warn("ignoring a file whose name has control characters or is not UTF-8; rename it to register it",
				"dir", filepath.Dir(ev.Name), "name", strconv.Quote(name))
		}
		return
	}
	switch {
	case ev.Has(fsnotify.Create):
		fi, err := os.Lstat(ev.Name)
		if err != nil {
			m.queue.Add(ev.Name) // gone already; the worker forgets it if we knew it
			return
		}
		if fi.IsDir() {
			// Sockets may have appeared in it before the watch was in place.
			if err := w.watchTree(ev.Name, func(path string, _ fileID) { m.queue.Add(path) }); err != nil {
				m.log.Warn("watching new directory", "dir", ev.Name, "err", err)
			}
			return
		}
		if maybeSocket(fi.Mode()) || m.known(ev.Name) {
			// A file, FIFO or symlink renamed over a known socket is a
			// Create of its path too: the worker finds no socket there,
			// and lets the plugin go now, not at its next probe.
			m.queue.Add(ev.Name)
		}
	case ev.Has(fsnotify.Remove), ev.Has(fsnotify.Rename):
		m.queue.Add(ev.Name)
		if w.dirs[ev.Name] {
			// A whole directory of sockets went. Only then is every known
			// socket looked at, so removing N sockets costs O(N), not O(N²).
			w.forget(ev.Name)
			m.enqueueUnder(ev.Name)
		}
		delete(w.refused, ev.Name) // made again, it is said about again
	case ev.Has(fsnotify.Chmod):
		// A directory's mode or owner changed (chmod, chown): whether its
		// sockets are taken may have too.
		if _, refused := w.refused[ev.Name]; w.dirs[ev.Name] || refused {
			m.lookAgain(w, ev.Name)
		}
	}
}

// lookAgain decides again whether the sockets in dir, a directory below the
// registry directory whose mode or owner changed, are taken (watcher.take):
// one that users other than plugd's and root could change now has its
// plugins let go, and one fixed is watched and its sockets registered.
func (m *Manager) lookAgain(w *watcher, dir string) {
	watched := w.dirs[dir]
	switch take := w.take(dir); {
	case watched && !take:
		w.forget(dir)
		m.enqueueUnder(dir) // the workers find it refused too (parts.subdirsTrusted)
	case !watched && take:
		if err := w.watchTree(dir, func(path string, _ fileID) { m.queue.Add(path) }); err != nil {
			m.log.Warn("watching directory", "dir", dir, "err", err)
		}
	}
}

// known reports whether the manager has an entry for path.
func (m *Manager) known(path string) bool {
	m.reg.mu.Lock()
	defer m.reg.mu.Unlock()
	_, ok := m.reg.entries[path]
	return ok
}

// handleRootEvent deals with the registry directory itself going and coming
// back, as its parent directory's watch reports it. (The directory's own
// deletion event can come much later: a socket still bound in it keeps it
// alive in the kernel.)
func (m *Manager) handleRootEvent(w *watcher, ev fsnotify.Event) {
	root := m.opts.Dir
	if ev.Name != root {
		return // something else in the parent directory
	}
	fi, err := os.Lstat(root)
	there := err == nil && fi.IsDir()
	// Connections walk from the directory found at the path now, not the
	// one held (see socket).
	m.dir.Reopen()
	switch {
	case ev.Has(fsnotify.Remove), ev.Has(fsnotify.Rename):
		// Whatever is at the path now is not the directory we watched.
		w.forget(root)
		m.enqueueUnder(root)
		if !there {
			m.log.Warn("the registry directory was removed; its plugins are let go until it comes back", "dir", root)
			return
		}
		m.log.Info("the registry directory was replaced", "dir", root)
		m.resync(w)
	case ev.Has(fsnotify.Create) && there:
		m.log.Info("the registry directory is back", "dir", root)
		w.forget(root) // a watch left on the old one, if its removal was not seen yet
		m.resync(w)
	}
}

// forget drops the watch of dir and every directory below it, which were
// removed or moved away, or are refused now. A directory moved out of the
// tree would otherwise keep its inotify watch; for a removed one, the error
// is only that the kernel dropped the watch already. What was said about
// refused directories below it is forgotten too.
func (w *watcher) forget(dir string) {
	prefix := dir + string(filepath.Separator)
	for d := range w.dirs {
		if d == dir || strings.HasPrefix(d, prefix) {
			_ = w.fs.Remove(d)
			delete(w.dirs, d)
		}
	}
	for d := range w.refused {
		if d != dir && strings.HasPrefix(d, prefix) {
			delete(w.refused, d)
		}
	}
}
