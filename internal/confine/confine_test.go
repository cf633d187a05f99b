package confine

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"go.uber.org/goleak"

	"github.com/plugd/plugd/internal/testenv"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestDial(t *testing.T) {
	dir := testenv.ShortDir(t, "ep")
	root, outside := filepath.Join(dir, "root"), filepath.Join(dir, "outside")
	for _, d := range []string{filepath.Join(root, "sub"), outside} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	inside := testenv.CountAccepts(t, filepath.Join(root, "sub", "ok.sock"))
	evil := testenv.CountAccepts(t, filepath.Join(outside, "evil.sock"))
	for link, target := range map[string]string{
		filepath.Join(root, "evil.sock"): filepath.Join(outside, "evil.sock"), // a symlink out of the root
		filepath.Join(root, "alias"):     filepath.Join(root, "sub"),          // one that stays in it
		filepath.Join(dir, "rootlink"):   root,                                // the root reached through a symlink
	} {
		if err := os.Symlink(target, link); err != nil {
			t.Fatal(err)
		}
	}
	ctx := context.Background()
	dial := func(d Dialer, path string) error {
		c, err := d.Dial(ctx, path)
		if err == nil {
			c.Read(make([]byte, 1)) // the end: the listener has counted it
			c.Close()
		}
		return err
	}
	confined := Dialer{Roots: []string{filepath.Join(dir, "rootlink")}}
	for _, path := range []string{filepath.Join(root, "sub", "ok.sock"), filepath.Join(root, "alias", "ok.sock")} {
		if err := dial(confined, path); err != nil {
			t.Errorf("%s, inside the root: %v", path, err)
		}
	}
	if err := dial(confined, filepath.Join(root, "evil.sock")); !errors.Is(err, ErrOutside) {
		t.Errorf("a symlink out of the root: %v, want ErrOutside", err)
	}
	if err := dial(confined, filepath.Join(outside, "evil.sock")); !errors.Is(err, ErrOutside) {
		t.Errorf("outside the root: %v, want ErrOutside", err)
	}
	if err := dial(confined, filepath.Join(root, "gone.sock")); err == nil || errors.Is(err, ErrOutside) {
		t.Errorf("a missing socket: %v, want an error that is not ErrOutside", err)
	}
	if n := evil.Count(); n != 0 {
		t.Errorf("the socket outside the root was connected to %d times", n)
	}
	if inside.Count() != 2 {
		t.Errorf("the socket inside the root was connected to %d times, want 2", inside.Count())
	}

	// Without roots, anything goes.
	if err := dial(Dialer{}, filepath.Join(root, "evil.sock")); err != nil {
		t.Errorf("without roots: %v", err)
	}
	// A plugin's registration socket as its endpoint is confined to its
	// own directory, whatever the roots.
	reg := For(filepath.Join(root, "evil.sock"), filepath.Join(root, "evil.sock"), confined.Roots)
	if len(reg.Roots) != 1 || reg.Roots[0] != root {
		t.Errorf("For the registration socket = %+v, want its directory", reg)
	}
	if err := dial(reg, filepath.Join(root, "evil.sock")); !errors.Is(err, ErrOutside) {
		t.Errorf("the registration socket swapped for a symlink out of its directory: %v, want ErrOutside", err)
	}
	if err := dial(reg, filepath.Join(root, "sub", "ok.sock")); err != nil {
		t.Errorf("the registration socket in place: %v", err)
	}
	if n := evil.Count(); n != 1 {
		t.Errorf("the socket outside the root was connected to %d times, want once (without roots)", n)
	}
}

func TestWithin(t *testing.T) {
	for _, tc := range []struct {
		p, dir string
		want   bool
	}{
		{"/a/b", "/a/b", true},
		{"/a/b/c.sock", "/a/b", true},
		{"/a/b/c.sock", "/a/b/", true},
		{"/a/bc/c.sock", "/a/b", false},
		{"/a", "/a/b", false},
		{"/a/b/../c", "/a/b", false},
		{"/x/y", "/", true},
	} {
		if got := Within(filepath.FromSlash(tc.p), filepath.FromSlash(tc.dir)); got != tc.want {
			t.Errorf("Within(%q, %q) = %v, want %v", tc.p, tc.dir, got, tc.want)
		}
	}
}
