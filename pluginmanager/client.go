package pluginmanager

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"

	"github.com/plugd/plugd/internal/confine"
	"github.com/plugd/plugd/internal/peercred"
	"github.com/plugd/plugd/internal/unaryconn"
	"github.com/plugd/plugd/pluginmanager/internal/connset"
)

// client is the manager's side of the plugins' Registration service: it
// connects to registration sockets (confined to the registry directory,
// see socket), makes GetInfo and NotifyRegistrationStatus calls, holds the
// connection each registered or observed plugin answered on, idle, to hear
// at once when it is hung up (conns, hangups), and keeps file descriptors
// for new registrations (fds.go). Both ways of running use it; it knows
// nothing of handlers or of the registry, only of the entry whose file it
// connects to and whose connection it holds (entry.live).
type client struct {
	log     *slog.Logger
	metrics *metrics
	top     string        // the registry directory, Options.Dir
	dir     *confine.Root // the registry directory held open, which connections walk from (see socket)
	late    lateCauses    // why a dial or call ran out of time, made once
	delays  delays        // the backoff of connecting again to a plugin

	dialTimeout, getInfoTimeout, notifyTimeout time.Duration

	conns   *connset.Set // the connections held to plugins, by socket path
	hangups hangups      // what conns said of those hung up, until looked at
	fds     *fdReserve   // the file descriptors kept for new registrations
}

// newClient is the client of a manager with options o; queue is told the
// path of every held connection hung up.
func newClient(o Options, m *metrics, queue func(path string)) *client {
	c := &client{
		log:            o.Logger,
		metrics:        m,
		top:            o.Dir,
		dir:            confine.NewRoot(o.Dir),
		late:           lateCausesOf(o),
		delays:         delays{o.BackoffInitial, o.BackoffMax},
		dialTimeout:    o.DialTimeout,
		getInfoTimeout: o.GetInfoTimeout,
		notifyTimeout:  o.NotifyTimeout,
		fds:            &fdReserve{limit: openFileLimit, open: openFiles, now: time.Now},
	}
	c.conns = connset.New(func(path string, err error) {
		c.hangups.put(path, err)
		queue(path)
	})
	return c
}

// lateCauses are the causes of the deadlines of a registration's steps,
// which say how long was waited. They depend only on the options, so they
// are made once, not for every dial and call (a burst makes thousands).
type lateCauses struct {
	dial, getInfo, notify error
	handshake             error // the dial's or GetInfo's, whichever the options make the earlier (handshakeFailure)
}

func lateCausesOf(o Options) lateCauses {
	l := lateCauses{
		dial:    fmt.Errorf("no connection within %s", o.DialTimeout),
		getInfo: fmt.Errorf("no answer within %s", o.GetInfoTimeout),
		notify:  fmt.Errorf("no answer within %s", o.NotifyTimeout),
	}
	l.handshake = l.dial
	if o.GetInfoTimeout < o.DialTimeout {
		l.handshake = l.getInfo
	}
	return l
}

// The registration service's methods, as gRPC names them on the wire.
const (
	methodGetInfo = "/pluginregistration.Registration/GetInfo"
	methodNotify  = "/pluginregistration.Registration/NotifyRegistrationStatus"
)

// dial opens a connection to the registration socket at path, for a call:
// an HTTP/2 connection on which GetInfo, NotifyRegistrationStatus and later
// the liveness probes are made (see unaryconn for why not a grpc-go
// ClientConn). It connects only to the socket file e found there, reached
// from the registry directory without following a symlink (see socket). A
// refused connection fails at once with the dialer's error. The HTTP/2
// handshake is made with the first call (unaryconn.Open), which saves a
// round trip: the first call fails as a dial does (a dialFailure) if the
// handshake does, within DialTimeout from now (see call).
func (c *client) dial(ctx context.Context, e *entry, path string) (*unaryconn.Conn, error) {
	return c.dialRetrying(ctx, e, path, 0, false)
}

// dialNew is dial for a socket that appeared a moment ago, which is most
// likely bound but not listening yet if it refuses: a server's socket file
// appears when it binds, before it listens (node-driver-registrar, and
// net.Listen, do both in place). A refused connection is tried again after
// 1, 2, 4 and 8 ms before it counts. That wait is the plugin's own start-up,
// so it is real time, and it is bounded by the dial's deadline.
func (c *client) dialNew(ctx context.Context, e *entry, path string) (*unaryconn.Conn, error) {
	return c.dialRetrying(ctx, e, path, 4, false)
}

