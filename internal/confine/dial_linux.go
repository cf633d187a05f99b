package confine

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

// socket walks from a descriptor of root to rel one component at a time,
// with O_PATH|O_NOFOLLOW, so that no symlink is followed, checks the socket
// it found on its own descriptor, and connects through that descriptor
// (/proc/self/fd/N): a file swapped in after the check is refused, not
// followed, and a path too long for sun_path is no obstacle.
func socket(ctx context.Context, root, rel string, want Identity) (*net.UnixConn, error) {
	dir, err := unix.Open(root, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("opening %s: %w", root, err)
	}
	defer unix.Close(dir)
	c, _, err := walk(ctx, dir, rel, want)
	return c, err
}

// walk is socket from dir, a descriptor of root, which it leaves open.
// reached reports whether the socket expected was found, whatever the
// connection to it said.
func walk(ctx context.Context, dir int, rel string, want Identity) (c *net.UnixConn, reached bool, err error) {
	fd, name, err := reach(dir, rel)
	if err != nil {
		return nil, false, err
	}
	defer unix.Close(fd)
	return connect(ctx, fd, name, want)
}

// reach opens rel below dir, with O_PATH, one component at a time, with
// O_NOFOLLOW: fd is the last component's descriptor, to be closed, and name
// its name. dir is used only to open the first component, and left open.
func reach(dir int, rel string) (fd int, name string, err error) {
	from := dir
	name, rest, more := strings.Cut(rel, string(os.PathSeparator))
	for ; more; name, rest, more = strings.Cut(rest, string(os.PathSeparator)) {
		next, err := unix.Openat(from, name, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if from != dir {
			unix.Close(from)
		}
		if err != nil {
			return -1, name, changed(name, err)
		}
		from = next
	}
	fd, err = unix.Openat(from, name, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if from != dir {
		unix.Close(from)
	}
	if err != nil {
		return -1, name, changed(name, err)
	}
	return fd, name, nil
}

// connect checks that fd, the descriptor reach opened for name, is a
// socket, and the one expected unless want is zero, and connects to it
// through fd. reached reports whether it is the socket expected, whatever
// the connection to it said.
func connect(ctx context.Context, fd int, name string, want Identity) (c *net.UnixConn, reached bool, err error) {
	var st unix.Statx_t
	if err := unix.Statx(fd, "", unix.AT_EMPTY_PATH, unix.STATX_TYPE|unix.STATX_INO, &st); err != nil {
		return nil, false, fmt.Errorf("%s: %w", name, err)
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFSOCK:
	case unix.S_IFLNK:
		return nil, false, fmt.Errorf("%s is now %w: %w", name, errSymlink, ErrChanged)
	default:
		return nil, false, fmt.Errorf("%s is no longer a socket: %w", name, ErrChanged)
	}
	if got := (Identity{Dev: unix.Mkdev(st.Dev_major, st.Dev_minor), Ino: st.Ino}); want != (Identity{}) && got != want {
		return nil, false, fmt.Errorf("%s: %w", name, ErrReplaced)
	}
	// connect(2) on /proc/self/fd/N reaches the socket the descriptor holds.
	var nd net.Dialer
	nc, err := nd.DialContext(ctx, "unix", "/proc/self/fd/"+strconv.Itoa(fd))
	if err != nil {
		return nil, true, unwrapOp(err)
	}
	return nc.(*net.UnixConn), true, nil
}

// heldDir is the descriptor of a Root's directory, held open. Walks share
// it under mu's read lock, for the first step of the walk only; it is
// replaced, or let go, under its write lock, so that it is never closed
// under a walk.
type heldDir struct {
	mu     sync.RWMutex
	fd     int
	id     Identity // of the directory held
	valid  bool     // fd is held
	closed bool     // Close was called: hold nothing any more
}

// socket connects as Root.Socket says: from the directory held, and, if the
// socket expected is not found from there, from the directory at root now,
// held from then on if it is another one.
func (h *heldDir) socket(ctx context.Context, root, rel string, want Identity) (*net.UnixConn, error) {
	if c, reached, held, err := h.walk(ctx, rel, want); held && (err == nil || reached) {
		return c, err
	}
	fd, id, err := openDir(root)
	if err != nil {
		return nil, err
	}
	h.mu.Lock()
	switch {
	case h.closed:
		h.mu.Unlock()
		defer unix.Close(fd)
		c, _, err := walk(ctx, fd, rel, want)
		return c, err
	case h.valid && h.id == id:
		unix.Close(fd) // the one held: what was not found there is not there
	default:
		if h.valid {
			unix.Close(h.fd)
		}
		h.fd, h.id, h.valid = fd, id, true
	}
	h.mu.Unlock()
	c, _, held, err := h.walk(ctx, rel, want)
	if !held { // let go of meanwhile
		return socket(ctx, root, rel, want)
	}
	return c, err
}

// walk is walk from the directory held; held is false if none is.
func (h *heldDir) walk(ctx context.Context, rel string, want Identity) (c *net.UnixConn, reached, held bool, err error) {
	h.mu.RLock()
	if !h.valid {
		h.mu.RUnlock()
		return nil, false, false, nil
	}
	fd, name, err := reach(h.fd, rel)
	h.mu.RUnlock()
	if err != nil {
		return nil, false, true, err
	}
	defer unix.Close(fd)
	c, reached, err = connect(ctx, fd, name, want)
	return c, reached, true, err
}

// openDir opens the directory at path, as a walk starts from it, and tells
// which directory it is.
func openDir(path string) (fd int, id Identity, err error) {
	fd, err = unix.Open(path, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, Identity{}, fmt.Errorf("opening %s: %w", path, err)
	}
	var st unix.Statx_t
	if err := unix.Statx(fd, "", unix.AT_EMPTY_PATH, unix.STATX_INO, &st); err != nil {
		unix.Close(fd)
		return -1, Identity{}, fmt.Errorf("%s: %w", path, err)
	}
	return fd, Identity{Dev: unix.Mkdev(st.Dev_major, st.Dev_minor), Ino: st.Ino}, nil
}

// release lets go of the descriptor held.
func (h *heldDir) release() { h.letGo(false) }

// close lets go of the descriptor held, and holds none from then on.
func (h *heldDir) close() { h.letGo(true) }

func (h *heldDir) letGo(closing bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.valid {
		unix.Close(h.fd)
		h.valid = false
	}
	h.closed = h.closed || closing
}

// changed explains a walk that met something other than what was checked:
// a symlink where a directory or the socket was (O_NOFOLLOW's ELOOP, or
// O_DIRECTORY's ENOTDIR).
func changed(name string, err error) error {
	if errors.Is(err, unix.ELOOP) || errors.Is(err, unix.ENOTDIR) {
		return fmt.Errorf("%s is now %w: %w", name, errSymlink, ErrChanged)
	}
	return fmt.Errorf("%s: %w", name, err)
}

// unwrapOp is the error of a failed dial without the *net.OpError that names
// the /proc path, which means nothing to a reader.
func unwrapOp(err error) error {
	var op *net.OpError
	if errors.As(err, &op) {
		return op.Err
	}
	return err
}
