package pluginmanager_test

// An observer changes nothing, even on a read-only bind mount: Linux's.

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"syscall"
	"testing"
	"time"

	"github.com/plugd/plugd/internal/testenv"
	"github.com/plugd/plugd/plugin"
	"github.com/plugd/plugd/pluginmanager"
)

// snapshot records everything about a directory tree that a writer could
// change: names, types, modes, inodes, sizes and times.
func snapshot(t *testing.T, dir string) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		st := fi.Sys().(*syscall.Stat_t)
		out = append(out, path+" "+fi.Mode().String()+" "+time.Unix(st.Ctim.Unix()).String()+" "+fi.ModTime().String()+
			" ino="+itoa(st.Ino)+" size="+itoa(uint64(fi.Size())))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(out)
	return out
}

func itoa(v uint64) string { return time.Duration(v).String() } // any stable rendering will do

// An observer creates, removes and changes nothing in the directory: not a
// stale socket, not the directory itself if it is missing; and it works when
// it cannot write there at all.
func TestObserverChangesNothing(t *testing.T) {
	dir := testenv.ShortDir(t, "ro")
	live := testenv.StartPlugin(t, plugin.Config{Dir: dir, Type: "CSIPlugin", Name: "live"})
	testenv.DeadSocket(t, filepath.Join(dir, "stale.sock"))
	if err := os.Mkdir(filepath.Join(dir, "sub"), 0o750); err != nil {
		t.Fatal(err)
	}
	testenv.StartPlugin(t, plugin.Config{Dir: filepath.Join(dir, "sub"), Type: "DevicePlugin", Name: "nested"})
	// As read-only as this process can make it: a read-only bind mount where
	// the test may mount (it runs as root in CI), and no write permission.
	readOnlyMount(t, dir)
	if err := os.Chmod(dir, 0o555); err != nil && !errors.Is(err, syscall.EROFS) {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Chmod(dir, 0o700) })
	before := snapshot(t, dir)

	clk := fakeClock()
	obs := start(t, pluginmanager.Options{Dir: dir, Observe: true, ProbeInterval: lookEvery, RemoveStaleAfter: time.Nanosecond, Clock: clk}, nil)
	obs.WaitSocket(live.Path(), pluginmanager.StateAnswering)
	clk.Step(pastBindGrace) // a socket that just appeared may be bound, not yet listening
	obs.WaitSocket(filepath.Join(dir, "stale.sock"), pluginmanager.StateStale)
	nested := filepath.Join(dir, "sub", "nested.sock")
	obs.WaitSocket(nested, pluginmanager.StateAnswering)
	for range 2 {
		clk.Step(time.Hour) // long past RemoveStaleAfter, were it not ignored
		obs.lookAgain(clk, live.Path(), filepath.Join(dir, "stale.sock"), nested)
	}
	if after := snapshot(t, dir); !equalStrings(before, after) {
		t.Errorf("the observer changed the directory:\nbefore %q\nafter  %q", before, after)
	}

	missing := filepath.Join(testenv.ShortDir(t, "ro"), "not-there")
	m, err := pluginmanager.New(pluginmanager.Options{Dir: missing, Observe: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Run(context.Background()); err == nil {
		t.Error("an observer ran on a missing directory")
	}
	if _, err := os.Stat(missing); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the observer created the missing directory: %v", err)
	}
}

func equalStrings(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// readOnlyMount bind-mounts dir read-only onto itself, where this process may
// mount, and undoes it at the end of the test; elsewhere it logs that it could
// not, and the test relies on permissions and the snapshot.
func readOnlyMount(t *testing.T, dir string) {
	t.Helper()
	if err := syscall.Mount(dir, dir, "", syscall.MS_BIND, ""); err != nil {
		t.Logf("no read-only bind mount here (%v): checking with permissions and a snapshot only", err)
		return
	}
	if err := syscall.Mount("", dir, "", syscall.MS_BIND|syscall.MS_REMOUNT|syscall.MS_RDONLY, ""); err != nil {
		syscall.Unmount(dir, syscall.MNT_DETACH)
		t.Logf("no read-only remount here (%v): checking with permissions and a snapshot only", err)
		return
	}
	t.Cleanup(func() {
		if err := syscall.Unmount(dir, syscall.MNT_DETACH); err != nil {
			t.Errorf("unmounting %s: %v", dir, err)
		}
	})
	if err := os.WriteFile(filepath.Join(dir, "probe"), nil, 0o600); !errors.Is(err, syscall.EROFS) {
		t.Fatalf("the read-only mount accepts writes: %v", err)
	}
}
