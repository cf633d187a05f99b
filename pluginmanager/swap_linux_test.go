package pluginmanager_test

import (
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/plugd/plugd/internal/testenv"
	"github.com/plugd/plugd/pluginmanager"
)

// A redial after a hang-up reaches the socket from the registry directory
// following no symlink, in both modes: a directory on the way replaced by a
// symlink to a directory outside the registry directory is not followed,
// though the socket at its end is the very file registered (a link of it);
// the plugin is let go.
func TestRedialAfterHangupFollowsNoSymlink(t *testing.T) {
	for _, observe := range []bool{false, true} {
		t.Run(mode(observe), func(t *testing.T) {
			dir := testenv.ShortDir(t, "pm")
			sub := filepath.Join(dir, "sub")
			if err := os.Mkdir(sub, 0o750); err != nil {
				t.Fatal(err)
			}
			path := filepath.Join(sub, "p.sock")
			l := listenLast(t, path)
			serveTeller(t, l, &teller{typ: "CSIPlugin"})
			h := start(t, pluginmanager.Options{Dir: dir, Observe: observe, ProbeInterval: -1, ResyncInterval: -1},
				map[string]pluginmanager.Handler{"CSIPlugin": pluginmanager.HandlerFuncs{}})
			h.WaitSocket(path, answered(observe))
			before := l.accepted()

			// The socket is linked into a directory outside too, and a
			// symlink to that one exchanged with the directory, at once:
			// the path leads to the same socket file at every moment,
			// now through a symlink.
			moved := filepath.Join(testenv.ShortDir(t, "out"), "sub")
			if err := os.Mkdir(moved, 0o750); err != nil {
				t.Fatal(err)
			}
			if err := os.Link(path, filepath.Join(moved, "p.sock")); err != nil {
				t.Fatal(err)
			}
			link := filepath.Join(dir, ".link")
			if err := os.Symlink(moved, link); err != nil {
				t.Fatal(err)
			}
			if err := unix.Renameat2(unix.AT_FDCWD, link, unix.AT_FDCWD, sub, unix.RENAME_EXCHANGE); err != nil {
				t.Skipf("exchanging a directory and a symlink: %v", err)
			}
			l.drop() // hang up the connection plugd holds: it connects again
			h.WaitGone(path)
			h.Stop()
			if n := l.accepted() - before; n != 0 {
				t.Errorf("connected %d times through the symlink after the hang-up", n)
			}
		})
	}
}
