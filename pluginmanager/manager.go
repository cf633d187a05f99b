package pluginmanager

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fsnotify/fsnotify"
	"k8s.io/utils/clock"

	"github.com/plugd/plugd/internal/peercred"
	"github.com/plugd/plugd/pluginmanager/internal/queue"
)

// Manager discovers plugins' registration sockets in a directory, registers each
// with the handler for its type, and lets it go when its socket disappears.
// Create one with New, add handlers with AddHandler, and start it with Run.
//
// Inside, events are hints: the directory's watch, a plugin's connection
// hanging up, AddHandler and the time a retry or a probe falls due only put
// a socket's path in the queue. A worker takes the path and reconciles it:
// it reads the file there and the entry the registry has for it, does the
// one thing needed (register, probe, take back, forget), and returns when to
// look again, which the queue, the one owner of time, holds.
type Manager struct {
	opts    Options
	log     *slog.Logger
	clock   clock.WithTickerAndDelayedExecution
	queue   *queue.Queue
	events  *broker
	reg     *registry
	table   *handlerTable
	sandbox *sandbox
	client  *client
	metrics *metrics
	rec     reconciler
	// dirUntrusted is set while the registry directory, made again since
	// Run started, is not safe from other users (watcher.trusted): its
	// sockets are let go meanwhile.
	dirUntrusted atomic.Bool
	started      atomic.Bool
	synced       chan struct{} // closed after the first walk of the directory
	rescan       chan struct{} // asks the watcher for a walk of the directory
	mounts       chan struct{} // tells the watcher the mounts on the way to the directory or below it changed
}

// reconciler is one way of running the manager over the same parts:
// registering plugins (registrar, the default) or only looking at them
// (onlooker, Options.Observe).
type reconciler interface {
	// reconcile brings the socket at path in line with the file there now.
	// Only one worker runs it for a path at a time.
	reconcile(ctx context.Context, path string) result
	// states are the states this way of running reports.
	states() []State
	// start starts what this way of running needs beside the workers, in
	// wg; stop ends it, once the workers have stopped.
	start(wg *sync.WaitGroup) error
	stop(ctx context.Context)
}

// result is what one reconcile decided: when to look at the socket again
// (zero: not until something changes), and, if the look failed, why; a
// terminal failure (Rejected) is counted, not retried. The events of the
// change it recorded last are published once the next look is scheduled,
// so that a test that advances the clock on seeing one is exact.
type result struct {
	at       time.Time
	err      error
	terminal bool
	events   []Event
}

// New returns a Manager for opts, or an error naming the option that is wrong.
// Nothing runs until Run.
func New(opts Options) (*Manager, error) {
	o, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	if o.Dir, err = filepath.Abs(o.Dir); err != nil {
		return nil, fmt.Errorf("pluginmanager: Options.Dir: %w", err)
	}
	m := &Manager{
		opts:    o,
		log:     o.Logger,
		clock:   o.Clock,
		table:   newHandlerTable(),
		metrics: newMetrics(),
		queue:   queue.New(o.Clock),
		events:  newBroker(o.EventBuffer, o.EventHistory),
		synced:  make(chan struct{}),
		rescan:  make(chan struct{}, 1),
		mounts:  make(chan struct{}, 1),
	}
	m.reg = newRegistry(m.events, m.metrics, m.table, m.log, o.MaxSockets, m.askRescan)
	m.sandbox = newSandbox(o.HandlerTimeout, m.log, m.queue.Add)
	m.client = newClient(o, m.metrics, m.queue.Add)
	if o.Observe {
		m.rec = &onlooker{opts: &m.opts, log: m.log, clock: m.clock, reg: m.reg, table: m.table, sandbox: m.sandbox,
			client: m.client, metrics: m.metrics, queue: m.queue.Add, roots: resolveRoots(o.EndpointRoots)}
	} else {
		m.rec = &registrar{opts: &m.opts, log: m.log, clock: m.clock, reg: m.reg, table: m.table, sandbox: m.sandbox,
			client: m.client, metrics: m.metrics, queue: m.queue, policy: newPolicy(o), delays: m.client.delays,
			dirUntrusted: &m.dirUntrusted}
	}
	if o.Registerer != nil {
		if err := m.registerMetrics(o.Registerer); err != nil {
			return nil, fmt.Errorf("pluginmanager: registering metrics: %w", err)
		}
	}
	return m, nil
}

