//go:build unix

package pluginmanager_test

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/plugd/plugd/internal/testenv"
	"github.com/plugd/plugd/plugin"
	"github.com/plugd/plugd/pluginmanager"
	"github.com/plugd/plugd/plugintest"
)

// runOnce runs a manager on opts until it has started (or failed), and
// returns what Run returned.
func runOnce(t *testing.T, opts pluginmanager.Options) error {
	t.Helper()
	m, err := pluginmanager.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // Run starts, if it may, and stops at once
	return m.Run(ctx)
}

// A registry directory of mode 0750 inside a parent anyone may write to,
// without the sticky bit, could be renamed away and replaced by anyone:
// refused, naming the parent and the fix, unless allowed. A sticky parent
// (as /tmp) is fine.
func TestRegistryDirInWritableParentIsRefused(t *testing.T) {
	parent := testenv.ShortDir(t, "wp")
	dir := filepath.Join(parent, "plugins")
	if err := os.Mkdir(dir, 0o750); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(parent, 0o777); err != nil {
		t.Fatal(err)
	}
	err := runOnce(t, pluginmanager.Options{Dir: dir})
	if err == nil {
		t.Fatal("Run accepted a registry directory in a 0777 parent without the sticky bit")
	}
	for _, want := range []string{dir, parent, "no sticky bit", "rename", "chmod go-w " + parent, "AllowWritableDir"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("Run = %q, want it to say %q", err, want)
		}
	}
	if err := runOnce(t, pluginmanager.Options{Dir: dir, AllowWritableDir: true}); err != nil {
		t.Errorf("AllowWritableDir: Run = %v", err)
	}
	if err := os.Chmod(parent, 0o777|os.ModeSticky); err != nil {
		t.Fatal(err)
	}
	if err := runOnce(t, pluginmanager.Options{Dir: dir}); err != nil {
		t.Errorf("Run with a sticky parent (mode 1777) = %v", err)
	}
}

// A registry directory of another user's is refused: its owner could make it
// writable, or replace the sockets in it. Making one takes root (chown);
// without it, internal/dirtrust's TestOtherOwner checks the rule with
// another uid.
func TestRegistryDirOfAnotherUserIsRefused(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("making a directory another user's takes root; internal/dirtrust tests the rule with another uid")
	}
	dir := testenv.ShortDir(t, "ou")
	if err := os.Chown(dir, 54321, 54321); err != nil {
		t.Fatal(err)
	}
	err := runOnce(t, pluginmanager.Options{Dir: dir})
	if err == nil {
		t.Fatal("Run accepted a registry directory of uid 54321's")
	}
	for _, want := range []string{dir, "belongs to uid 54321", "chown", "AllowWritableDir"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("Run = %q, want it to say %q", err, want)
		}
	}
	if err := runOnce(t, pluginmanager.Options{Dir: dir, AllowWritableDir: true}); err != nil {
		t.Errorf("AllowWritableDir: Run = %v", err)
	}
}

// An observer is warned of a directory others could change, not refused:
// the directory is the other manager's, which uses it as it is.
func TestObserverWarnsOfUntrustedDir(t *testing.T) {
	dir := testenv.ShortDir(t, "ow")
	if err := os.Chmod(dir, 0o770); err != nil {
		t.Fatal(err)
	}
	var log testenv.Buffer
	logger := slog.New(slog.NewTextHandler(&log, nil))
	if err := runOnce(t, pluginmanager.Options{Dir: dir, Observe: true, Logger: logger}); err != nil {
		t.Fatalf("observing: Run = %v", err)
	}
	if out := log.String(); !strings.Contains(out, "level=WARN") || !strings.Contains(out, "not safe from other users") || !strings.Contains(out, "chmod go-w "+dir) {
		t.Errorf("observing a group-writable directory, the log is %q; want a warning that says why and what to do", out)
	}
	var quiet testenv.Buffer
	logger = slog.New(slog.NewTextHandler(&quiet, nil))
	if err := runOnce(t, pluginmanager.Options{Dir: dir, Observe: true, AllowWritableDir: true, Logger: logger}); err != nil {
		t.Fatalf("observing: Run = %v", err)
	}
	if out := quiet.String(); strings.Contains(out, "not safe from other users") {
		t.Errorf("AllowWritableDir: the log still warns: %q", out)
	}
}

