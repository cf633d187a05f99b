package confine

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/plugd/plugd/internal/testenv"
)

// A component swapped for a symlink after the path was checked is refused
// on the way, not followed; so is a file that is not a socket, or not the
// socket expected.
func TestSocketRefusesWhatChanged(t *testing.T) {
	dir := testenv.ShortDir(t, "ep")
	root, outside := filepath.Join(dir, "root"), filepath.Join(dir, "outside")
	for _, d := range []string{root, outside} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	ctx := context.Background()
	evil := testenv.CountAccepts(t, filepath.Join(outside, "evil.sock"))
	// What was checked was root/sub/evil.sock, with sub a directory; sub
	// is now a symlink to outside.
	if err := os.Symlink(outside, filepath.Join(root, "sub")); err != nil {
		t.Fatal(err)
	}
	if _, err := Socket(ctx, root, filepath.Join("sub", "evil.sock"), Identity{}); !errors.Is(err, ErrChanged) {
		t.Errorf("through a swapped directory: %v, want ErrChanged", err)
	}
	// And the socket itself swapped for a symlink.
	if err := os.Symlink(filepath.Join(outside, "evil.sock"), filepath.Join(root, "evil.sock")); err != nil {
		t.Fatal(err)
	}
	if _, err := Socket(ctx, root, "evil.sock", Identity{}); !errors.Is(err, ErrChanged) {
		t.Errorf("through a swapped socket: %v, want ErrChanged", err)
	}
	if n := evil.Count(); n != 0 {
		t.Errorf("the socket outside the root was connected to %d times", n)
	}
	// A regular file is not a socket.
	if err := os.WriteFile(filepath.Join(root, "file.sock"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Socket(ctx, root, "file.sock", Identity{}); !errors.Is(err, ErrChanged) {
		t.Errorf("a regular file: %v, want ErrChanged", err)
	}
	// A socket is connected to only if it is the one expected.
	good := testenv.CountAccepts(t, filepath.Join(root, "good.sock"))
	var st syscall.Stat_t
	if err := syscall.Lstat(filepath.Join(root, "good.sock"), &st); err != nil {
		t.Fatal(err)
	}
	if _, err := Socket(ctx, root, "good.sock", Identity{Dev: uint64(st.Dev), Ino: st.Ino + 1}); !errors.Is(err, ErrReplaced) || !errors.Is(err, ErrChanged) {
		t.Errorf("another socket than the one expected: %v, want ErrReplaced, an ErrChanged", err)
	}
	c, err := Socket(ctx, root, "good.sock", Identity{Dev: uint64(st.Dev), Ino: st.Ino})
	if err != nil {
		t.Fatalf("the socket expected: %v", err)
	}
	c.Read(make([]byte, 1)) // the end: the listener has counted it
	c.Close()
	if n := good.Count(); n != 1 {
		t.Errorf("the socket expected was connected to %d times, want 1", n)
	}
	for _, rel := range []string{"", "/abs", "..", "../x"} {
		if _, err := Socket(ctx, root, rel, Identity{}); err == nil {
			t.Errorf("Socket(%q) connected", rel)
		}
	}
}
