package pluginmanager

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"syscall"
	"time"
	"unicode"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"

	"github.com/plugd/plugd/internal/textsafe"
	"github.com/plugd/plugd/internal/unaryconn"
)

// Bounds on what a plugin may send. GetInfo's answer is small; anything larger
// is a broken or hostile plugin, refused before it costs memory.
const (
	maxInfoBytes    = 64 << 10
	maxTypeLen      = 128
	maxNameLen      = 256
	maxEndpointLen  = 4096
	maxVersions     = 32
	maxVersionLen   = 64
	maxErrorMessage = 1024 // the reason sent back to a plugin
)

// peer is who listens on a socket, as the kernel says (SO_PEERCRED).
type peer struct {
	pid, uid, gid uint32
	known         bool
}

// dial opens a connection to the registration socket at path, within
// DialTimeout: an HTTP/2 connection on which GetInfo, NotifyRegistrationStatus
// and later the liveness probes are made (see unaryconn for why not a
// grpc-go ClientConn). A refused connection fails at once with the dialer's
// error; one that is not answered fails at the deadline, with its cause.
func (m *parts) dial(ctx context.Context, path string) (*unaryconn.Conn, error) {
	return m.dialRetrying(ctx, path, 0)
}

// dialNew is dial for a socket that appeared a moment ago, which is most
// likely bound but not listening yet if it refuses: a server's socket file
// appears when it binds, before it listens (node-driver-registrar, and
// net.Listen, do both in place). A refused connection is tried again after
// 1, 2, 4 and 8 ms before it counts. That wait is the plugin's own start-up,
// so it is real time, and it is bounded by the dial's deadline.
func (m *parts) dialNew(ctx context.Context, path string) (*unaryconn.Conn, error) {
	return m.dialRetrying(ctx, path, 4)
}

func (m *parts) dialRetrying(ctx context.Context, path string, retries int) (*unaryconn.Conn, error) {
	ctx, cancel := context.WithTimeoutCause(ctx, m.opts.DialTimeout,
		fmt.Errorf("no connection within %s", m.opts.DialTimeout))
	defer cancel()
	wait := time.Millisecond
	for {
		conn, err := unaryconn.Dial(ctx, path)
		if err == nil {
			return conn, nil
		}
		if retries > 0 && errors.Is(err, syscall.ECONNREFUSED) && ctx.Err() == nil {
			retries--
			t := time.NewTimer(wait)
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
			}
			wait *= 2
			continue
		}
		if ctx.Err() != nil {
			err = context.Cause(ctx)
		}
		return nil, fmt.Errorf("connect %s: %w", path, err)
	}
}

// peerOf asks the kernel who is at the other end of a connection.
func peerOf(c *unaryconn.Conn) peer {
	raw, err := c.SyscallConn()
	if err != nil {
		return peer{}
	}
	var who peer
	raw.Control(func(fd uintptr) {
		if cred, err := unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED); err == nil {
			who = peer{pid: uint32(cred.Pid), uid: cred.Uid, gid: cred.Gid, known: true}
		}
	})
	return who
}

// The registration service's methods, as gRPC names them on the wire.
const (
	methodGetInfo = "/pluginregistration.Registration/GetInfo"
	methodNotify  = "/pluginregistration.Registration/NotifyRegistrationStatus"
)

// getInfo asks the plugin who it is.
func getInfo(ctx context.Context, conn *unaryconn.Conn) (*registerapi.PluginInfo, error) {
	info := new(registerapi.PluginInfo)
	err := conn.Invoke(ctx, methodGetInfo, &registerapi.InfoRequest{}, info, maxInfoBytes)
	if err != nil {
		return nil, wrapRPC(ctx, "GetInfo", err)
	}
	return info, nil
}

// unimplemented reports whether the plugin does not serve the Registration
// service at all: no retry will change that.
func unimplemented(err error) bool {
	return status.Code(err) == codes.Unimplemented
}