// A registry directory removed and made again, under a sticky parent (as
// /tmp) anyone may make it in, is checked again: made by another user, with
// a plugin of theirs in it, nothing in it is registered, and it is said;
// once it is safe again, its sockets are. Making it another user's takes
// root (chown).
func TestRegistryDirMadeAgainIsCheckedAgain(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("making a directory another user's takes root")
	}
	parent := testenv.ShortDir(t, "ma")
	if err := os.Chmod(parent, 0o777|os.ModeSticky); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(parent, "plugins")
	if err := os.Mkdir(dir, 0o750); err != nil {
		t.Fatal(err)
	}
	log, warnings := testenv.WarnLogger()
	// Every registration of the planted plugin says whether the directory
	// had been made safe by then: checked at the end, since one made while
	// it was unsafe could land after the checks below.
	var madeSafe atomic.Bool
	var unsafeRegistrations atomic.Int32
	h := start(t, pluginmanager.Options{Dir: dir, Logger: log, ResyncInterval: time.Second},
		map[string]pluginmanager.Handler{"CSIPlugin": pluginmanager.HandlerFuncs{
			RegisterFunc: func(_ context.Context, p pluginmanager.Plugin) error {
				if p.Name == "planted.example.com" && !madeSafe.Load() {
					unsafeRegistrations.Add(1)
				}
				return nil
			},
		}})
	first := testenv.StartPlugin(t, plugin.Config{Dir: dir, Type: "CSIPlugin", Name: "first.example.com"})
	h.WaitSocket(first.Path(), pluginmanager.StateRegistered)
	first.Close()
	h.WaitGone(first.Path())
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}

	// Another user's directory, anyone may write to, with a plugin in it,
	// made beside and moved into place at once.
	staging := filepath.Join(parent, "staging")
	if err := os.Mkdir(staging, 0o700); err != nil {
		t.Fatal(err)
	}
	planted := testenv.StartPlugin(t, plugin.Config{Dir: staging, Type: "CSIPlugin", Name: "planted.example.com"})
	if err := os.Chmod(staging, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(staging, 54321, 54321); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(staging, dir); err != nil {
		t.Fatal(err)
	}
	plantedPath := filepath.Join(dir, filepath.Base(planted.Path()))
	warnings.Wait(t, "no longer safe from other users", testenv.Timeout) // the directory made again by uid 54321, mode 0777
	for _, s := range h.m.Plugins() {
		if s.Socket == plantedPath && s.State == pluginmanager.StateRegistered {
			t.Errorf("the plugin in the unsafe directory is registered: %+v", s)
		}
	}
	if n := planted.Notifications(); n != 0 {
		t.Errorf("the plugin in the unsafe directory was told %d times", n)
	}

	// Made safe: found at the next resync, and registered.
	madeSafe.Store(true)
	if err := os.Chown(dir, 0, 0); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o750); err != nil {
		t.Fatal(err)
	}
	h.WaitSocket(plantedPath, pluginmanager.StateRegistered)
	if n := unsafeRegistrations.Load(); n != 0 {
		t.Errorf("the plugin was registered %d times while its directory was unsafe", n)
	}
	if n := planted.Notifications(); n != 1 {
		t.Errorf("the plugin was told %d times, want once, once its directory was safe", n)
	}
}

// mkdirOpen makes dir, a directory anyone may write to (mode 0777, whatever
// the umask).
func mkdirOpen(t *testing.T, dir string) {
	t.Helper()
	if err := os.Mkdir(dir, 0o750); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o777); err != nil {
		t.Fatal(err)
	}
}

