//go:build unix

package dirtrust

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// mkdir makes dir with mode perm, exactly (umask aside).
func mkdir(t *testing.T, dir string, perm os.FileMode) string {
	t.Helper()
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	chmod(t, dir, perm)
	return dir
}

func chmod(t *testing.T, p string, perm os.FileMode) {
	t.Helper()
	if err := os.Chmod(p, perm); err != nil {
		t.Fatal(err)
	}
}

// wantUntrusted fails unless err says that dir cannot be trusted because of
// at, in words that contain every one of says.
func wantUntrusted(t *testing.T, err error, dir, at string, says ...string) {
	t.Helper()
	var u *Untrusted
	if !errors.As(err, &u) {
		t.Fatalf("Check(%s) = %v, want it refused for %s", dir, err, at)
	}
	if u.Dir != dir || u.At != at {
		t.Errorf("Check(%s) refused it for %s (%v), want for %s", dir, u.At, err, at)
	}
	for _, s := range append(says, dir, at) {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("Check(%s) = %q, want it to say %q", dir, err, s)
		}
	}
}

func TestOwnDirectory(t *testing.T) {
	base := t.TempDir()
	for _, perm := range []os.FileMode{0o700, 0o750, 0o755} {
		dir := mkdir(t, filepath.Join(base, perm.String()), perm)
		if err := Check(dir, os.Geteuid()); err != nil {
			t.Errorf("Check(%s, mode %v) = %v", dir, perm, err)
		}
	}
	// The kubelet's layout, where it exists: root's, mode 0750 or 0755.
	if fi, err := os.Stat("/var/lib/kubelet/plugins_registry"); err == nil && fi.IsDir() {
		if err := Check("/var/lib/kubelet/plugins_registry", os.Geteuid()); err != nil {
			t.Errorf("the kubelet's registry directory: %v", err)
		}
	}
}

func TestWritableDirectory(t *testing.T) {
	base := t.TempDir()
	for _, perm := range []os.FileMode{0o770, 0o757, 0o777, 0o777 | os.ModeSticky} {
		dir := mkdir(t, filepath.Join(base, strings.TrimPrefix(perm.String(), "-")), perm)
		wantUntrusted(t, Check(dir, os.Geteuid()), dir, dir, "writable by users other than its owner", "chmod go-w "+dir)
	}
}

// A 0750 directory in a parent anyone may write to without the sticky bit
// could be renamed away and replaced; with the sticky bit, as /tmp has, it
// cannot.
func TestWritableParent(t *testing.T) {
	parent := t.TempDir()
	dir := mkdir(t, filepath.Join(parent, "plugins"), 0o750)
	for _, perm := range []os.FileMode{0o777, 0o775, 0o757} {
		chmod(t, parent, perm)
		wantUntrusted(t, Check(dir, os.Geteuid()), dir, parent, "no sticky bit", "rename", "chmod go-w "+parent, "chmod +t "+parent)
	}
	chmod(t, parent, 0o777|os.ModeSticky)
	if err := Check(dir, os.Geteuid()); err != nil {
		t.Errorf("Check with a sticky parent (mode 1777) = %v", err)
	}
	// An ancestor further up counts as much as the parent.
	chmod(t, parent, 0o755)
	deep := filepath.Join(dir, "a", "b")
	if err := os.MkdirAll(deep, 0o750); err != nil {
		t.Fatal(err)
	}
	chmod(t, dir, 0o777)
	wantUntrusted(t, Check(deep, os.Geteuid()), deep, dir, "no sticky bit")
}

// Symlinks on the way are followed, and each is checked where it is: one in
// a directory anyone may write to could be pointed elsewhere.
func TestSymlinks(t *testing.T) {
	base := t.TempDir()
	dir := mkdir(t, filepath.Join(base, "real"), 0o750)
	safe := mkdir(t, filepath.Join(base, "safe"), 0o755)
	if err := os.Symlink(dir, filepath.Join(safe, "link")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("../real", filepath.Join(safe, "rel")); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{filepath.Join(safe, "link"), filepath.Join(safe, "rel"), filepath.Join(safe, "rel") + "/../real"} {
		if err := Check(p, os.Geteuid()); err != nil {
			t.Errorf("Check(%s) = %v", p, err)
		}
	}
	open := mkdir(t, filepath.Join(base, "open"), 0o777)
	if err := os.Symlink(dir, filepath.Join(open, "link")); err != nil {
		t.Fatal(err)
	}
	wantUntrusted(t, Check(filepath.Join(open, "link"), os.Geteuid()), filepath.Join(open, "link"), open, "no sticky bit")
	// The target's own mode counts, whatever the link's way.
	chmod(t, dir, 0o770)
	wantUntrusted(t, Check(filepath.Join(safe, "link"), os.Geteuid()), filepath.Join(safe, "link"), dir, "writable by users other than its owner")

	loop := filepath.Join(safe, "loop")
	if err := os.Symlink(loop, loop); err != nil {
		t.Fatal(err)
	}
	if err := Check(loop, os.Geteuid()); err == nil || !strings.Contains(err.Error(), "symlinks") {
		t.Errorf("Check(a symlink loop) = %v", err)
	}
	file := filepath.Join(safe, "file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := Check(file, os.Geteuid()); err == nil || !strings.Contains(err.Error(), "not a directory") {
		t.Errorf("Check(a file) = %v", err)
	}
	if err := Check(filepath.Join(safe, "missing"), os.Geteuid()); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Check(a missing directory) = %v", err)
	}
}

