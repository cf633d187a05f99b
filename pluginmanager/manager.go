package pluginmanager

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fsnotify/fsnotify"
	"k8s.io/utils/clock"

	"github.com/plugd/plugd/internal/backoff"
	"github.com/plugd/plugd/internal/confine"
	"github.com/plugd/plugd/internal/dirtrust"
	"github.com/plugd/plugd/internal/peercred"
	"github.com/plugd/plugd/pluginmanager/internal/connset"
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
	*parts
	queue   *queue.Queue
	events  *broker
	rec     reconciler
	started atomic.Bool
	synced  chan struct{} // closed after the first walk of the directory
	rescan  chan struct{} // asks the watch loop for a walk of the directory
}

// parts are what reconciling needs, shared by both ways of running (see
// reconciler).
type parts struct {
	opts    Options
	log     *slog.Logger
	clock   clock.WithTickerAndDelayedExecution
	reg     *registry
	conns   *connset.Set // the connections held to plugins, by socket path
	hangups hangups      // what conns said of those hung up, until looked at
	table   *handlerTable
	calls   *sandbox
	metrics *metrics
	roots   []string      // Options.EndpointRoots, resolved
	fds     *fdReserve    // the file descriptors kept for new registrations
	late    lateCauses    // why a dial or call ran out of time, made once
	dir     *confine.Root // the registry directory, which connections walk from (see socket)
	// dirUntrusted is set while the registry directory, made again since
	// Run started, is not safe from other users (see Manager.trusted):
	// its sockets are let go meanwhile.
	dirUntrusted atomic.Bool
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
		parts: &parts{
			opts:    o,
			log:     o.Logger,
			clock:   o.Clock,
			table:   newHandlerTable(),
			metrics: newMetrics(),
			roots:   resolveRoots(o.EndpointRoots),
			fds:     &fdReserve{limit: openFileLimit, open: openFiles, now: time.Now},
			late:    lateCausesOf(o),
			dir:     confine.NewRoot(o.Dir),
		},
		queue:  queue.New(o.Clock),
		events: newBroker(o.EventBuffer, o.EventHistory),
		synced: make(chan struct{}),
		rescan: make(chan struct{}, 1),
	}
	m.reg = newRegistry(m.events, m.metrics, m.log, o.MaxSockets, m.askRescan)
	m.calls = newSandbox(o.HandlerTimeout, m.log, m.queue.Add)
	m.conns = connset.New(func(path string, err error) {
		m.hangups.put(path, err)
		m.queue.Add(path)
	})
	if o.Observe {
		m.rec = &onlooker{parts: m.parts, queue: m.queue.Add}
	} else {
		m.rec = &registrar{parts: m.parts, queue: m.queue}
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
		if o.UnhealthyGrace < 0 {
			panic(fmt.Sprintf("pluginmanager: AddHandler for type %s: HandlerOptions.UnhealthyGrace is %s: it must be zero (Options.UnhealthyGrace) or positive", typ, o.UnhealthyGrace))
		}
		if o.UnhealthyGrace > 0 {
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
	m.reg.mu.Lock()
	defer m.reg.mu.Unlock()
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
	workers.Go(func() { m.watch(ctx, m.newWatcher(w)) })
	m.log.Info("plugin manager started", "dir", dir, "workers", m.opts.Workers)

	<-ctx.Done()
	m.queue.ShutDown()
	w.Close()
	workers.Wait()
	m.rec.stop(ctx)
	wg.Wait()
	m.dir.Close()
	m.log.Info("plugin manager stopped")
	return nil
}

// checkDirTrust refuses a registry directory that users other than plugd's
// and root could change (dirtrust.Check says how), unless
// Options.AllowWritableDir accepts that. An observer only warns: the
// directory is the other manager's, which uses it as it is; refusing would
// only blind the observer, and what it reports is what that manager sees.
func (m *Manager) checkDirTrust(dir string) error {
	if m.opts.AllowWritableDir {
		return nil
	}
	err, untrusted := checkDir(dir)
	switch {
	case err == nil:
		return nil
	case !untrusted:
		return fmt.Errorf("pluginmanager: checking who may change the registry directory: %w", err)
	case m.opts.Observe:
		m.log.Warn("the registry directory is not safe from other users: they could plant a plugin there, or replace one, for the manager observed as for plugd; fix it, or set Options.AllowWritableDir to accept it",
			"dir", dir, "err", err)
		return nil
	}
	return fmt.Errorf("pluginmanager: the registry directory %w; or, to accept that, set Options.AllowWritableDir (plugd: policy.allowWritableRegistryDir)", err)
}

// checkDir checks who may change dir (dirtrust.Check, for this process's
// user), and reports whether an error says it is unsafe rather than that it
// could not be checked.
func checkDir(dir string) (err error, untrusted bool) {
	err = dirtrust.Check(dir, os.Geteuid())
	var u *dirtrust.Untrusted
	return err, errors.As(err, &u)
}

// trusted checks the registry directory again, as at Run: removed and made
// again, under a sticky parent such as /tmp, it may be another user's now,
// and what they put in it is not to be registered. While it is not safe,
// its plugins are let go (the registrar takes its sockets as absent) and
// nothing in it is looked at; the next resync after it is fixed finds its
// sockets again. Said once per change. An observer only warns, at Run.
func (m *Manager) trusted() bool {
	if m.opts.Observe || m.opts.AllowWritableDir {
		return true
	}
	err, bad := checkDir(m.opts.Dir) // another error (the directory gone) is the walk's to report
	switch was := m.dirUntrusted.Swap(bad); {
	case bad && !was:
		m.log.Error("the registry directory is no longer safe from other users: letting its plugins go, and registering nothing in it until it is fixed",
			"dir", m.opts.Dir, "err", err)
	case !bad && was:
		m.log.Info("the registry directory is safe again; looking at its sockets", "dir", m.opts.Dir)
	}
	return !bad
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

// askRescan asks the watch loop for a walk of the directory. It never blocks.
func (m *Manager) askRescan() {
	select {
	case m.rescan <- struct{}{}:
	default:
	}
}

// watch turns filesystem events, watch errors and the resync timer into work.
func (m *Manager) watch(ctx context.Context, w *watcher) {
	m.resync(w)
	close(m.synced)
	var tick <-chan time.Time
	if m.opts.ResyncInterval > 0 {
		t := m.clock.NewTicker(m.opts.ResyncInterval)
		defer t.Stop()
		tick = t.C()
	}
	for {
		select {
		case <-ctx.Done():
			return
		case ev, ok := <-w.fs.Events:
			if !ok {
				return
			}
			m.handleFSEvent(w, ev)
		case err, ok := <-w.fs.Errors:
			if !ok {
				return
			}
			if errors.Is(err, fsnotify.ErrEventOverflow) {
				m.log.Warn("filesystem events were lost; rescanning the registry directory", "err", err)
			} else {
				m.log.Error("filesystem watch error; rescanning the registry directory", "err", err)
			}
			m.resync(w)
		case <-tick:
			m.resync(w)
		case <-m.rescan:
			m.resync(w)
		}
	}
}

// resync walks the directory and queues every socket that is new, replaced or
// gone compared with what the manager knows. It is the safety net under the
// watch, so it costs one walk and no RPC.
func (m *Manager) resync(w *watcher) {
	if !m.trusted() {
		m.reg.mu.Lock()
		for path := range m.reg.entries {
			m.queue.Add(path) // let go: see reconcile
		}
		m.reg.mu.Unlock()
		return
	}
	found := make(map[string]fileID)
	if err := w.watchTree(m.opts.Dir, func(path string, id fileID) { found[path] = id }); err != nil {
		m.log.Warn("scanning the registry directory", "dir", m.opts.Dir, "err", err)
	}
	now := m.clock.Now()
	m.reg.mu.Lock()
	defer m.reg.mu.Unlock()
	m.reg.tickLocked(now)
	for path, id := range found {
		e, ok := m.reg.entries[path]
		if !ok {
			// Known from now on (Synced promises it); the worker registers it.
			m.reg.discoverLocked(path, id, nil, now)
		}
		if !ok || e.id != id {
			m.queue.Add(path)
		}
	}
	for path := range m.reg.entries {
		if _, ok := found[path]; !ok {
			m.queue.Add(path)
		}
	}
}

// enqueueUnder queues every known socket below dir, which was removed or renamed.
func (m *Manager) enqueueUnder(dir string) {
	prefix := dir + string(filepath.Separator)
	m.reg.mu.Lock()
	defer m.reg.mu.Unlock()
	for path := range m.reg.entries {
		if strings.HasPrefix(path, prefix) {
			m.queue.Add(path)
		}
	}
}

// newBackoff is the retry delay of a new socket: BackoffInitial, doubled
// for each failure since the socket appeared, up to BackoffMax, with ±20%
// jitter so that plugins that failed together do not retry together.
func (p *parts) newBackoff() backoff.Backoff {
	return backoff.New(p.opts.BackoffInitial, p.opts.BackoffMax, 0.2)
}

// nextDelay is b's next delay, b made (newBackoff) at its first use: most
// sockets never fail, and need none.
func (p *parts) nextDelay(b **backoff.Backoff) time.Duration {
	if *b == nil {
		nb := p.newBackoff()
		*b = &nb
	}
	return (*b).Next()
}
