package confine

import (
	"context"
	"net"
)

// Socket connects to the unix socket at root/rel as Root.Socket does, from
// the directory opened again: the walk, the checks and the connection
// without a descriptor held, for the tests.
func Socket(ctx context.Context, root, rel string, want Identity) (*net.UnixConn, error) {
	clean, err := inside(root, rel)
	if err != nil {
		return nil, err
	}
	return socket(ctx, root, clean, want)
}
