package kubeletstate

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
)

// Who answers at the kubelet's address. The kubelet's port is an ordinary
// TCP port: once the kubelet has exited, any local user may listen on it.
// plugd believes what answers there, and sends it its ServiceAccount
// token, only when it knows that it is the kubelet:
//
//   - a listening socket at that address on this host (plugd with the
//     node's network, hostNetwork or a systemd unit) must belong to root,
//     as the kubelet's does, or to plugd's own user (who can read plugd's
//     token anyway); any other owner is not the kubelet, and gets no byte:
//     the kubelet counts as not running;
//   - a listener plugd cannot see (plugd in a pod of its own network, the
//     chart's default, reads the kubelet at the node's address) is the
//     kubelet only by its verified serving certificate; with
//     insecureSkipTLSVerify, nothing says who it is, and plugd sends its
//     token to no such listener.
//
// The owner is read from the kernel's table of the network namespace's
// TCP sockets (listenerUIDs), after the connection is made and before
// anything is sent on it.

// errUnverifiable refuses a read with insecureSkipTLSVerify from a
// listener plugd cannot see.
var errUnverifiable = errors.New("kubernetes.kubelet.insecureSkipTLSVerify is set, and the listener at the kubelet's address is not on plugd's network (no hostNetwork): nothing says it is the kubelet, and plugd sends its token to no one unverified; set kubernetes.kubelet.caFile to the kubelet's certificate")

// notKubeletError is a listener at the kubelet's address that belongs to
// a user the kubelet does not run as.
type notKubeletError struct {
	addr string
	uid  uint32
}

func (e *notKubeletError) Error() string {
	return fmt.Sprintf("the process listening at %s runs as uid %d, neither root (the kubelet) nor plugd's user: it is not the kubelet, and plugd sent it nothing", e.addr, e.uid)
}

// dial connects to the kubelet's address and checks who listens there
// (above) before the connection is used; c.trusted says which owners of a
// listening socket are the kubelet.
func (c *Client) dial(ctx context.Context, addr string) (net.Conn, error) {
	d := net.Dialer{Timeout: c.timeout, KeepAlive: keepAlive}
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	uids, local := listenerUIDs(conn.RemoteAddr())
	for _, uid := range uids {
		if !c.trusted(uid) {
			conn.Close()
			return nil, &notKubeletError{addr: conn.RemoteAddr().String(), uid: uid}
		}
	}
	if !local && c.insecure {
		conn.Close()
		return nil, errUnverifiable
	}
	return conn, nil
}

// kubeletUID says a listening socket of uid may be the kubelet's: root's,
// or plugd's own user's.
func kubeletUID(uid uint32) bool {
	return uid == 0 || int(uid) == os.Geteuid()
}
