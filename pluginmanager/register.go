package pluginmanager

import (
	"context"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"unicode"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"

	"github.com/plugd/plugd/internal/textsafe"
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

// connect opens a gRPC connection to the unix socket at path and waits, until
// ctx is done, for it to be ready. A refused connection fails at once with the
// dialer's error.
func connect(ctx context.Context, path string) (*grpc.ClientConn, error) {
	conn, _, err := connectPeer(ctx, path)
	return conn, err
}

// peer is who listens on a socket, as the kernel says (SO_PEERCRED).
type peer struct {
	pid, uid, gid uint32
	known         bool
}

// connectPeer is connect, also reporting who listens on the socket.
func connectPeer(ctx context.Context, path string) (*grpc.ClientConn, peer, error) {
	var (
		mu      sync.Mutex
		dialErr error
		who     peer
	)
	dialer := func(ctx context.Context, _ string) (net.Conn, error) {
		var d net.Dialer
		c, err := d.DialContext(ctx, "unix", path)
		mu.Lock()
		defer mu.Unlock()
		if err != nil {
			dialErr = err
			return nil, err
		}
		who = peerOf(c)
		return c, nil
	}
	// The dialer ignores the target, so a constant one keeps a path that
	// gRPC would parse (a '?', a '#', a control character) out of its way.
	conn, err := grpc.NewClient("passthrough:///registration-socket",
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithAuthority("localhost"),
		grpc.WithContextDialer(dialer),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(maxInfoBytes)),
	)
	if err != nil {
		return nil, peer{}, fmt.Errorf("connect %s: %w", path, err)
	}
	conn.Connect()
	for {
		s := conn.GetState()
		switch s {
		case connectivity.Ready:
			mu.Lock()
			defer mu.Unlock()
			return conn, who, nil
		case connectivity.TransientFailure, connectivity.Shutdown:
			conn.Close()
			mu.Lock()
			err := dialErr
			mu.Unlock()
			if err == nil {
				err = errors.New("connection failed")
			}
			return nil, peer{}, fmt.Errorf("connect %s: %w", path, err)
		}
		if !conn.WaitForStateChange(ctx, s) {
			conn.Close()
			return nil, peer{}, fmt.Errorf("connect %s: %w", path, context.Cause(ctx))
		}
	}
}

// peerOf asks the kernel who is at the other end of a unix connection.
func peerOf(c net.Conn) peer {
	uc, ok := c.(*net.UnixConn)
	if !ok {
		return peer{}
	}
	raw, err := uc.SyscallConn()
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

// getInfo asks the plugin who it is.
func getInfo(ctx context.Context, conn *grpc.ClientConn) (*registerapi.PluginInfo, error) {
	info, err := registerapi.NewRegistrationClient(conn).GetInfo(ctx, &registerapi.InfoRequest{})
	return info, wrapRPC(ctx, "GetInfo", err)
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
// GetInfo went over while that is still ready; if a slow handler let it die,
// it dials again rather than fail.
func notify(ctx context.Context, conn *grpc.ClientConn, path string, registered bool, reason string) error {
	if len(reason) > maxErrorMessage {
		reason = reason[:maxErrorMessage]
	}
	// Protobuf strings must be UTF-8, or the message cannot be sent at all;
	// the cut above, or a handler's error, may have broken that.
	reason = strings.ToValidUTF8(reason, "")
	req := &registerapi.RegistrationStatus{PluginRegistered: registered, Error: reason}
	var err error
	if conn.GetState() == connectivity.Ready {
		_, err = registerapi.NewRegistrationClient(conn).NotifyRegistrationStatus(ctx, req)
		if err == nil || status.Code(err) != codes.Unavailable || ctx.Err() != nil {
			return wrapRPC(ctx, "NotifyRegistrationStatus", err)
		}
		// The connection broke under us, which a ready state could not yet show.
	}
	fresh, err := connect(ctx, path)
	if err != nil {
		return fmt.Errorf("NotifyRegistrationStatus: %w", err)
	}
	defer fresh.Close()
	_, err = registerapi.NewRegistrationClient(fresh).NotifyRegistrationStatus(ctx, req)
	return wrapRPC(ctx, "NotifyRegistrationStatus", err)
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
