package pluginmanager

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/fsnotify/fsnotify"
	"k8s.io/utils/clock"

	"github.com/plugd/plugd/internal/confine"
	"github.com/plugd/plugd/pluginmanager/internal/queue"
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

// watcher is the job that reacts to the filesystem: an fsnotify watch on
// every directory of the tree, a walk of it at start, every
// Options.ResyncInterval and whenever asked (a place freed under
// Options.MaxSockets, a lost event), and the registry directory itself
// going and coming back. It only queues paths: events are hints, and the
// worker that takes a path reads the file there and decides. It belongs to
// the goroutine running run.
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

	clock       clock.WithTicker
	queue       *queue.Queue
	reg         *registry
	root        *confine.Root   // the registry directory the client's connections walk from
	untrusted   *atomic.Bool    // set while the registry directory is not safe (trusted)
	resyncEvery time.Duration   // Options.ResyncInterval
	rescan      <-chan struct{} // asks for a walk of the directory
	mounts      <-chan struct{} // the mounts on the way to the directory or below it changed (watchMounts)
	synced      chan<- struct{} // closed after the first walk
}

func (m *Manager) newWatcher(fs *fsnotify.Watcher) *watcher {
	return &watcher{fs: fs, dirs: make(map[string]bool),
		top: m.opts.Dir, trust: !m.opts.AllowWritableDir, observe: m.opts.Observe,
		refused: make(map[string]string), log: m.log,
		clock: m.clock, queue: m.queue, reg: m.reg, root: m.client.dir, untrusted: &m.dirUntrusted,
		resyncEvery: m.opts.ResyncInterval, rescan: m.rescan, mounts: m.mounts, synced: m.synced}
}

// run turns filesystem events, watch errors and the resync timer into
// work, until ctx is done or the watch is closed.
func (w *watcher) run(ctx context.Context) {
	w.resync()
	close(w.synced)
	var tick <-chan time.Time
	if w.resyncEvery > 0 {
		t := w.clock.NewTicker(w.resyncEvery)
		defer t.Stop()
		tick = t.C()
	}
	for {
		select {
		case <-ctx.Done():
			return
		case ev, ok := <-w.fs.Events:
			if !ok {
				return
			}
			w.handleFSEvent(ev)
		case err, ok := <-w.fs.Errors:
			if !ok {
				return
			}
			if errors.Is(err, fsnotify.ErrEventOverflow) {
				w.log.Warn("filesystem events were lost; rescanning the registry directory", "err", err)
			} else {
				w.log.Error("filesystem watch error; rescanning the registry directory", "err", err)
			}
			w.resync()
		case <-tick:
			w.resync()
		case <-w.rescan:
			w.resync()
		case <-w.mounts:
			w.remounted()
		}
	}
}

// resync walks the directory and queues every socket that is new, replaced or
// gone compared with what the manager knows. It is the safety net under the
// watch, so it costs one walk and no RPC.
func (w *watcher) resync() {
	if !w.trusted() {
		w.reg.lock()
		for path := range w.reg.entries {
			w.queue.Add(path) // let go: see registrar.reconcile
		}
		w.reg.unlock()
		return
	}
	found := make(map[string]fileID)
	if err := w.watchTree(w.top, func(path string, id fileID) { found[path] = id }); err != nil {
		w.log.Warn("scanning the registry directory", "dir", w.top, "err", err)
	}
	now := w.clock.Now()
	w.reg.lock()
	defer w.reg.unlock()
	w.reg.tickLocked(now)
	for path, id := range found {
		e, ok := w.reg.entries[path]
		if !ok {
			// Known from now on (Synced promises it); the worker registers it.
			w.reg.discoverLocked(path, id, nil, now)
		}
		if !ok || e.id != id {
			w.queue.Add(path)
		}
	}
	for path := range w.reg.entries {
		if _, ok := found[path]; !ok {
			w.queue.Add(path)
		}
	}
}

// remounted looks at the whole tree again once the mounts on the way to the
// registry directory or below it changed (watchMounts), as a mount over a
// directory makes no watch event: the watches are made again on the
// directories at the paths now (the old ones may lie hidden under a
// mount), connections walk from the registry directory at the path now,
// and the walk finds what a mount hid or showed.
func (w *watcher) remounted() {
	w.log.Info("the mounts on the way to the registry directory or below it changed; looking at it again", "dir", w.top)
	w.forget(w.top)
	w.root.Reopen()
	w.resync()
}