// A directory below the registry directory is held to the registry
// directory's rule: one that anyone may write to could have a plugin
// planted in it, so its sockets are not registered, and the warning names
// it and the fix. Made safe (a chmod), its plugin registers at once; made
// unsafe again, the plugin is let go.
func TestUnsafeSubdirectoryIsLeftOut(t *testing.T) {
	dir := testenv.ShortDir(t, "su")
	open, safe := filepath.Join(dir, "open"), filepath.Join(dir, "safe")
	mkdirOpen(t, open)
	if err := os.Mkdir(safe, 0o750); err != nil {
		t.Fatal(err)
	}
	planted := testenv.StartPlugin(t, plugin.Config{Dir: open, Type: "CSIPlugin", Name: "planted.example.com"})
	good := testenv.StartPlugin(t, plugin.Config{Dir: safe, Type: "CSIPlugin", Name: "good.example.com"})

	log, warnings := testenv.WarnLogger()
	rec := plugintest.NewRecorder()
	h := start(t, pluginmanager.Options{Dir: dir, Logger: log, ResyncInterval: -1}, map[string]pluginmanager.Handler{"CSIPlugin": rec})
	<-h.m.Synced() // the first walk is done: a socket it took would be known now
	for _, s := range h.m.Plugins() {
		if s.Socket == planted.Path() {
			t.Errorf("the socket in the directory anyone may write to is taken: %+v", s)
		}
	}
	warnings.Wait(t, "not registering the plugins in a directory", testenv.Timeout)
	for _, want := range []string{"dir=" + open, "chmod go-w " + open, "AllowWritableDir"} {
		if !strings.Contains(warnings.String(), want) {
			t.Errorf("warnings = %q, want them to say %q", warnings, want)
		}
	}
	h.WaitSocket(good.Path(), pluginmanager.StateRegistered)
	if n := planted.Notifications(); n != 0 {
		t.Errorf("the plugin in the unsafe directory was told %d times", n)
	}

	// Fixed: the chmod is seen at once (its event: there is no resync).
	if err := os.Chmod(open, 0o750); err != nil {
		t.Fatal(err)
	}
	h.WaitSocket(planted.Path(), pluginmanager.StateRegistered)

	// Made unsafe again: let go, and said so again.
	if err := os.Chmod(open, 0o775); err != nil {
		t.Fatal(err)
	}
	h.WaitGone(planted.Path())
	rec.WaitCalls(t, "deregister", "planted.example.com", 1)
	if n := strings.Count(warnings.String(), "not registering the plugins in a directory"); n != 2 {
		t.Errorf("the unsafe directory was warned about %d times, want twice (once each time it was unsafe): %s", n, warnings)
	}
	h.WaitSocket(good.Path(), pluginmanager.StateRegistered) // still
}

// Options.AllowWritableDir accepts unsafe directories below the registry
// directory too.
func TestAllowWritableDirTakesUnsafeSubdirectories(t *testing.T) {
	dir := testenv.ShortDir(t, "sa")
	open := filepath.Join(dir, "open")
	mkdirOpen(t, open)
	p := testenv.StartPlugin(t, plugin.Config{Dir: open, Type: "CSIPlugin", Name: "allowed.example.com"})
	h := start(t, pluginmanager.Options{Dir: dir, AllowWritableDir: true}, map[string]pluginmanager.Handler{"CSIPlugin": plugintest.NewRecorder()})
	h.WaitSocket(p.Path(), pluginmanager.StateRegistered)
}

// An observer takes the sockets in an unsafe directory below the registry
// directory, as the manager it watches does, and warns about it.
func TestObserverWarnsOfUnsafeSubdirectory(t *testing.T) {
	dir := testenv.ShortDir(t, "so")
	open := filepath.Join(dir, "open")
	mkdirOpen(t, open)
	p := testenv.StartPlugin(t, plugin.Config{Dir: open, Type: "CSIPlugin", Name: "seen.example.com"})
	log, warnings := testenv.WarnLogger()
	h := start(t, pluginmanager.Options{Dir: dir, Observe: true, Logger: log}, nil)
	h.WaitSocket(p.Path(), pluginmanager.StateAnswering)
	warnings.Wait(t, "for the manager observed as for plugd", testenv.Timeout)
	if !strings.Contains(warnings.String(), "dir="+open) {
		t.Errorf("warnings = %q, want them to name %s", warnings, open)
	}
	if n := p.Notifications(); n != 0 {
		t.Errorf("the observer told the plugin %d times", n)
	}
	// Removed and made again as unsafe: said again.
	if err := os.RemoveAll(open); err != nil {
		t.Fatal(err)
	}
	h.WaitGone(p.Path())
	mkdirOpen(t, open)
	warnings.WaitN(t, "for the manager observed as for plugd", 2, testenv.Timeout)
}

