package pluginmanager

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"time"
	"unicode"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"

	"github.com/plugd/plugd/internal/confine"
	"github.com/plugd/plugd/internal/dirtrust"
	"github.com/plugd/plugd/internal/peercred"
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

// peerOf asks the kernel who listens on the socket e found at path: on
// conn, the connection its GetInfo was answered on, while that is open, and
// otherwise on a connection of its own (conn is closed once the plugin's
// server is asked with grpc-go instead, see call), made as every other is.
// It is asked only when a rule needs the answer (AllowedPeers, see
// checkPolicy): nothing else shows it.
func (m *parts) peerOf(ctx context.Context, e *entry, conn *unaryconn.Conn, path string) peer {
	if conn != nil {
		if p, ok := peercred.Of(conn); ok {
			return peer{pid: p.PID, uid: p.UID, gid: p.GID, known: true}
		}
	}
	ctx, cancel := context.WithTimeoutCause(ctx, m.opts.DialTimeout, m.late.dial)
	defer cancel()
	nc, err := m.socket(ctx, e, path)
	if err != nil {
		return peer{}
	}
	defer nc.Close()
	p, ok := peercred.Of(nc)
	return peer{pid: p.PID, uid: p.UID, gid: p.GID, known: ok}
}

// dial opens a connection to the registration socket at path, for a call:
// an HTTP/2 connection on which GetInfo, NotifyRegistrationStatus and later
// the liveness probes are made (see unaryconn for why not a grpc-go
// ClientConn). It connects only to the socket file e found there, reached
// from the registry directory without following a symlink (see socket). A
// refused connection fails at once with the dialer's error. The HTTP/2
// handshake is made with the first call (unaryconn.Open), which saves a
// round trip: the first call fails as a dial does (a dialFailure) if the
// handshake does, within DialTimeout from now (see call).
func (m *parts) dial(ctx context.Context, e *entry, path string) (*unaryconn.Conn, error) {
	return m.dialRetrying(ctx, e, path, 0, false)
}

// dialNew is dial for a socket that appeared a moment ago, which is most
// likely bound but not listening yet if it refuses: a server's socket file
// appears when it binds, before it listens (node-driver-registrar, and
// net.Listen, do both in place). A refused connection is tried again after
// 1, 2, 4 and 8 ms before it counts. That wait is the plugin's own start-up,
// so it is real time, and it is bounded by the dial's deadline.
func (m *parts) dialNew(ctx context.Context, e *entry, path string) (*unaryconn.Conn, error) {
	return m.dialRetrying(ctx, e, path, 4, false)
}

// dialIdle is dial for a connection on which no call is made (it is only
// held, or only shows that the plugin accepts): it returns once the plugin
// has answered with its SETTINGS, within DialTimeout. One that is not
// answered fails at the deadline, with its cause.
func (m *parts) dialIdle(ctx context.Context, e *entry, path string) (*unaryconn.Conn, error) {
	return m.dialRetrying(ctx, e, path, 0, true)
}

func (m *parts) dialRetrying(ctx context.Context, e *entry, path string, retries int, wait bool) (*unaryconn.Conn, error) {
	ctx, cancel := context.WithTimeoutCause(ctx, m.opts.DialTimeout, m.late.dial)
	defer cancel()
	delay := time.Millisecond
	for {
		nc, err := m.socket(ctx, e, path)
		if err == nil && !wait {
			dl, _ := ctx.Deadline()
			return unaryconn.Open(nc, dl), nil
		}
		var conn *unaryconn.Conn
		if err == nil {
			conn, err = unaryconn.NewConn(ctx, nc)
		}
		if err == nil {
			return conn, nil
		}
		if retries > 0 && errors.Is(err, syscall.ECONNREFUSED) && ctx.Err() == nil {
			retries--
			t := time.NewTimer(delay)
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
			}
			delay *= 2
			continue
		}
		if ctx.Err() != nil && !errors.Is(err, confine.ErrChanged) {
			err = context.Cause(ctx)
		}
		return nil, fmt.Errorf("connect %s: %w", path, err)
	}
}

// lateCauses are the causes of the deadlines of a registration's steps,
// which say how long was waited. They depend only on the options, so they
// are made once, not for every dial and call (a burst makes thousands).
type lateCauses struct {
	dial, getInfo, notify error
}