// A directory of another user's (not root's) is refused, as is one reached
// through one. Root makes it so with chown; anyone else, not able to, asks
// for a uid that is neither theirs nor root's, which makes their own
// directories another user's.
func TestOtherOwner(t *testing.T) {
	const other = 54321
	base := t.TempDir()
	parent := mkdir(t, filepath.Join(base, "parent"), 0o755)
	dir := mkdir(t, filepath.Join(parent, "plugins"), 0o750)
	uid := os.Geteuid()
	if uid != 0 {
		// The test's directories are ours, so not uid other's: the first
		// of them on the way is refused.
		var u *Untrusted
		err := Check(dir, other)
		if !errors.As(err, &u) || !strings.HasPrefix(dir, u.At) || !strings.Contains(err.Error(), "belongs to uid") {
			t.Errorf("Check(%s, for uid %d) = %v, want it refused for a directory of ours on the way", dir, other, err)
		}
		return
	}
	if err := os.Chown(dir, other, -1); err != nil {
		t.Fatal(err)
	}
	wantUntrusted(t, Check(dir, uid), dir, dir, "belongs to uid 54321", "chown 0 "+dir)
	if err := os.Chown(dir, 0, -1); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(parent, other, -1); err != nil {
		t.Fatal(err)
	}
	wantUntrusted(t, Check(dir, uid), dir, parent, "belongs to uid 54321")
	// A root-owned directory passes for any user: root may do anything anyway.
	if err := os.Chown(parent, 0, -1); err != nil {
		t.Fatal(err)
	}
	if err := Check(dir, other); err != nil {
		t.Errorf("Check(root's directories, for uid %d) = %v", other, err)
	}
	// A symlink of another user's in a sticky directory is theirs to replace.
	sticky := mkdir(t, filepath.Join(base, "sticky"), 0o777|os.ModeSticky)
	link := filepath.Join(sticky, "link")
	if err := os.Symlink(dir, link); err != nil {
		t.Fatal(err)
	}
	if err := Check(link, uid); err != nil {
		t.Errorf("Check(our symlink in a sticky directory) = %v", err)
	}
	if err := os.Lchown(link, other, -1); err != nil {
		t.Fatal(err)
	}
	wantUntrusted(t, Check(link, uid), link, link, "belongs to uid 54321")
}

// A directory below a checked one is held to the rule for the directory
// sockets are taken from, and to nothing above it: a sticky bit does not
// make a directory anyone may write to safe, as it does on the way to one.
func TestCheckBelow(t *testing.T) {
	const other = 54321
	base := t.TempDir()
	uid := os.Geteuid()
	for _, perm := range []os.FileMode{0o700, 0o750, 0o755} {
		dir := mkdir(t, filepath.Join(base, perm.String()), perm)
		if err := CheckBelow(dir, uid); err != nil {
			t.Errorf("CheckBelow(%s, mode %v) = %v", dir, perm, err)
		}
	}
	for _, perm := range []os.FileMode{0o770, 0o757, 0o777 | os.ModeSticky} {
		dir := mkdir(t, filepath.Join(base, "w"+perm.String()), perm)
		wantUntrusted(t, CheckBelow(dir, uid), dir, dir, "writable by users other than its owner", "chmod go-w "+dir)
	}
	// Below a directory anyone may write to: that one is not looked at.
	open := mkdir(t, filepath.Join(base, "open"), 0o777)
	below := mkdir(t, filepath.Join(open, "below"), 0o750)
	if err := CheckBelow(below, uid); err != nil {
		t.Errorf("CheckBelow(%s) = %v, want the parent left to the caller", below, err)
	}
	if err := os.Symlink(below, filepath.Join(base, "link")); err != nil {
		t.Fatal(err)
	}
	if err := CheckBelow(filepath.Join(base, "link"), uid); err == nil || !strings.Contains(err.Error(), "not a directory") {
		t.Errorf("CheckBelow(a symlink) = %v, want it refused as not a directory", err)
	}
	if _, err := os.Stat(filepath.Join(base, "gone")); err == nil {
		t.Fatal("gone exists")
	}
	if err := CheckBelow(filepath.Join(base, "gone"), uid); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("CheckBelow(a directory that is not there) = %v, want ErrNotExist", err)
	}
	dir := filepath.Join(base, os.FileMode(0o750).String())
	if uid != 0 {
		wantUntrusted(t, CheckBelow(dir, other), dir, dir, "belongs to uid")
		return
	}
	if err := os.Chown(dir, other, -1); err != nil {
		t.Fatal(err)
	}
	wantUntrusted(t, CheckBelow(dir, uid), dir, dir, "belongs to uid 54321", "chown 0 "+dir)
}
