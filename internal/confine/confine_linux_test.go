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

// A Root walks from the directory it holds, with Socket's checks, and from
// the directory at its path once a socket is not found in the one held.
func TestRoot(t *testing.T) {
	dir := testenv.ShortDir(t, "rt")
	root, outside := filepath.Join(dir, "root"), filepath.Join(dir, "outside")
	for _, d := range []string{root, outside} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	ctx := context.Background()
	idOf := func(path string) Identity {
		t.Helper()
		var st syscall.Stat_t
		if err := syscall.Lstat(path, &st); err != nil {
			t.Fatal(err)
		}
		return Identity{Dev: st.Dev, Ino: st.Ino}
	}
	connect := func(r *Root, rel string, want Identity) error {
		c, err := r.Socket(ctx, rel, want)
		if err == nil {
			c.Read(make([]byte, 1)) // the end: the listener has counted it
			c.Close()
		}
		return err
	}
	r := NewRoot(root)
	defer r.Close()
	a := testenv.CountAccepts(t, filepath.Join(root, "a.sock"))
	idA := idOf(filepath.Join(root, "a.sock"))
	if err := connect(r, "a.sock", idA); err != nil {
		t.Fatalf("a.sock: %v", err)
	}

	// The checks hold from the directory held.
	evil := testenv.CountAccepts(t, filepath.Join(outside, "evil.sock"))
	idEvil := idOf(filepath.Join(outside, "evil.sock"))
	if err := os.Symlink(outside, filepath.Join(root, "sub")); err != nil {
		t.Fatal(err)
	}
	if err := connect(r, filepath.Join("sub", "evil.sock"), idEvil); !errors.Is(err, ErrChanged) {
		t.Errorf("through a directory swapped for a symlink: %v, want ErrChanged", err)
	}
	if err := os.Symlink(filepath.Join(outside, "evil.sock"), filepath.Join(root, "evil.sock")); err != nil {
		t.Fatal(err)
	}
	if err := connect(r, "evil.sock", idEvil); !errors.Is(err, ErrChanged) {
		t.Errorf("through a socket swapped for a symlink: %v, want ErrChanged", err)
	}
	if err := connect(r, "a.sock", Identity{Dev: idA.Dev, Ino: idA.Ino + 1}); !errors.Is(err, ErrReplaced) {
		t.Errorf("another socket than the one expected: %v, want ErrReplaced", err)
	}
	if n := evil.Count(); n != 0 {
		t.Errorf("the socket outside the root was connected to %d times", n)
	}
	if n := a.Count(); n != 1 {
		t.Errorf("a.sock connected to %d times, want once", n)
	}

	// The directory replaced: a socket in the new one is found there, and
	// one left in the old one is not found any more.
	if err := os.Rename(root, filepath.Join(dir, "old")); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(root, 0o755); err != nil {
		t.Fatal(err)
	}
	b := testenv.CountAccepts(t, filepath.Join(root, "b.sock"))
	if err := connect(r, "b.sock", idOf(filepath.Join(root, "b.sock"))); err != nil {
		t.Errorf("b.sock in the new directory: %v", err)
	}
	if err := connect(r, "a.sock", idA); !errors.Is(err, syscall.ENOENT) {
		t.Errorf("a.sock, left in the old directory: %v, want ENOENT", err)
	}
	if n := b.Count(); n != 1 {
		t.Errorf("b.sock connected to %d times, want once", n)
	}

	// Told of a replacement, it looks at the path again before anything.
	if err := os.Rename(root, filepath.Join(dir, "older")); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(root, 0o755); err != nil {
		t.Fatal(err)
	}
	r.Reopen()
	if err := connect(r, "b.sock", idOf(filepath.Join(dir, "older", "b.sock"))); !errors.Is(err, syscall.ENOENT) {
		t.Errorf("b.sock, moved away with its directory, after Reopen: %v, want ENOENT", err)
	}

	// Closed, it still connects, holding nothing.
	r.Close()
	c := testenv.CountAccepts(t, filepath.Join(root, "c.sock"))
	if err := connect(r, "c.sock", idOf(filepath.Join(root, "c.sock"))); err != nil || c.Count() != 1 {
		t.Errorf("after Close: %v, %d connections; want one", err, c.Count())
	}
	if r.held.valid {
		t.Error("a descriptor held after Close")
	}
}

// Connections made while the directory held is let go of again and again
// all reach the socket: a descriptor is never closed under a walk.
func TestRootConcurrent(t *testing.T) {
	dir := testenv.ShortDir(t, "rc")
	testenv.CountAccepts(t, filepath.Join(dir, "s.sock"))
	var st syscall.Stat_t
	if err := syscall.Lstat(filepath.Join(dir, "s.sock"), &st); err != nil {
		t.Fatal(err)
	}
	want := Identity{Dev: st.Dev, Ino: st.Ino}
	r := NewRoot(dir)
	defer r.Close()
	stop := make(chan struct{})
	reopened := make(chan struct{})
	go func() {
		defer close(reopened)
		for {
			select {
			case <-stop:
				return
			default:
				r.Reopen()
			}
		}
	}()
	errs := make(chan error, 4)
	for range 4 {
		go func() {
			for range 50 {
				c, err := r.Socket(context.Background(), "s.sock", want)
				if err != nil {
					errs <- err
					return
				}
				c.Close()
			}
			errs <- nil
		}()
	}
	for range 4 {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
	close(stop)
	<-reopened
}