func lateCausesOf(o Options) lateCauses {
	return lateCauses{
		dial:    fmt.Errorf("no connection within %s", o.DialTimeout),
		getInfo: fmt.Errorf("no answer within %s", o.GetInfoTimeout),
		notify:  fmt.Errorf("no answer within %s", o.NotifyTimeout),
	}
}

// socket connects to the registration socket at path, and only if it is,
// as it is connected to, the socket file e found there (its device and
// inode), inside the registry directory, reached without following a
// symlink: a plugin that swaps its socket for a symlink after it was found
// (while it answers GetInfo, say) cannot lead a later connection, made as
// root, to a socket of its choosing elsewhere; every (re)connection is
// checked anew. Otherwise the error wraps confine.ErrChanged: the file found
// is gone from the path (gone, for the manager), whatever is there now. A
// socket path too long to connect to by name is refused (see tooLong). The
// walk starts from the registry directory held open (confine.Root), which
// the watch tells to look at the path again when the directory itself is
// replaced.
func (m *parts) socket(ctx context.Context, e *entry, path string) (*net.UnixConn, error) {
	if err := tooLong(path); err != nil {
		return nil, err
	}
	rel, err := m.rel(path)
	if err != nil {
		return nil, err
	}
	return m.dir.Socket(ctx, rel, confine.Identity{Dev: e.id.dev, Ino: e.id.ino})
}

// rel is path, a socket's below the registry directory, relative to it.
// It allocates nothing for a path below Dir (clean: filepath.Join made
// it), as every reconcile asks it (subdirsTrusted).
func (m *parts) rel(path string) (string, error) {
	if rest, ok := strings.CutPrefix(path, m.opts.Dir); ok && len(rest) > 1 && rest[0] == filepath.Separator {
		return rest[1:], nil
	}
	return filepath.Rel(m.opts.Dir, path)
}

// subdirsTrusted reports whether the directories between the registry
// directory and the socket at path are safe from other users as the
// registry directory must be (dirtrust.CheckBelow): a socket in one that is
// not is taken as absent, as the watch leaves it out, and says so
// (watcher.take). Nothing is looked at for a socket in the registry
// directory itself, nor with Options.AllowWritableDir. The directories
// cannot be changed under the check by anyone it protects against: each
// is reached from a safe one, and is safe.
func (m *parts) subdirsTrusted(path string) bool {
	if m.opts.AllowWritableDir {
		return true
	}
	rel, err := m.rel(path)
	if err != nil {
		return false
	}
	dir, uid := m.opts.Dir, os.Geteuid()
	for {
		name, rest, more := strings.Cut(rel, string(filepath.Separator))
		if !more {
			return true
		}
		dir, rel = filepath.Join(dir, name), rest
		if dirtrust.CheckBelow(dir, uid) != nil {
			return false
		}
	}
}

// errTooLong marks a socket path longer than a unix socket's may be.
var errTooLong = errors.New("the socket's path is too long")

// tooLong refuses a socket path longer than confine.MaxPath: neither the
// kubelet nor a plugin's own clients can connect to it by name, so plugd
// does not either (the doctor reports it too), and no retry can change
// that.
func tooLong(path string) error {
	if len(path) <= confine.MaxPath {
		return nil
	}
	return fmt.Errorf("%w: it is %d bytes long, %d more than the %d a unix socket's path may have on %s, and nobody can connect to it by that path; give the registry directory or the socket a shorter name",
		errTooLong, len(path), len(path)-confine.MaxPath, confine.MaxPath, runtime.GOOS)
}

// The registration service's methods, as gRPC names them on the wire.
const (
	methodGetInfo = "/pluginregistration.Registration/GetInfo"
	methodNotify  = "/pluginregistration.Registration/NotifyRegistrationStatus"
)

// getInfo asks the plugin at path who it is, on conn.
func (m *parts) getInfo(ctx context.Context, e *entry, conn *unaryconn.Conn, path string) (*registerapi.PluginInfo, error) {
	info := new(registerapi.PluginInfo)
	if err := m.call(ctx, e, conn, path, methodGetInfo, &registerapi.InfoRequest{}, info, true); err != nil {
		if isDialError(err) {
			return nil, err // failed to connect, as it says
		}
		return nil, wrapRPC(ctx, "GetInfo", err)
	}
	return info, nil
}