// queueUnder queues every known socket below dir, which was removed or
// renamed, or is refused now.
func (w *watcher) queueUnder(dir string) {
	prefix := dir + string(filepath.Separator)
	w.reg.lock()
	defer w.reg.unlock()
	for path := range w.reg.entries {
		if strings.HasPrefix(path, prefix) {
			w.queue.Add(path)
		}
	}
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
func (w *watcher) handleFSEvent(ev fsnotify.Event) {
	root := w.top
	if ev.Name == root || !confine.Within(ev.Name, root) {
		w.handleRootEvent(ev)
		return
	}
	name := filepath.Base(ev.Name)
	if hidden(name) {
		return
	}
	if unprintable(name) {
		if ev.Has(fsnotify.Create) {
			w.log.Warn("ignoring a file whose name has control characters or is not UTF-8; rename it to register it",
				"dir", filepath.Dir(ev.Name), "name", strconv.Quote(name))
		}
		return
	}
	switch {
	case ev.Has(fsnotify.Create):
		fi, err := os.Lstat(ev.Name)
		if err != nil {
			w.queue.Add(ev.Name) // gone already; the worker forgets it if we knew it
			return
		}
		if fi.IsDir() {
			// Sockets may have appeared in it before the watch was in place.
			if err := w.watchTree(ev.Name, func(path string, _ fileID) { w.queue.Add(path) }); err != nil {
				w.log.Warn("watching new directory", "dir", ev.Name, "err", err)
			}
			return
		}
		if maybeSocket(fi.Mode()) || w.known(ev.Name) {
			// A file, FIFO or symlink renamed over a known socket is a
			// Create of its path too: the worker finds no socket there,
			// and lets the plugin go now, not at its next probe.
			w.queue.Add(ev.Name)
		}
	case ev.Has(fsnotify.Remove), ev.Has(fsnotify.Rename):
		w.queue.Add(ev.Name)
		if w.dirs[ev.Name] {
			// A whole directory of sockets went. Only then is every known
			// socket looked at, so removing N sockets costs O(N), not O(N²).
			w.forget(ev.Name)
			w.queueUnder(ev.Name)
		}
		delete(w.refused, ev.Name) // made again, it is said about again
	case ev.Has(fsnotify.Chmod):
		// A directory's mode or owner changed (chmod, chown): whether its
		// sockets are taken may have too.
		if _, refused := w.refused[ev.Name]; w.dirs[ev.Name] || refused {
			w.lookAgain(ev.Name)
		}
	}
}

// lookAgain decides again whether the sockets in dir, a directory below the
// registry directory whose mode or owner changed, are taken (watcher.take):
// one that users other than plugd's and root could change now has its
// plugins let go, and one fixed is watched and its sockets registered.
func (w *watcher) lookAgain(dir string) {
	watched := w.dirs[dir]
	switch take := w.take(dir); {
	case watched && !take:
		w.forget(dir)
		w.queueUnder(dir) // the workers find it refused too (subdirsTrusted)
	case !watched && take:
		if err := w.watchTree(dir, func(path string, _ fileID) { w.queue.Add(path) }); err != nil {
			w.log.Warn("watching directory", "dir", dir, "err", err)
		}
	}
}

// known reports whether the manager has an entry for path.
func (w *watcher) known(path string) bool {
	w.reg.lock()
	defer w.reg.unlock()
	_, ok := w.reg.entries[path]
	return ok
}

// handleRootEvent deals with the registry directory itself going and coming
// back, as its parent directory's watch reports it. (The directory's own
// deletion event can come much later: a socket still bound in it keeps it
// alive in the kernel.)
func (w *watcher) handleRootEvent(ev fsnotify.Event) {
	root := w.top
	if ev.Name != root {
		return // something else in the parent directory
	}
	fi, err := os.Lstat(root)
	there := err == nil && fi.IsDir()
	if err == nil && fi.Mode()&fs.ModeSymlink != 0 {
		// A symlink put in its place is followed, as one found at start
		// is: the resync below checks who may change every directory and
		// symlink on the way (watcher.trusted), and watches and walks the
		// directory it leads to.
		if st, err := os.Stat(root); err == nil && st.IsDir() {
			target, _ := os.Readlink(root)
			w.log.Info("the registry directory is a symlink now; following it, as at start", "dir", root, "symlinkTo", printable(target))
			there = true
		}
	}
	// Connections walk from the directory found at the path now, not the
	// one held (see socket).
	w.root.Reopen()
	switch {
	case ev.Has(fsnotify.Remove), ev.Has(fsnotify.Rename):
		// Whatever is at the path now is not the directory we watched.
		w.forget(root)
		w.queueUnder(root)
		if !there {
			w.log.Warn("the registry directory was removed; its plugins are let go until it comes back", "dir", root)
			return
		}
		w.log.Info("the registry directory was replaced", "dir", root)
		w.resync()
	case ev.Has(fsnotify.Create) && there:
		w.log.Info("the registry directory is back", "dir", root)
		w.forget(root) // a watch left on the old one, if its removal was not seen yet
		w.resync()
	case ev.Has(fsnotify.Chmod) && there:
		// Its own mode or owner changed (chmod, chown): made unsafe, its
		// plugins are let go before a socket made after the change is
		// looked at (its Create comes after this event); made safe, its
		// sockets are found again. Not left to the next resync, which may
		// never come.
		w.resync()
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