// pluginFromInfo checks a GetInfo answer against the bounds and turns it into a
// Plugin. An empty endpoint means the registration socket itself.
func pluginFromInfo(info *registerapi.PluginInfo, socket string) (Plugin, error) {
	p := Plugin{
		Type:     info.GetType(),
		Name:     info.GetName(),
		Endpoint: info.GetEndpoint(),
		Versions: info.GetSupportedVersions(),
		Socket:   socket,
	}
	if err := checkField("type", p.Type, maxTypeLen, true); err != nil {
		return p, err
	}
	if err := checkField("name", p.Name, maxNameLen, true); err != nil {
		return p, err
	}
	if err := checkField("endpoint", p.Endpoint, maxEndpointLen, false); err != nil {
		return p, err
	}
	if len(p.Versions) > maxVersions {
		return p, fmt.Errorf("%w: %d supported versions, at most %d are allowed", errInvalidInfo, len(p.Versions), maxVersions)
	}
	for i, v := range p.Versions {
		if err := checkField(fmt.Sprintf("supported_versions[%d]", i), v, maxVersionLen, true); err != nil {
			return p, err
		}
	}
	if p.Endpoint == "" {
		p.Endpoint = socket
	}
	if !filepath.IsAbs(strings.TrimPrefix(p.Endpoint, "unix://")) {
		return p, fmt.Errorf("%w: endpoint %.64q is not an absolute path (or unix:// and an absolute path)", errInvalidInfo, p.Endpoint)
	}
	return p, nil
}

// endpointPath is the filesystem path of an endpoint.
func endpointPath(endpoint string) string {
	return filepath.Clean(strings.TrimPrefix(endpoint, "unix://"))
}

// printable makes a message from a plugin, or about one, safe to store and to
// show (see textsafe): a plugin chooses its GetInfo error and its socket's
// name; neither may reach an operator's terminal raw.
func printable(s string) string { return textsafe.Printable(s, maxErrorMessage) }

// checkField enforces a length limit and printable characters without spaces.
func checkField(name, v string, max int, required bool) error {
	if v == "" {
		if required {
			return fmt.Errorf("%w: %s is empty", errInvalidInfo, name)
		}
		return nil
	}
	if len(v) > max {
		return fmt.Errorf("%w: %s is %d bytes long, at most %d are allowed", errInvalidInfo, name, len(v), max)
	}
	for _, r := range v {
		if r == unicode.ReplacementChar || !unicode.IsPrint(r) || unicode.IsSpace(r) {
			return fmt.Errorf("%w: %s %.64q has a character that is not printable or is a space", errInvalidInfo, name, v)
		}
	}
	return nil
}

// notify tells the plugin whether it was registered. It uses the connection
// GetInfo went over while that is still usable; if the plugin closed it (a
// slow handler let it idle), it dials again rather than fail. conn is
// notify's: it returns the connection it used, open, or nil, and closes any
// other.
func (m *parts) notify(ctx context.Context, conn *unaryconn.Conn, path string, registered bool, reason string) (*unaryconn.Conn, error) {
	if len(reason) > maxErrorMessage {
		reason = reason[:maxErrorMessage]
	}
	// Protobuf strings must be UTF-8, or the message cannot be sent at all;
	// the cut above, or a handler's error, may have broken that.
	reason = strings.ToValidUTF8(reason, "")
	req := &registerapi.RegistrationStatus{PluginRegistered: registered, Error: reason}
	if conn.Usable() {
		err := conn.Invoke(ctx, methodNotify, req, &registerapi.RegistrationStatusResponse{}, maxInfoBytes)
		if err == nil {
			return conn, nil
		}
		if status.Code(err) != codes.Unavailable || ctx.Err() != nil {
			conn.Close()
			return nil, wrapRPC(ctx, "NotifyRegistrationStatus", err)
		}
		// The connection broke under us.
	}
	conn.Close()
	fresh, err := m.dial(ctx, path)
	if err != nil {
		return nil, fmt.Errorf("NotifyRegistrationStatus: %w", err)
	}
	err = fresh.Invoke(ctx, methodNotify, req, &registerapi.RegistrationStatusResponse{}, maxInfoBytes)
	if err != nil {
		fresh.Close()
		return nil, wrapRPC(ctx, "NotifyRegistrationStatus", err)
	}
	return fresh, nil
}

// wrapRPC names the failed call, and prefers the deadline's cause, which says
// how long was waited, to gRPC's generic DeadlineExceeded.
func wrapRPC(ctx context.Context, name string, err error) error {
	if err == nil {
		return nil
	}
	if _, ok := ctx.Deadline(); ok && status.Code(err) == codes.DeadlineExceeded {
		// The plugin's side enforces our deadline too (gRPC sends it along),
		// and may report it a moment before our own context does. The wait is
		// bounded by that same deadline.
		<-ctx.Done()
	}
	if ctx.Err() != nil {
		err = context.Cause(ctx)
	}
	return fmt.Errorf("%s: %w", name, err)
}