// call makes one call of the registration service on conn. When the
// plugin's server answers in a way unaryconn does not speak (ErrProtocol),
// the call is made again with grpc-go, on a connection of its own, before
// the plugin is blamed, and so is every later call to this socket file
// (e.grpcOnly): plugd's own client would only fail again, and a
// NotifyRegistrationStatus that may have been delivered cannot be made
// again. A call that may have been acted on (ErrMaybeDelivered) is made
// again only if it is idempotent: NotifyRegistrationStatus is not.
func (m *parts) call(ctx context.Context, e *entry, conn *unaryconn.Conn, path, method string, req, resp proto.Message, idempotent bool) error {
	if e.grpcOnly {
		return m.callGRPC(ctx, e, path, method, req, resp)
	}
	err := conn.Invoke(ctx, method, req, resp, maxInfoBytes)
	if errors.Is(err, unaryconn.ErrHandshake) {
		return m.handshakeFailure(ctx, path, err)
	}
	if err == nil || !errors.Is(err, unaryconn.ErrProtocol) || ctx.Err() != nil ||
		!idempotent && errors.Is(err, unaryconn.ErrMaybeDelivered) {
		return err
	}
	m.log.Debug("the plugin's server speaks beyond what plugd's own client does; asking it with grpc-go from now on",
		"socket", path, "method", method, "err", printable(err.Error()))
	e.grpcOnly = true
	conn.Close()
	return m.callGRPC(ctx, e, path, method, req, resp)
}

// handshakeFailure is the error of a call on a connection from dial whose
// HTTP/2 handshake, made with it, failed: the plugin's server never spoke
// HTTP/2 (it said nothing, hung up, or is not HTTP/2), so it acted on
// nothing, and it failed to connect, as a dial that waited for the
// handshake would have: said so, with the dial's deadline as its cause if
// that passed.
func (m *parts) handshakeFailure(ctx context.Context, path string, err error) error {
	if errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil {
		err = fmt.Errorf("%w (%w)", m.late.dial, err)
	} else if ctx.Err() != nil {
		err = fmt.Errorf("%w (%w)", context.Cause(ctx), err)
	}
	return dialFailure{fmt.Errorf("connect %s: %w", path, err)}
}

// callGRPC makes a call with grpc-go, on a connection of its own.
func (m *parts) callGRPC(ctx context.Context, e *entry, path, method string, req, resp proto.Message) error {
	dial := func(ctx context.Context) (net.Conn, error) { return m.socket(ctx, e, path) }
	if err := unaryconn.InvokeGRPCWith(ctx, dial, method, req, resp, maxInfoBytes); err != nil {
		return fallbackError{err}
	}
	return nil
}

// fallbackError is the error of a call made again with grpc-go: what that
// said. Whether the plugin received it cannot be told from it.
type fallbackError struct{ error }

func (f fallbackError) Unwrap() error { return f.error }

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
	if len(p.Versions) > maxVersions {
		return p, fmt.Errorf("%w: %d supported versions, at most %d are allowed", errInvalidInfo, len(p.Versions), maxVersions)
	}
	for i, v := range p.Versions {
		if err := checkField("supported_versions", v, maxVersionLen, true); err != nil {
			// Named with its index only when it is wrong: no string is
			// made for every version of every answer.
			return p, checkField(fmt.Sprintf("supported_versions[%d]", i), v, maxVersionLen, true)
		}
	}
	sentNone := p.Endpoint == ""
	if sentNone {
		p.Endpoint = socket
	}
	ep, err := EndpointPath(p.Endpoint)
	if sentNone && err != nil {
		// The plugin sent no endpoint: what is wrong is its socket's name.
		return p, fmt.Errorf("%w: it sent no endpoint, so its registration socket is taken for one, and that cannot be (%w): rename the socket, or send an endpoint", errInvalidInfo, err)
	}
	if err != nil {
		return p, fmt.Errorf("%w: %w", errInvalidInfo, err)
	}
	p.Endpoint = ep
	return p, nil
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
	if !token(v) {
		return fmt.Errorf("%w: %s %.64q has a character that is not printable or is a space", errInvalidInfo, name, v)
	}
	return nil
}

