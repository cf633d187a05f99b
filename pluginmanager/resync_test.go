package pluginmanager

import (
	"net"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/fsnotify/fsnotify"
)

// TestResyncFindsWhatEventsMissed checks the safety net on its own: with no
// watch events at all, a resync queues exactly the sockets that are new,
// replaced or gone, and nothing that is unchanged.
func TestResyncFindsWhatEventsMissed(t *testing.T) {
	dir, err := os.MkdirTemp("", "rs")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	m, err := New(Options{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	fw, err := fsnotify.NewWatcher()
	if err != nil {
		t.Fatal(err)
	}
	defer fw.Close()
	w := m.newWatcher(fw)

	socket := func(name string) (string, fileID) {
		t.Helper()
		path := filepath.Join(dir, name)
		l, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
		if err != nil {
			t.Fatal(err)
		}
		l.SetUnlinkOnClose(false)
		l.Close()
		id, ok := statSocket(path)
		if !ok {
			t.Fatalf("%s is not a socket", path)
		}
		return path, id
	}
	unchanged, id := socket("unchanged.sock")
	m.reg.entries[unchanged] = &entry{id: id}
	replaced, id := socket("replaced.sock")
	m.reg.entries[replaced] = &entry{id: id}
	os.Remove(replaced)
	socket("replaced.sock")
	gone := filepath.Join(dir, "gone.sock")
	m.reg.entries[gone] = &entry{}
	if err := os.Mkdir(filepath.Join(dir, "sub"), 0o750); err != nil {
		t.Fatal(err)
	}
	added, _ := socket("sub/new.sock")

	w.resync()

	var got []string
	for range m.queue.Len() {
		path, _ := m.queue.Get()
		got = append(got, path)
	}
	slices.Sort(got)
	want := []string{gone, replaced, added}
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("queued %q, want %q", got, want)
	}
	if !slices.Contains(fw.WatchList(), filepath.Join(dir, "sub")) || !w.dirs[filepath.Join(dir, "sub")] {
		t.Errorf("watches = %q, want the subdirectory watched", fw.WatchList())
	}
}
