package pluginmanager

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/plugd/plugd/internal/dirtrust"
)

// Who may change the registry directory, and the directories below it:
// plugd registers what is in them, as root, so users other than plugd's and
// root must not be able to plant or replace a plugin there. Run checks the
// registry directory (checkDirTrust); the watcher checks it again at every
// resync and at a change of its own mode or owner (watcher.trusted), the
// registrar before each registration attempt (registrar.dirVerdict), and
// each directory below it as it watches it
// (watcher.take); the registrar checks a socket's directories at each look
// (subdirsTrusted).

// checkDirTrust refuses a registry directory that users other than plugd's
// and root could change (dirtrust.Check says how), unless
// Options.AllowWritableDir accepts that. An observer only warns: the
// directory is the other manager's, which uses it as it is; refusing would
// only blind the observer, and what it reports is what that manager sees.
func (m *Manager) checkDirTrust(dir string) error {
	if m.opts.AllowWritableDir {
		return nil
	}
	err, untrusted := checkDir(dir)
	switch {
	case err == nil:
		return nil
	case !untrusted:
		return fmt.Errorf("pluginmanager: checking who may change the registry directory: %w", err)
	case m.opts.Observe:
		m.log.Warn("the registry directory is not safe from other users: they could plant a plugin there, or replace one, for the manager observed as for plugd; fix it, or set Options.AllowWritableDir to accept it",
			"dir", dir, "err", err)
		return nil
	}
	return fmt.Errorf("pluginmanager: the registry directory %w; or, to accept that, set Options.AllowWritableDir (plugd: policy.allowWritableRegistryDir)", err)
}

// checkDir checks who may change dir (dirtrust.Check, for this process's
// user), and reports whether an error says it is unsafe rather than that it
// could not be checked.
func checkDir(dir string) (err error, untrusted bool) {
	err = dirtrust.Check(dir, os.Geteuid())
	var u *dirtrust.Untrusted
	return err, errors.As(err, &u)
}

// trusted checks the registry directory again, as at Run: removed and made
// again, under a sticky parent such as /tmp, it may be another user's now,
// and what they put in it is not to be registered. While it is not safe,
// its plugins are let go (the registrar takes its sockets as absent) and
// nothing in it is looked at; the next resync after it is fixed finds its
// sockets again. Said once per change. An observer only warns, at Run.
func (w *watcher) trusted() bool {
	if w.observe || !w.trust {
		return true
	}
	err, bad := checkDir(w.top) // another error (the directory gone) is the walk's to report
	switch was := w.untrusted.Swap(bad); {
	case bad && !was:
		w.log.Error("the registry directory is no longer safe from other users: letting its plugins go, and registering nothing in it until it is fixed",
			"dir", w.top, "err", err)
	case !bad && was:
		w.log.Info("the registry directory is safe again; looking at its sockets", "dir", w.top)
	}
	return !bad
}

// take reports whether the sockets in dir, a directory below the registry
// directory, are to be registered: not if users other than plugd's and root
// could change it (dirtrust.CheckBelow), for whoever could plant a plugin
// in the registry directory itself. The registrar holds sockets to the same
// rule (subdirsTrusted); an observer takes them, and warns.
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

// subdirsTrusted reports whether the directories between the registry
// directory top and the socket at path are safe from other users as the
// registry directory must be (dirtrust.CheckBelow): a socket in one that is
// not is taken as absent, as the watch leaves it out, and says so
// (watcher.take). Nothing is looked at for a socket in the registry
// directory itself, nor with Options.AllowWritableDir (allowWritable). The
// directories cannot be changed under the check by anyone it protects
// against: each is reached from a safe one, and is safe.
func subdirsTrusted(top, path string, allowWritable bool) bool {
	if allowWritable {
		return true
	}
	rel, err := relTo(top, path)
	if err != nil {
		return false
	}
	dir, uid := top, os.Geteuid()
	for {
		name, rest, more := strings.Cut(rel, string(filepath.Separator))
		if !more {
			return true
		}
		dir, rel = filepath.Join(dir, name), rest
		if dirtrust.CheckBelow(dir, uid) != nil {
			return false
		}
	}
}

// dirVerdict checks the registry directory before a registration attempt:
// made unsafe since the watcher last looked (a chmod of a directory above
// it, which no watch sees, or one whose event is not handled yet), nothing
// in it is registered. The attempt fails, not for good, saying why, and
// the watcher is asked to look (watcher.trusted), which lets the
// directory's plugins go until it is fixed. One lstat per directory up to
// /, at an attempt, not at a probe.
func (r *registrar) dirVerdict() stepOutcome {
	if r.opts.Observe || r.opts.AllowWritableDir {
		return stepOutcome{}
	}
	err, bad := checkDir(r.opts.Dir)
	if !bad {
		return stepOutcome{}
	}
	r.reg.rescan()
	return stepOutcome{failed: true, reason: ReasonPolicy, err: fmt.Errorf("not registering: the registry directory %w", err)}
}