// Issue 33, item 10: the registry directory made unsafe while the manager
// runs, with no resync to notice it, registers nothing planted meanwhile.
// A chmod of the directory itself is seen at once (its event): its plugins
// are let go, and a socket made just after the chmod is not registered
// nor told. A parent made writable (no watch sees that) is caught by the
// check before each registration attempt, which records why the socket was
// not registered. Made safe again, the sockets register.
func TestRegistryDirMadeUnsafeAtRunTime(t *testing.T) {
	for _, tc := range []struct {
		name   string
		unsafe func(dir string) error
		safe   func(dir string) error
	}{
		{"chmod of the directory", func(dir string) error { return os.Chmod(dir, 0o777) }, func(dir string) error { return os.Chmod(dir, 0o750) }},
		{"chmod of its parent", func(dir string) error { return os.Chmod(filepath.Dir(dir), 0o777) }, func(dir string) error { return os.Chmod(filepath.Dir(dir), 0o750) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := filepath.Join(testenv.ShortDir(t, "mu"), "p")
			if err := os.Mkdir(dir, 0o750); err != nil {
				t.Fatal(err)
			}
			log, warnings := testenv.WarnLogger()
			var madeSafe atomic.Bool
			var unsafeRegistrations atomic.Int32
			h := start(t, pluginmanager.Options{Dir: dir, Logger: log, ResyncInterval: -1},
				map[string]pluginmanager.Handler{"CSIPlugin": pluginmanager.HandlerFuncs{
					RegisterFunc: func(_ context.Context, p pluginmanager.Plugin) error {
						if p.Name == "planted.example.com" && !madeSafe.Load() {
							unsafeRegistrations.Add(1)
						}
						return nil
					},
				}})
			first := testenv.StartPlugin(t, plugin.Config{Dir: dir, Type: "CSIPlugin", Name: "first.example.com"})
			h.WaitSocket(first.Path(), pluginmanager.StateRegistered)

			if err := tc.unsafe(dir); err != nil {
				t.Fatal(err)
			}
			planted := testenv.StartPlugin(t, plugin.Config{Dir: dir, Type: "CSIPlugin", Name: "planted.example.com"})
			if tc.name == "chmod of its parent" {
				// No event said so: the attempt finds it, and says why.
				ev := h.WaitEvent(planted.Path(), pluginmanager.EventFailed)
				if ev.Reason != pluginmanager.ReasonPolicy || !strings.Contains(ev.Error, "not registering: the registry directory") {
					t.Errorf("the attempt in the unsafe directory: %+v; want it Failed, reason policy, saying why", ev)
				}
			}
			warnings.Wait(t, "no longer safe from other users", testenv.Timeout)
			h.WaitGone(first.Path())
			h.WaitGone(planted.Path())
			if n := planted.Notifications(); n != 0 {
				t.Errorf("the plugin planted in the unsafe directory was told %d times", n)
			}

			madeSafe.Store(true)
			if err := tc.safe(dir); err != nil {
				t.Fatal(err)
			}
			// A parent's chmod makes no event in the directory, and there is no
			// resync: a chmod of the directory itself, to the mode it has, has
			// the manager look again.
			if err := os.Chmod(dir, 0o750); err != nil {
				t.Fatal(err)
			}
			h.WaitSocket(planted.Path(), pluginmanager.StateRegistered)
			h.WaitSocket(first.Path(), pluginmanager.StateRegistered)
			if n := unsafeRegistrations.Load(); n != 0 {
				t.Errorf("the planted plugin was registered %d times while its directory was unsafe", n)
			}
		})
	}
}

// Issue 33, info: the registry directory replaced by a symlink while the
// manager runs (moved away, a symlink to it put at its path) is followed
// at once, as one found at start is, with resync off: its plugin stays
// registered, and a plugin started in it afterwards registers (its new
// directory is watched). It was let go, and nothing in it seen, until a
// resync.
func TestRegistryDirSwappedForASymlink(t *testing.T) {
	dir := filepath.Join(testenv.ShortDir(t, "sl"), "p")
	if err := os.Mkdir(dir, 0o750); err != nil {
		t.Fatal(err)
	}
	var logs testenv.Buffer
	h := start(t, pluginmanager.Options{Dir: dir, Logger: slog.New(slog.NewTextHandler(&logs, nil)), ResyncInterval: -1},
		map[string]pluginmanager.Handler{"CSIPlugin": plugintest.NewRecorder()})
	p := testenv.StartPlugin(t, plugin.Config{Dir: dir, Type: "CSIPlugin", Name: "moved.example.com"})
	h.WaitSocket(p.Path(), pluginmanager.StateRegistered)
	if err := os.Rename(dir, dir+".real"); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(dir+".real", dir); err != nil {
		t.Fatal(err)
	}
	logs.Wait(t, "the registry directory is a symlink now; following it", testenv.Timeout)
	later := testenv.StartPlugin(t, plugin.Config{Dir: dir + ".real", Type: "CSIPlugin", Name: "later.example.com"})
	h.WaitSocket(filepath.Join(dir, filepath.Base(later.Path())), pluginmanager.StateRegistered)
	h.WaitSocket(p.Path(), pluginmanager.StateRegistered)
}
