package confine

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"

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
	parts := strings.Split(rel, string(os.PathSeparator))
	for _, name := range parts[:len(parts)-1] {
		next, err := unix.Openat(dir, name, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		unix.Close(dir)
		if err != nil {
			return nil, changed(name, err)
		}
		dir = next
	}
	name := parts[len(parts)-1]
	fd, err := unix.Openat(dir, name, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	unix.Close(dir)
	if err != nil {
		return nil, changed(name, err)
	}
	defer unix.Close(fd)
	var st unix.Statx_t
	if err := unix.Statx(fd, "", unix.AT_EMPTY_PATH, unix.STATX_TYPE|unix.STATX_INO, &st); err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFSOCK:
	case unix.S_IFLNK:
		return nil, fmt.Errorf("%s is now %w: %w", name, errSymlink, ErrChanged)
	default:
		return nil, fmt.Errorf("%s is no longer a socket: %w", name, ErrChanged)
	}
	if got := (Identity{Dev: unix.Mkdev(st.Dev_major, st.Dev_minor), Ino: st.Ino}); want != (Identity{}) && got != want {
		return nil, fmt.Errorf("%s: %w", name, ErrReplaced)
	}
	// connect(2) on /proc/self/fd/N reaches the socket the descriptor holds.
	var nd net.Dialer
	c, err := nd.DialContext(ctx, "unix", "/proc/self/fd/"+strconv.Itoa(fd))
	if err != nil {
		return nil, unwrapOp(err)
	}
	return c.(*net.UnixConn), nil
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
