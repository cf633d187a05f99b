// Package endpointwatch holds an idle connection to a plugin's own gRPC
// endpoint (a CSI driver's socket, a DRA or device plugin service) and says
// when the endpoint stops serving and when it serves again, for a handler
// to pass on to the manager (pluginmanager.EndpointReporter).
//
// It is the manager's way with registration sockets, applied to endpoints:
// an HTTP/2 connection kept open with no call on it (internal/unaryconn's
// Watch, by the handler's Poller: in one epoll set on Linux, a goroutine
// each elsewhere), whose
// hang-up is the word that the endpoint's process went. It then connects
// again with backoff, and a connection that is accepted (and passes the
// handler's check, if it gives one) means the endpoint serves again.
// Nothing is asked of the endpoint but for that check, so nothing shows in
// its log.
package endpointwatch

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/plugd/plugd/internal/backoff"
	"github.com/plugd/plugd/internal/unaryconn"
)

// Options configure a Watch. Report is required; the zero value of the
// others means the default written beside them.
type Options struct {
	// Report is told that the endpoint stopped serving (an error saying
	// why), or serves again (nil). It is called from the watch's own
	// goroutines, one call at a time, never after Stop returns; it must
	// not block for long.
	Report func(err error)
	// Check, if set, is run after each reconnection, with a deadline of
	// Timeout: the endpoint serves again only if it returns nil (a handler
	// refreshes what it knows of the plugin here, e.g. a CSI driver's node
	// ID). Its error is reported, and the endpoint tried again later.
	Check func(ctx context.Context) error
	// Timeout bounds each connection attempt, and Check. Zero means 5s.
	Timeout time.Duration
	// Dial connects to the endpoint's unix socket, at Start and at every
	// reconnection (a handler confining endpoints to its roots checks them
	// again here). Nil dials the path as it is.
	Dial func(ctx context.Context, path string) (net.Conn, error)
	// Backoff and BackoffMax are the first delay before connecting again
	// after the endpoint went, and its cap, which it doubles to after each
	// failed attempt. Zero means 250ms and 10s.
	Backoff, BackoffMax time.Duration
	// Poller watches the connection held: the handler's, which it closes
	// once it has stopped its watches, so that one epoll set serves all
	// its endpoints. Nil means one of the watch's own, closed by Stop.
	// Once Poller is closed, the watch ends as Stop ends it, with no report.
	Poller *unaryconn.Poller
}

// Watch is the watch of one endpoint. Make one with Start; end it with
// Stop. Its methods are safe for concurrent use.
type Watch struct {
	path string
	opts Options
	own  *unaryconn.Poller // opts.Poller if the watch made it, closed by Stop
	life context.Context   // Start's values, cancelled by Stop
	end  context.CancelFunc

	mu      sync.Mutex
	stopped bool
	conn    *unaryconn.Conn
	timer   *time.Timer
	retry   backoff.Backoff
	upAt    time.Time      // when the connection held was made
	running sync.WaitGroup // reports and reconnections under way
}

// Start connects to the endpoint at path (a unix socket path, as
// pluginmanager.EndpointPath gives it: the handlers' Plugins carry it) within ctx and opts.Timeout, holds the connection, and reports
// that it serves. It fails, reporting nothing, if the endpoint does not
// accept the connection.
func Start(ctx context.Context, path string, opts Options) (*Watch, error) {
	if opts.Timeout <= 0 {
		opts.Timeout = 5 * time.Second
	}
	if opts.Backoff <= 0 {
		opts.Backoff = 250 * time.Millisecond
	}
	if opts.BackoffMax <= 0 {
		opts.BackoffMax = 10 * time.Second
	}
	w := &Watch{path: path, opts: opts}
	w.retry = backoff.New(opts.Backoff, opts.BackoffMax, 0.2)
	conn, err := w.dial(ctx)
	if err != nil {
		return nil, err
	}
	if w.opts.Poller == nil {
		w.own = unaryconn.NewPoller(unaryconn.PollerOptions{})
		w.opts.Poller = w.own
	}
	// Reconnections outlive the call that started the watch.
	w.life, w.end = context.WithCancel(context.WithoutCancel(ctx))
	w.running.Add(1)
	defer w.running.Done()
	w.hold(conn)
	return w, nil
}