// dialIdle is dial for a connection on which no call is made (it is only
// held, or only shows that the plugin accepts): it returns once the plugin
// has answered with its SETTINGS, within DialTimeout. One that is not
// answered fails at the deadline, with its cause.
func (c *client) dialIdle(ctx context.Context, e *entry, path string) (*unaryconn.Conn, error) {
	return c.dialRetrying(ctx, e, path, 0, true)
}

func (c *client) dialRetrying(ctx context.Context, e *entry, path string, retries int, wait bool) (*unaryconn.Conn, error) {
	ctx, cancel := context.WithTimeoutCause(ctx, c.dialTimeout, c.late.dial)
	defer cancel()
	delay := time.Millisecond
	for {
		nc, err := c.socket(ctx, e, path)
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
func (c *client) socket(ctx context.Context, e *entry, path string) (*net.UnixConn, error) {
	if err := tooLong(path); err != nil {
		return nil, err
	}
	rel, err := relTo(c.top, path)
	if err != nil {
		return nil, err
	}
	return c.dir.Socket(ctx, rel, confine.Identity{Dev: e.id.dev, Ino: e.id.ino})
}

// relTo is path, a socket's below the registry directory dir, relative to
// it. It allocates nothing for a path below dir (clean: filepath.Join made
// it), as every reconcile asks it (subdirsTrusted).
func relTo(dir, path string) (string, error) {
	if rest, ok := strings.CutPrefix(path, dir); ok && len(rest) > 1 && rest[0] == filepath.Separator {
		return rest[1:], nil
	}
	return filepath.Rel(dir, path)
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

// peer is who listens on a socket, as the kernel says (SO_PEERCRED).
type peer struct {
	pid, uid, gid uint32
	known         bool
}

// peerOf asks the kernel who listens on the socket e found at path: on
// conn, the connection its GetInfo was answered on, while that is open, and
// otherwise on a connection of its own, made as every other is.
// It is asked only when a rule needs the answer (AllowedPeers, see
// policy.check): nothing else shows it.
func (c *client) peerOf(ctx context.Context, e *entry, conn *unaryconn.Conn, path string) peer {
	if conn != nil {
		if p, ok := peercred.Of(conn); ok {
			return peer{pid: p.PID, uid: p.UID, gid: p.GID, known: true}
		}
	}
	ctx, cancel := context.WithTimeoutCause(ctx, c.dialTimeout, c.late.dial)
	defer cancel()
	nc, err := c.socket(ctx, e, path)
	if err != nil {
		return peer{}
	}
	defer nc.Close()
	p, ok := peercred.Of(nc)
	return peer{pid: p.PID, uid: p.UID, gid: p.GID, known: ok}
}

// getInfo asks the plugin at path who it is, on conn.
func (c *client) getInfo(ctx context.Context, e *entry, conn *unaryconn.Conn, path string) (*registerapi.PluginInfo, error) {
	info := new(registerapi.PluginInfo)
	if err := c.call(ctx, conn, path, methodGetInfo, &registerapi.InfoRequest{}, info); err != nil {
		if isDialError(err) {
			return nil, err // failed to connect, as it says
		}
		return nil, wrapRPC(ctx, "GetInfo", err)
	}
	return info, nil
}

// call makes one call of the registration service on conn. unaryconn is the
// one transport of calls to plugins, and speaks what every server of the
// interop suite sends (docs/architecture.md says why no other).
func (c *client) call(ctx context.Context, conn *unaryconn.Conn, path, method string, req, resp proto.Message) error {
	err := conn.Invoke(ctx, method, req, resp, maxInfoBytes)
	if errors.Is(err, unaryconn.ErrHandshake) {
		return c.handshakeFailure(ctx, path, err)
	}
	return err
}

// handshakeFailure is the error of a call on a connection from dial whose
// HTTP/2 handshake, made with it, failed: the plugin's server never spoke
// HTTP/2 (it said nothing, hung up, or is not HTTP/2), so it acted on
// nothing, and it failed to connect, as a dial that waited for the
// handshake would have.
//
// A server that took the connection and said nothing fails at a deadline:
// the dial's (DialTimeout, from the dial) or the call's (GetInfoTimeout,
// from a moment later), whichever passes first, which with equal timeouts
// (the defaults) is a matter of microseconds. That is said one way, the
// deadline the options make the earlier, so that the same failure reads the
// same at every attempt: the log warns of a socket's failure only when it
// changes (faillog.go), and 300 silent sockets, said alternately two ways,
// kept it at its cap (issue 25, item 4).
func (c *client) handshakeFailure(ctx context.Context, path string, err error) error {
	switch {
	case errors.Is(err, context.DeadlineExceeded) || errors.Is(ctx.Err(), context.DeadlineExceeded):
		return dialFailure{fmt.Errorf("connect %s: %w: it took the connection and sent no HTTP/2 SETTINGS (%w)", path, c.late.handshake, unaryconn.ErrHandshake)}
	case ctx.Err() != nil:
		err = fmt.Errorf("%w (%w)", context.Cause(ctx), err)
	}
	return dialFailure{fmt.Errorf("connect %s: %w", path, err)}
}

// dialFailure marks an error of a connection step: the plugin was not
// reached, as opposed to a call that it failed.
type dialFailure struct{ error }

func (d dialFailure) Unwrap() error { return d.error }

func isDialError(err error) bool {
	var d dialFailure
	return errors.As(err, &d)
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
func (c *client) notify(ctx context.Context, e *entry, conn *unaryconn.Conn, path string, registered bool, reason string) (used *unaryconn.Conn, told bool, err error) {
	if len(reason) > maxErrorMessage {
		reason = reason[:maxErrorMessage]
	}
	// Protobuf strings must be UTF-8, or the message cannot be sent at all;
	// the cut above, or a handler's error, may have broken that.
	reason = strings.ToValidUTF8(reason, "")
	req := &registerapi.RegistrationStatus{PluginRegistered: registered, Error: reason}
	send := func(conn *unaryconn.Conn) (told, again bool, err error) {
		err = c.call(ctx, conn, path, methodNotify, req, &registerapi.RegistrationStatusResponse{})
		switch {
		case err == nil:
			return true, false, nil
		case errors.Is(err, unaryconn.ErrMaybeDelivered), answered(err):
			return true, false, wrapRPC(ctx, "NotifyRegistrationStatus", err)
		}
		again = status.Code(err) == codes.Unavailable && ctx.Err() == nil
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
	fresh, err := c.dialIdle(ctx, e, path)
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

// ask asks the plugin at path who it is, with GetInfo's deadline: on conn if
// that is open, else on a new connection, which it returns open with the
// answer. A held connection that turns out closed (a plugin's server may
// close idle connections, or be gone) is not an answer: a new one tells
// which.
func (c *client) ask(ctx context.Context, e *entry, path string, conn *unaryconn.Conn) (Plugin, *unaryconn.Conn, error) {
	return c.askNew(ctx, e, path, conn, false)
}

// askNew is ask, dialling with dialNew if fresh: the socket just appeared.
func (c *client) askNew(ctx context.Context, e *entry, path string, conn *unaryconn.Conn, fresh bool) (Plugin, *unaryconn.Conn, error) {
	if conn != nil {
		pl, err := c.askOn(ctx, e, conn, path)
		if err == nil {
			return pl, conn, nil
		}
		// Only a connection the plugin closed is worth another try; a
		// plugin that answered, even with an error, or that let the
		// deadline pass, has said what it has to say.
		closed := !conn.Usable() && status.Code(err) == codes.Unavailable
		conn.Close()
		if !closed || ctx.Err() != nil {
			return Plugin{}, nil, err
		}
	}
	dial := c.dial
	if fresh {
		dial = c.dialNew
	}
	conn, err := dial(ctx, e, path)
	if err != nil {
		return Plugin{}, nil, dialFailure{err}
	}
	pl, err := c.askOn(ctx, e, conn, path)
	if err != nil {
		conn.Close()
		return Plugin{}, nil, err
	}
	return pl, conn, nil
}

// askOn is GetInfo on conn, with its deadline, checked as at registration.
func (c *client) askOn(ctx context.Context, e *entry, conn *unaryconn.Conn, path string) (Plugin, error) {
	infoCtx, cancel := context.WithTimeoutCause(ctx, c.getInfoTimeout, c.late.getInfo)
	defer cancel()
	info, err := c.getInfo(infoCtx, e, conn, path)
	if err != nil {
		return Plugin{}, err
	}
	return pluginFromInfo(info, path)
}

// closeConn closes conn, which may be nil.
func closeConn(conn *unaryconn.Conn) {
	if conn != nil {
		conn.Close()
	}
}

// hold holds conn for path in the connection set, to hear at once when the
// plugin goes; a nil or unusable conn is replaced by a new one, so hold may
// dial. The set owns conn from here. A plugin whose connection may not be
// held (fds.go) is watched by its probes (entry.live.unheld).
func (c *client) hold(ctx context.Context, path string, e *entry, conn *unaryconn.Conn, now time.Time) {
	if e.live.unheld = !c.mayHold(path); e.live.unheld {
		closeConn(conn) // watched by its probes
		return
	}
	if conn == nil || !conn.Usable() {
		closeConn(conn)
		var err error
		if conn, err = c.dialIdle(ctx, e, path); err != nil {
			c.log.Debug("cannot hold the plugin's connection; connecting again at the next look", "socket", path, "err", err)
			e.live.redialAt = now
			if c.outOfFDs(err) {
				e.live.redialAt = now.Add(c.redialDelay(&e.live))
			}
			return
		}
	}
	c.connected()
	if err := c.conns.Watch(path, conn); err != nil {
		c.log.Debug("cannot hold the plugin's connection", "socket", path, "err", err)
	}
}

// redial connects again to a plugin whose connection was hung up, with no
// call: a plugin that accepts is still there. One that does not is tried
// again after a backoff.
func (c *client) redial(ctx context.Context, path string, e *entry, now time.Time) {
	lv := &e.live
	conn, err := c.dialIdle(ctx, e, path)
	if err == nil {
		if lv.unheld = !c.mayHold(path); lv.unheld {
			conn.Close() // it accepts; from now on its probes watch it
		} else {
			err = c.conns.Watch(path, conn)
		}
	}
	if err == nil {
		c.connected()
		if !lv.probeFailed {
			lv.socketErr = nil
		}
		return
	}
	if ctx.Err() != nil {
		return
	}
	lv.redialAt = now.Add(c.redialDelay(lv))
	if c.outOfFDs(err) {
		return // not the plugin's failure
	}
	lv.socketErr = err
}

// redialDelay is the next delay before connecting again to a plugin.
func (c *client) redialDelay(lv *liveness) time.Duration { return c.delays.next(&lv.backoff) }

// watching reports whether a connection to the plugin at path is held.
func (c *client) watching(path string) bool { return c.conns.Watching(path) }

// hangups holds what the connection set said of hung-up connections until
// the worker for each path looks.
type hangups struct {
	mu sync.Mutex
	m  map[string]error
}

func (h *hangups) put(path string, err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.m == nil {
		h.m = make(map[string]error)
	}
	if prev := h.m[path]; prev == nil || !errors.Is(prev, unaryconn.ErrFlood) {
		h.m[path] = err // a flood is not forgotten for a plain hang-up after it
	}
}

func (h *hangups) take(path string) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	err := h.m[path]
	delete(h.m, path)
	return err
}

// replacedDuring is err, the failure of a connection to the socket e found
// at path, or, if that socket is no longer there, an error that says so: not
// the plugin's failure, and the watch reports whatever is there now. Another
// socket in its place (a plugin restarting in place as the connection was
// made) wraps confine.ErrReplaced; the path removed, or now something other
// than a socket, wraps confine.ErrChanged. An error that says so already is
// kept as it is.
func replacedDuring(path string, e *entry, err error) error {
	if errors.Is(err, confine.ErrChanged) {
		return err
	}
	id, ok := statSocket(path)
	switch {
	case ok && id == e.id:
		return err
	case ok:
		return fmt.Errorf("%w, as plugd connected to it (%v)", confine.ErrReplaced, err)
	}
	if _, lerr := os.Lstat(path); errors.Is(lerr, fs.ErrNotExist) {
		return fmt.Errorf("%w, as plugd connected to it (%v)", errRemoved, err)
	}
	return fmt.Errorf("%w: it is no longer a socket (%v)", confine.ErrChanged, err)
}

// errRemoved is the ErrChanged of a socket removed while plugd connected to
// it: a plugin that stops removes its socket, nothing out of the ordinary.
var errRemoved = fmt.Errorf("%w: the socket was removed", confine.ErrChanged)

// logGone says why a socket is let go when connecting to it: a warning for
// a symlink or a file that is not a socket, which no plugin puts in place of
// its socket; only a debug line for another socket, as a plugin restarting
// in place leaves (the watch reports it, and it is discovered afresh).
func logGone(ctx context.Context, log *slog.Logger, path string, e *entry, err error) {
	level := slog.LevelWarn
	if errors.Is(err, confine.ErrReplaced) || errors.Is(err, errRemoved) {
		level = slog.LevelDebug
	}
	log.Log(ctx, level, "the plugin's socket changed while plugd connected to it; not following it, and letting the plugin go",
		"socket", path, "type", e.status.Type, "name", e.status.Name, "err", printable(err.Error()))
}