// AddHandler makes h the handler for plugins of type typ, with the settings
// of opts (at most one; none means the manager's Options). It may be called
// before or while Run runs, from any goroutine; plugins of that type that
// were rejected for want of a handler are tried again at once. It panics if
// typ is empty, h is nil, typ already has a handler, or opts are out of
// range, as http.ServeMux.Handle does.
func (m *Manager) AddHandler(typ string, h Handler, opts ...HandlerOptions) {
	if typ == "" {
		panic("pluginmanager: AddHandler with an empty plugin type")
	}
	if h == nil {
		panic("pluginmanager: AddHandler with a nil handler for type " + typ)
	}
	if len(opts) > 1 {
		panic("pluginmanager: AddHandler with more than one HandlerOptions for type " + typ)
	}
	he := &handlerEntry{h: h, grace: m.opts.UnhealthyGrace, probe: m.opts.ProbeInterval, peers: m.opts.AllowedPeers}
	if len(opts) == 1 {
		o := opts[0]
		if o.UnhealthyGrace != 0 {
			he.grace = o.UnhealthyGrace
		}
		if o.ProbeInterval != 0 {
			he.probe = o.ProbeInterval
		}
		if o.AllowedPeers != nil {
			if !peercred.Supported {
				panic("pluginmanager: AddHandler for type " + typ + ": HandlerOptions.AllowedPeers cannot be enforced on " + runtime.GOOS + ", which does not tell who listens on a unix socket")
			}
			he.peers = o.AllowedPeers
		}
		he.deregisterWithRegistrar = o.DeregisterWithRegistrar
	}
	if !m.table.add(typ, he) {
		panic("pluginmanager: AddHandler called twice for type " + typ)
	}
	m.reg.lock()
	defer m.reg.unlock()
	for path, e := range m.reg.entries {
		if e.status.State == StateRejected && e.status.Reason == ReasonNoHandler && e.status.Type == typ {
			m.queue.Add(path)
		}
	}
}

// AddObserver makes o the observer of plugins of type typ, which a manager
// observing (Options.Observe) asks to look at each plugin of the type after
// its GetInfo; a manager that registers plugins does not use it. It may be
// called before or while Run runs, from any goroutine. It panics if typ is
// empty, o is nil, or typ already has an observer.
func (m *Manager) AddObserver(typ string, o Observer) {
	if typ == "" {
		panic("pluginmanager: AddObserver with an empty plugin type")
	}
	if o == nil {
		panic("pluginmanager: AddObserver with a nil observer for type " + typ)
	}
	if !m.table.addObserver(typ, o) {
		panic("pluginmanager: AddObserver called twice for type " + typ)
	}
}

// Plugins returns a snapshot of every socket the manager knows, sorted by
// socket path. It is safe to call at any time from any goroutine.
func (m *Manager) Plugins() []PluginStatus { return m.reg.plugins() }

// Subscribe starts a stream of the events from now on. Events are never held
// back for a slow subscriber: one that falls more than Options.EventBuffer
// behind loses events and then receives an EventLost saying how many. Close
// the subscription when done; its channel is also closed when Run returns.
// It is safe to call from any goroutine, before, during or after Run.
func (m *Manager) Subscribe() *Subscription {
	return m.events.subscribe(0)
}

// SubscribeWithReplay is Subscribe, with the stream starting with up to n of
// the most recent events (at most Options.EventHistory are kept), in order and
// without a gap before the live ones.
func (m *Manager) SubscribeWithReplay(n int) *Subscription {
	return m.events.subscribe(max(n, 0))
}

// Synced is closed once the manager has walked the registry directory for the
// first time after Run started: every socket present then is in Plugins
// (though not necessarily registered yet). A readiness probe waits for it. It
// is never closed if Run fails before that walk.
func (m *Manager) Synced() <-chan struct{} {
	return m.synced
}