func (w *Watch) dial(ctx context.Context) (*unaryconn.Conn, error) {
	ctx, cancel := context.WithTimeoutCause(ctx, w.opts.Timeout, fmt.Errorf("no connection within %s", w.opts.Timeout))
	defer cancel()
	conn, err := w.connect(ctx)
	if err != nil {
		if ctx.Err() != nil {
			err = context.Cause(ctx)
		}
		return nil, fmt.Errorf("endpoint %s: %w", w.path, err)
	}
	return conn, nil
}

func (w *Watch) connect(ctx context.Context) (*unaryconn.Conn, error) {
	if w.opts.Dial == nil {
		return unaryconn.Dial(ctx, w.path)
	}
	nc, err := w.opts.Dial(ctx, w.path)
	if err != nil {
		return nil, err
	}
	uc, ok := nc.(*net.UnixConn)
	if !ok {
		nc.Close()
		return nil, fmt.Errorf("not a unix socket connection (%T)", nc)
	}
	return unaryconn.NewConn(ctx, uc)
}

// hold watches conn and reports the endpoint serving, unless Stop came
// first. The caller counts in w.running.
func (w *Watch) hold(conn *unaryconn.Conn) {
	w.mu.Lock()
	if w.stopped {
		w.mu.Unlock()
		conn.Close()
		return
	}
	w.conn = conn
	w.upAt = time.Now()
	w.mu.Unlock()
	// Before the watch starts: its hang-up, reported from the watch's
	// goroutine, comes after.
	w.opts.Report(nil)
	err := conn.Watch(w.opts.Poller, w.hungUp)
	if errors.Is(err, unaryconn.ErrPollerClosed) {
		// The handler is closing: nothing more to watch, or to report.
		w.mu.Lock()
		w.stopped, w.conn = true, nil
		w.mu.Unlock()
		conn.Close()
		return
	}
	if err != nil {
		w.lost(fmt.Errorf("endpoint %s: %w", w.path, err))
	}
}

// hungUp is the held connection's end: the endpoint is reported down, and
// connected to again after a backoff.
func (w *Watch) hungUp(err error) {
	if !w.enter() {
		return
	}
	defer w.running.Done()
	w.lost(fmt.Errorf("endpoint %s: %w", w.path, err))
}

// enter counts a report or reconnection in w.running, unless Stop was
// called; the caller then calls w.running.Done.
func (w *Watch) enter() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.stopped {
		return false
	}
	w.running.Add(1)
	return true
}

// lost reports err and schedules the next attempt, unless Stop was called:
// the connection Stop closes fails its Watch, or hangs up, after Stop
// marked the watch stopped, and that is no news to report. The caller counts
// in w.running.
func (w *Watch) lost(err error) {
	w.mu.Lock()
	stopped := w.stopped
	w.mu.Unlock()
	if stopped {
		return
	}
	w.opts.Report(err)
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.stopped {
		return
	}
	// Only a connection that stayed up (longer than the backoff's cap)
	// starts the backoff again: an endpoint that accepts and hangs up at
	// once, or floods (unaryconn.ErrFlood), is not dialled four times a
	// second, as the manager does with registration sockets.
	if w.conn != nil && time.Since(w.upAt) > w.opts.BackoffMax && !errors.Is(err, unaryconn.ErrFlood) {
		w.retry.Reset()
	}
	w.conn = nil
	w.timer = time.AfterFunc(w.retry.Next(), w.reconnect)
}

// reconnect tries the endpoint again.
func (w *Watch) reconnect() {
	if !w.enter() {
		return
	}
	defer w.running.Done()
	conn, err := w.dial(w.life)
	if err == nil && w.opts.Check != nil {
		ctx, cancel := context.WithTimeoutCause(w.life, w.opts.Timeout, fmt.Errorf("check not done within %s", w.opts.Timeout))
		err = w.opts.Check(ctx)
		cancel()
		if err != nil {
			conn.Close()
		}
	}
	if err != nil {
		if w.life.Err() == nil {
			w.lost(err)
		}
		return
	}
	w.hold(conn)
}

// Stop ends the watch and closes its connection. Report is not called once
// it has returned. It may be called more than once.
func (w *Watch) Stop() {
	if w == nil {
		return
	}
	w.mu.Lock()
	w.stopped = true
	if w.timer != nil {
		w.timer.Stop()
	}
	conn := w.conn
	w.conn = nil
	w.mu.Unlock()
	w.end() // cuts a reconnection under way short
	if conn != nil {
		conn.Close()
	}
	w.running.Wait()
	if w.own != nil {
		w.own.Close()
	}
}