// token says whether v is printable, without spaces: what every field of a
// GetInfo answer must be.
func token(v string) bool {
	for _, r := range v {
		if r == unicode.ReplacementChar || !unicode.IsPrint(r) || unicode.IsSpace(r) {
			return false
		}
	}
	return true
}

// notify tells the plugin whether it was registered, and reports whether
// it was told: it answered (with any status: the DRA helper answers a
// refusal with an error by design, and node-driver-registrar may exit while
// it answers), or the whole request went out before the call failed
// (unaryconn.ErrMaybeDelivered), in which case it may have acted on it and
// is never told again, since one verdict must not reach it twice. Only a
// request that certainly did not reach it (the connection broke before it
// was sent in full, as a slow handler can let it) is sent again, once, on a
// new connection. err says what went wrong either way. conn is notify's: it
// returns the connection it used, open, or nil, and closes any other.
func (m *parts) notify(ctx context.Context, e *entry, conn *unaryconn.Conn, path string, registered bool, reason string) (used *unaryconn.Conn, told bool, err error) {
	if len(reason) > maxErrorMessage {
		reason = reason[:maxErrorMessage]
	}
	// Protobuf strings must be UTF-8, or the message cannot be sent at all;
	// the cut above, or a handler's error, may have broken that.
	reason = strings.ToValidUTF8(reason, "")
	req := &registerapi.RegistrationStatus{PluginRegistered: registered, Error: reason}
	send := func(conn *unaryconn.Conn) (told, again bool, err error) {
		err = m.call(ctx, e, conn, path, methodNotify, req, &registerapi.RegistrationStatusResponse{}, false)
		switch {
		case err == nil:
			return true, false, nil
		case errors.Is(err, unaryconn.ErrMaybeDelivered), answered(err):
			return true, false, wrapRPC(ctx, "NotifyRegistrationStatus", err)
		}
		var f fallbackError
		again = !errors.As(err, &f) && status.Code(err) == codes.Unavailable && ctx.Err() == nil
		return false, again, wrapRPC(ctx, "NotifyRegistrationStatus", err)
	}
	if conn.Usable() {
		told, again, err := send(conn)
		if err == nil {
			return conn, true, nil
		}
		if told || !again {
			conn.Close()
			return nil, told, err
		}
		// The connection broke before the request was out: it was not told.
	}
	conn.Close()
	// Handshake first, not with the request: a server silent at the
	// deadline might yet act on a request sent with the preface, and the
	// plugin must not be told twice.
	fresh, err := m.dialIdle(ctx, e, path)
	if err != nil {
		return nil, false, fmt.Errorf("NotifyRegistrationStatus: %w", err)
	}
	told, _, err = send(fresh)
	if err != nil {
		fresh.Close()
		return nil, told, err
	}
	return fresh, true, nil
}

// answered reports whether err is the plugin's own answer to a call (a
// status in its trailers, or an HTTP status), rather than the call failing
// on the way: then the plugin received the request.
func answered(err error) bool {
	if isDialError(err) {
		return false
	}
	var f fallbackError
	if errors.As(err, &f) {
		// grpc-go's error: a code the transport does not give is the plugin's.
		switch status.Code(err) {
		case codes.Unavailable, codes.DeadlineExceeded, codes.Canceled, codes.Internal, codes.ResourceExhausted:
			return false
		}
		return true
	}
	for _, kind := range []error{unaryconn.ErrProtocol, unaryconn.ErrHangup, unaryconn.ErrMaybeDelivered, unaryconn.ErrFlood, context.DeadlineExceeded, context.Canceled} {
		if errors.Is(err, kind) {
			return false
		}
	}
	return true
}

// wrapRPC names the failed call, and prefers the deadline's cause, which says
// how long was waited, to gRPC's generic DeadlineExceeded.
func wrapRPC(ctx context.Context, name string, err error) error {
	if err == nil {
		return nil
	}
	if isDialError(err) {
		return fmt.Errorf("%s: %w", name, err) // it says what passed
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
