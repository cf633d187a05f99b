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
	warnings.Wait(t, "no longer safe from other users", wait) // the directory made again by uid 54321, mode 0777
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
