//go:build unix

package dirtrust

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
)

// Check returns nil if dir is safe from users other than uid (plugd's
// effective uid) and root, or else an error (an *Untrusted when it is the
// directory's ownership or mode) that says why:
//
//   - dir, and every directory and symlink on the way to it, must belong to
//     uid or to root: an owner can chmod what it owns, and rename what is in
//     it;
//   - no directory on the way may be writable by users other than its owner,
//     unless it has the sticky bit (as /tmp has, mode 1777), with which only
//     an entry's owner may rename it: anyone who can write there could rename
//     dir (or a directory above it) away and put their own in its place;
//   - dir itself must not be writable by users other than its owner: anyone
//     who can write there can put a socket there or replace one.
//
// Symlinks are followed, each checked where it is, as the kernel follows
// them when the path is used.
func Check(dir string, uid int) error {
	abs, err := absolute(dir)
	if err != nil {
		return err
	}
	c := checker{dir: dir, abs: abs, uid: uid}
	return c.walk(abs)
}

// absolute is path made absolute but not cleaned: ".." after a symlink is
// the symlink's target's parent, as the kernel takes it, which only the walk
// can tell.
func absolute(path string) (string, error) {
	if filepath.IsAbs(path) {
		return path, nil
	}
	wd, err := os.Getwd()
	if err != nil {
		return "", err
	}
	return wd + "/" + path, nil
}

type checker struct {
	dir   string // as given
	abs   string // made absolute
	uid   int
	links int
}

func (c *checker) walk(path string) error {
	todo := split(path)
	cur := "/"
	fi, err := os.Lstat(cur)
	if err != nil {
		return err
	}
	if err := c.owner(cur, fi); err != nil {
		return err
	}
	for len(todo) > 0 {
		name := todo[0]
		todo = todo[1:]
		switch name {
		case ".":
			continue
		case "..":
			cur = filepath.Dir(cur) // cur has no symlink in it: this is its parent
			continue
		}
		// name is looked up in cur: whoever may write there can swap it.
		if err := c.container(cur); err != nil {
			return err
		}
		next := filepath.Join(cur, name)
		fi, err := os.Lstat(next)
		if err != nil {
			return err
		}
		if err := c.owner(next, fi); err != nil {
			return err
		}
		switch {
		case fi.Mode()&fs.ModeSymlink != 0:
			if c.links++; c.links > maxLinks {
				return fmt.Errorf("%s: more than %d symlinks on the way to it", c.dir, maxLinks)
			}
			target, err := os.Readlink(next)
			if err != nil {
				return err
			}
			if filepath.IsAbs(target) {
				cur = "/"
			}
			todo = append(split(target), todo...)
		case fi.IsDir():
			cur = next
		default:
			return fmt.Errorf("%s is not a directory", next)
		}
	}
	fi, err = os.Lstat(cur)
	if err != nil {
		return err
	}
	return c.sockets(cur, fi)
}

// CheckBelow returns nil if dir, a directory below one Check accepted and
// reached from it through no symlink, is as safe for the sockets in it: it
// belongs to uid or to root, and users other than its owner may not write
// to it (a sticky bit is no help here: whoever may write in it may put a
// socket there). Otherwise the error (an *Untrusted when it is the
// directory's ownership or mode) says why. The directories above it are
// not looked at again: each is Check's directory or was checked so.
func CheckBelow(dir string, uid int) error {
	fi, err := os.Lstat(dir)
	if err != nil {
		return err
	}
	if !fi.IsDir() {
		return fmt.Errorf("%s is not a directory", dir)
	}
	c := checker{dir: dir, abs: dir, uid: uid}
	if err := c.owner(dir, fi); err != nil {
		return err
	}
	return c.sockets(dir, fi)
}

// sockets refuses p, described by fi, as a directory sockets are taken
// from, if users other than its owner may write to it.
func (c *checker) sockets(p string, fi fs.FileInfo) error {
	if perm := fi.Mode().Perm(); perm&0o022 != 0 {
		return &Untrusted{Dir: c.dir, At: c.at(p), Why: fmt.Sprintf(
			"is writable by users other than its owner (mode %v): they could put a socket there or replace one; remove that permission (chmod go-w %s)", perm, p)}
	}
	return nil
}

// at names the directory at fault: the one checked, as it was given, if it
// is that one.
func (c *checker) at(p string) string {
	if filepath.Clean(c.abs) == p {
		return c.dir
	}
	return p
}

// owner refuses p, described by fi, unless it belongs to c.uid or root.
func (c *checker) owner(p string, fi fs.FileInfo) error {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return fmt.Errorf("%s: the owner of %s is unknown", c.dir, p)
	}
	if uid := int(st.Uid); uid != c.uid && uid != 0 {
		return &Untrusted{Dir: c.dir, At: c.at(p), Why: fmt.Sprintf(
			"belongs to uid %d, neither to plugd's (uid %d) nor to root: its owner can change its mode and replace what is in it; chown it to uid %d or root (chown %d %s), or use a directory that is",
			uid, c.uid, c.uid, c.uid, p)}
	}
	return nil
}

// container refuses the directory dir, as one on the way, if users other
// than its owner may write to it and it has no sticky bit.
func (c *checker) container(dir string) error {
	fi, err := os.Lstat(dir)
	if err != nil {
		return err
	}
	if perm := fi.Mode().Perm(); perm&0o022 != 0 && fi.Mode()&fs.ModeSticky == 0 {
		return &Untrusted{Dir: c.dir, At: dir, Why: fmt.Sprintf(
			"is writable by users other than its owner (mode %v) and has no sticky bit: any of them could rename the directory away and put one of their own in its place; remove that permission (chmod go-w %s), or set the sticky bit as /tmp has (chmod +t %s)",
			fi.Mode().Perm(), dir, dir)}
	}
	return nil
}

// split is the names of path, in order.
func split(path string) []string {
	var names []string
	for _, n := range strings.Split(path, "/") {
		if n != "" {
			names = append(names, n)
		}
	}
	return names
}
