package pluginmanager_test

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/plugd/plugd/internal/testenv"
	"github.com/plugd/plugd/plugin"
	"github.com/plugd/plugd/pluginmanager"
)

// A directory of sockets mounted over (mount --bind) hides them, and its
// umount shows them again; neither makes an inotify event (issue 25, item
// 8). The manager watches the mount table: a hidden plugin is let go, and
// found again after the umount, without waiting for the resync (an hour
// here).
func TestBindMountOverSockets(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mounting needs root")
	}
	dir := testenv.ShortDir(t, "pm")
	sub, empty := filepath.Join(dir, "csi"), testenv.ShortDir(t, "empty")
	if err := os.Mkdir(sub, 0o750); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(empty, 0o750); err != nil {
		t.Fatal(err)
	}
	h := start(t, pluginmanager.Options{Dir: dir, ResyncInterval: time.Hour}, map[string]pluginmanager.Handler{"CSIPlugin": pluginmanager.HandlerFuncs{}})
	p := testenv.StartPlugin(t, plugin.Config{Dir: sub, Type: "CSIPlugin", Name: "hidden", Versions: []string{"1.0.0"}})
	h.WaitSocket(p.Path(), pluginmanager.StateRegistered)

	if err := unix.Mount(empty, sub, "", unix.MS_BIND, ""); err != nil {
		if errors.Is(err, unix.EPERM) {
			t.Skipf("mount --bind: %v (a container without CAP_SYS_ADMIN)", err)
		}
		t.Fatal(err)
	}
	mounted := true
	umount := func() {
		if mounted {
			mounted = false
			if err := unix.Unmount(sub, 0); err != nil {
				t.Fatal(err)
			}
		}
	}
	t.Cleanup(umount)
	h.WaitEvent(p.Path(), pluginmanager.EventDeregistered)
	h.WaitGone(p.Path())

	umount()
	h.WaitSocket(p.Path(), pluginmanager.StateRegistered)
}