// Run watches the directory and registers plugins until ctx is done. It
// returns nil then, after every goroutine it started has exited, or an error
// if the directory cannot be created or watched. It may be called once.
//
// The one exception is a handler call that ignores its context: Run waits for
// it for Options.HandlerTimeout, then returns without it (and logs so).
func (m *Manager) Run(ctx context.Context) error {
	if !m.started.CompareAndSwap(false, true) {
		return errors.New("pluginmanager: Run may be called only once per Manager")
	}
	defer m.events.shutdown()
	defer m.queue.ShutDown()                         // also on an early return: nothing fires after Run
	ctx = context.WithValue(ctx, lifetimeKey{}, ctx) // for kubelet handlers

	dir := m.opts.Dir
	if m.opts.Observe {
		// An observer changes nothing, not even by creating the directory.
		if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
			return fmt.Errorf("pluginmanager: observing %s: it is not a directory (%v); an observer never creates it: point Options.Dir at the directory the other manager watches", dir, err)
		}
	} else if err := os.MkdirAll(dir, 0o750); err != nil {
		return fmt.Errorf("pluginmanager: creating the registry directory: %w", err)
	}
	if _, err := os.Stat(dir); err != nil {
		return fmt.Errorf("pluginmanager: the registry directory: %w", err)
	}
	if err := m.checkDirTrust(dir); err != nil {
		return err
	}
	// The buffer absorbs bursts of sockets while the watch loop is busy.
	w, err := fsnotify.NewBufferedWatcher(4096)
	if err != nil {
		return fmt.Errorf("pluginmanager: starting the filesystem watch: %w", err)
	}
	if err := w.Add(dir); err != nil {
		w.Close()
		return fmt.Errorf("pluginmanager: watching %s: %w", dir, err)
	}
	// The parent tells when the directory itself is removed or made again.
	if err := w.Add(filepath.Dir(dir)); err != nil {
		m.log.Warn("cannot watch the registry directory's parent: if the directory is removed and made again, the periodic resync will find it",
			"dir", dir, "err", err)
	}

	stopMounts, err := watchMounts(dir, func() {
		select {
		case m.mounts <- struct{}{}:
		default:
		}
	}, m.log)
	if err != nil {
		m.log.Warn("cannot watch the mount table: a mount over a directory of sockets, or its umount, is seen at the next resync", "err", err)
		stopMounts = func() {}
	}
	defer stopMounts()

	var wg sync.WaitGroup
	if err := m.rec.start(&wg); err != nil {
		w.Close()
		return err
	}
	wg.Go(m.queue.Run)
	var workers sync.WaitGroup
	for range m.opts.Workers {
		workers.Go(func() { m.work(ctx) })
	}
	workers.Go(func() { m.newWatcher(w).run(ctx) })
	m.log.Info("plugin manager started", "dir", dir, "workers", m.opts.Workers)

	<-ctx.Done()
	m.queue.ShutDown()
	w.Close()
	workers.Wait()
	m.rec.stop(ctx)
	wg.Wait()
	m.client.dir.Close()
	m.log.Info("plugin manager stopped")
	return nil
}

// work takes paths from the queue and reconciles them, until the queue is
// shut down.
func (m *Manager) work(ctx context.Context) {
	for {
		path, ok := m.queue.Get()
		if !ok {
			return
		}
		res := m.rec.reconcile(ctx, path)
		m.queue.Schedule(path, res.at)
		for _, ev := range res.events {
			m.events.publish(ev)
		}
		if res.err != nil && m.log.Enabled(ctx, slog.LevelDebug) {
			m.logFailedLook(path, res)
		}
		m.queue.Done(path)
	}
}

// logFailedLook logs, at debug level, a look at path that failed. Failures
// are logged where they are recorded, once per change; this is every failed
// look, with what comes of it. (Apart from work, so that its arguments are
// not on the stack under every registration.)
func (m *Manager) logFailedLook(path string, res result) {
	m.log.Debug("reconcile failed", "socket", path, "terminal", res.terminal, "next", res.at, "err", printable(res.err.Error()))
}

// askRescan asks the watcher for a walk of the directory. It never blocks.
func (m *Manager) askRescan() {
	select {
	case m.rescan <- struct{}{}:
	default:
	}
}
