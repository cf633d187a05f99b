//go:build !linux

package confine

import (
	"context"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strings"
)

// socket looks at every component of rel below root, without following a
// symlink, just before it connects to root/rel by name: only Linux connects
// through a descriptor of the file it checked. What remains here: a symlink
// swapped in between this look and connect(2) is followed, and the socket's
// identity (want) is not compared.
func socket(ctx context.Context, root, rel string, _ Identity) (*net.UnixConn, error) {
	path := root
	parts := strings.Split(rel, string(filepath.Separator))
	for i, name := range parts {
		path = filepath.Join(path, name)
		fi, err := os.Lstat(path)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		last := i == len(parts)-1
		switch {
		case fi.Mode()&fs.ModeSymlink != 0:
			return nil, fmt.Errorf("%s is now %w: %w", name, errSymlink, ErrChanged)
		case !last && !fi.IsDir():
			return nil, fmt.Errorf("%s is no longer a directory: %w", name, ErrChanged)
		case last && (fi.IsDir() || fi.Mode()&fs.ModeSocket == 0 && runtime.GOOS != "windows"):
			// Windows may show a socket as a plain file (one made in a
			// bind-mounted directory): only a directory is surely not one.
			return nil, fmt.Errorf("%s is no longer a socket: %w", name, ErrChanged)
		}
	}
	var nd net.Dialer
	c, err := nd.DialContext(ctx, "unix", path)
	if err != nil {
		return nil, err
	}
	return c.(*net.UnixConn), nil
}

// heldDir holds nothing here: a connection is made by name, from the path.
type heldDir struct{}

func (heldDir) socket(ctx context.Context, root, rel string, want Identity) (*net.UnixConn, error) {
	return socket(ctx, root, rel, want)
}

func (heldDir) release() {}
func (heldDir) close()   {}
