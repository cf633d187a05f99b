package endpoint

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

// dialBeneath connects to the socket at root/rel, walking there one
// component at a time from a descriptor of root without following a symlink,
// and connecting through the descriptor of the socket it found: a symlink
// swapped in after Dial's check is refused, not followed. path is the
// endpoint as the plugin gave it, for messages.
func dialBeneath(ctx context.Context, path, root, rel string) (net.Conn, error) {
	dir, err := unix.Open(root, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("endpoint %s: opening %s: %w", path, root, err)
	}
	parts := strings.Split(rel, string(os.PathSeparator))
	for _, name := range parts[:len(parts)-1] {
		next, err := unix.Openat(dir, name, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		unix.Close(dir)
		if err != nil {
			return nil, changed(path, name, err)
		}
		dir = next
	}
	name := parts[len(parts)-1]
	fd, err := unix.Openat(dir, name, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	unix.Close(dir)
	if err != nil {
		return nil, changed(path, name, err)
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, fmt.Errorf("endpoint %s: %w", path, err)
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFSOCK:
	case unix.S_IFLNK:
		return nil, fmt.Errorf("endpoint %s changed while connecting: %s is now a symlink: %w", path, name, ErrOutside)
	default:
		return nil, fmt.Errorf("endpoint %s changed while connecting: %s is no longer a socket: not connecting", path, name)
	}
	// connect(2) on /proc/self/fd/N reaches the socket the descriptor holds.
	var nd net.Dialer
	c, err := nd.DialContext(ctx, "unix", "/proc/self/fd/"+strconv.Itoa(fd))
	if err != nil {
		return nil, fmt.Errorf("dial unix %s: %w", path, unwrapOp(err))
	}
	return c, nil
}

// changed explains a walk that met something other than what Dial resolved.
func changed(path, name string, err error) error {
	if errors.Is(err, unix.ELOOP) || errors.Is(err, unix.ENOTDIR) {
		return fmt.Errorf("endpoint %s changed while connecting: %s is now a symlink: %w", path, name, ErrOutside)
	}
	return fmt.Errorf("endpoint %s: %s: %w", path, name, err)
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
