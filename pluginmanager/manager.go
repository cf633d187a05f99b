package pluginmanager

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/fsnotify/fsnotify"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/plugd/plugd/internal/backoff"
	"github.com/plugd/plugd/internal/unaryconn"
)

// Manager discovers plugins' registration sockets in a directory, registers each
// with the handler for its type, and lets it go when its socket disappears.
// Create one with New, add handlers with AddHandler, and start it with Run.
type Manager struct {
	opts    Options
	log     *slog.Logger
	queue   *queue
	events  *broker
	metrics *metrics
	started atomic.Bool
	hangups *hangups      // nil unless liveness is on; set by Run before its goroutines start
	synced  chan struct{} // closed after the first walk of the directory

	// calls counts handler calls still running, including abandoned ones.
	calls sync.WaitGroup

	mu               sync.Mutex
	handlers         map[string]Handler
	entries          map[string]*entry   // by socket path: what is on disk, and what is registered
	batches          map[int64][]batched // routine probes, by the step they are due at the end of
	lastLimitWarning time.Time           // when the MaxSockets limit was last logged
	discoveries      uint64              // socket files discovered so far: each entry's seq
	overLimit        bool                // sockets were left untracked: look again when one goes
	rescan           chan struct{}       // asks the watch loop for a walk of the directory
	roots            []string            // Options.EndpointRoots, resolved
}

// entry is one socket path: the file found there (desired state), the
// registration the handler holds for it (actual state), and what the manager
// reports. Only the worker holding the path in the queue changes id and reg;
// everything is read and written under Manager.mu.
type entry struct {
	id        fileID
	seq       uint64        // when the file was discovered, in discoveries (see markNewest)
	reg       *registration // nil unless the handler holds this socket's plugin
	status    PluginStatus
	retry     *time.Timer     // pending retry of a Failed socket
	backoff   backoff.Backoff // the delay of the next retry; reset when the socket is re-created
	busy      bool            // an abandoned handler call for this socket is still running
	probe     *time.Timer     // next liveness probe of a registered plugin, unless batched
	probeStep int64           // the step whose batch holds e's next probe (see scheduleProbeLocked); 0 if none
	hang      *hangup         // an idle connection that tells when the plugin's process goes
	probeDue  bool            // the probe timer fired: the worker probes instead of reconciling
}

// registration is what was handed to a handler, kept to take it back.
type registration struct {
	id      fileID
	plugin  Plugin
	handler Handler
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
		opts:     o,
		log:      o.Logger,
		queue:    newQueue(),
		events:   newBroker(o.EventBuffer, o.EventHistory),
		synced:   make(chan struct{}),
		metrics:  newMetrics(),
		handlers: make(map[string]Handler),
		entries:  make(map[string]*entry),
		batches:  make(map[int64][]batched),
		roots:    resolveRoots(o.EndpointRoots),
		rescan:   make(chan struct{}, 1),
	}
	if o.Registerer != nil {
		if err := m.registerMetrics(o.Registerer); err != nil {
			return nil, fmt.Errorf("pluginmanager: registering metrics: %w", err)
		}
	}
	return m, nil
}

// AddHandler makes h the handler for plugins of type typ. It may be called
// before or while Run runs, from any goroutine; plugins of that type that were
// rejected for want of a handler are tried again at once. It panics if typ is
// empty, h is nil, or typ already has a handler, as http.ServeMux.Handle does.
func (m *Manager) AddHandler(typ string, h Handler) {
	if typ == "" {
		panic("pluginmanager: AddHandler with an empty plugin type")
	}
	if h == nil {
		panic("pluginmanager: AddHandler with a nil handler for type " + typ)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, dup := m.handlers[typ]; dup {
		panic("pluginmanager: AddHandler called twice for type " + typ)
	}
	m.handlers[typ] = h
	for path, e := range m.entries {
		if e.status.State == StateRejected && e.status.Reason == ReasonNoHandler && e.status.Type == typ {
			m.queue.add(path)
		}
	}
}

// Plugins returns a snapshot of every socket the manager knows, sorted by
// socket path. It is safe to call at any time from any goroutine.
func (m *Manager) Plugins() []PluginStatus {
	m.mu.Lock()
	out := make([]PluginStatus, 0, len(m.entries))
	order := make(map[string]uint64, len(m.entries))
	for path, e := range m.entries {
		s := e.status
		s.Versions = slices.Clone(s.Versions)
		out = append(out, s)
		order[path] = e.seq
	}
	m.mu.Unlock()
	slices.SortFunc(out, func(a, b PluginStatus) int { return strings.Compare(a.Socket, b.Socket) })
	markNewest(out, order)
	return out
}

// markNewest marks the newest registered socket of each (type, name) in ps:
// the one whose file was made last, and of files made at the same time, the
// one discovered last (order holds each socket's place in the order of
// discovery). Birth times tie more often than one would think: a
// filesystem stamps a new file with a clock that ticks once per scheduler
// tick (1-10 ms) unless someone has just asked for a fine-grained time, so
// an old and a new instance of a plugin started within one tick are born at
// the same nanosecond, and the socket path alone would then pick one.
func markNewest(ps []PluginStatus, order map[string]uint64) {
	type key struct{ typ, name string }
	newest := make(map[key]int)
	for i, s := range ps {
		if s.State != StateRegistered {
			continue
		}
		k := key{s.Type, s.Name}
		// The newest socket, not the latest registration: an old instance
		// registered again after a blip must not look like the new one.
		j, ok := newest[k]
		if !ok || s.Created.After(ps[j].Created) || s.Created.Equal(ps[j].Created) && order[s.Socket] > order[ps[j].Socket] {
			newest[k] = i
		}
	}
	for _, i := range newest {
		ps[i].Newest = true
	}
}

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

	dir := m.opts.Dir
	if m.opts.Observe {
		// An observer changes nothing, not even by creating the directory.
		if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
			return fmt.Errorf("pluginmanager: observing %s: it is not a directory (%v); an observer never creates it: point Options.Dir at the directory the other manager watches", dir, err)
		}
	} else if err := os.MkdirAll(dir, 0o750); err != nil {
		return fmt.Errorf("pluginmanager: creating the registry directory: %w", err)
	}
	if fi, err := os.Stat(dir); err != nil {
		return fmt.Errorf("pluginmanager: the registry directory: %w", err)
	} else if fi.Mode().Perm()&0o022 != 0 && !m.opts.AllowWritableDir && !m.opts.Observe {
		return fmt.Errorf("pluginmanager: the registry directory %s is writable by users other than its owner (mode %v): they could put a socket there or replace a plugin's; remove that permission (chmod go-w %s), or set Options.AllowWritableDir",
			dir, fi.Mode().Perm(), dir)
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
	if m.opts.ProbeInterval >= 0 && !m.opts.Observe {
		h, err := newHangups(m.hungUp)
		if err != nil {
			w.Close()
			return fmt.Errorf("pluginmanager: watching plugins' connections: %w", err)
		}
		m.hangups = h
		wg.Go(h.run)
		defer h.release()
	}
	for range m.opts.Workers {
		wg.Go(func() { m.work(ctx) })
	}
	wg.Go(func() { m.watch(ctx, newWatcher(w)) })
	m.log.Info("plugin manager started", "dir", dir, "workers", m.opts.Workers)

	<-ctx.Done()
	m.queue.close()
	w.Close()
	if m.hangups != nil {
		m.hangups.close()
	}
	wg.Wait()
	m.shutdown(ctx)
	m.log.Info("plugin manager stopped")
	return nil
}

// shutdown runs after the workers have stopped: no retry fires any more,
// handler calls are given a bounded time to return, and registrations are
// dropped only if asked to.
func (m *Manager) shutdown(ctx context.Context) {
	m.mu.Lock()
	for _, e := range m.entries {
		m.stopTimers(e)
	}
	m.mu.Unlock()

	m.waitCalls(m.opts.HandlerTimeout)

	if !m.opts.DeregisterOnShutdown {
		return
	}
	// ctx is done; the deregistrations need a live context of their own, and
	// share one deadline, so that shutdown takes one HandlerTimeout at most
	// however many plugins there are.
	ctx, cancel := context.WithTimeoutCause(context.WithoutCancel(ctx), m.opts.HandlerTimeout,
		fmt.Errorf("shutdown: deregistration did not finish within %s", m.opts.HandlerTimeout))
	defer cancel()
	m.mu.Lock()
	var held []*entry
	for _, e := range m.entries {
		if e.reg != nil && !e.busy {
			held = append(held, e)
		}
	}
	m.mu.Unlock()
	var wg sync.WaitGroup
	slots := make(chan struct{}, m.opts.Workers)
	for _, e := range held {
		slots <- struct{}{}
		wg.Go(func() {
			defer func() { <-slots }()
			m.mu.Lock()
			reg := e.reg
			e.reg = nil
			m.mu.Unlock()
			m.deregister(ctx, e, reg)
		})
	}
	wg.Wait()
	m.waitCalls(m.opts.HandlerTimeout)
}

// waitCalls waits for running handler calls, but not forever: a handler that
// ignores its context must not keep the process from stopping. If one is
// still running after d, it is left behind, with the goroutine waiting for it.
func (m *Manager) waitCalls(d time.Duration) {
	done := make(chan struct{})
	go func() {
		m.calls.Wait()
		close(done)
	}()
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
		m.log.Error("handler calls still running after shutdown; returning without them", "waited", d)
	}
}

func (m *Manager) work(ctx context.Context) {
	for {
		path, ok := m.queue.get()
		if !ok {
			return
		}
		m.reconcile(ctx, path)
		m.queue.done(path)
	}
}

// watch turns filesystem events, watch errors and the resync timer into work.
func (m *Manager) watch(ctx context.Context, w *watcher) {
	m.resync(w)
	close(m.synced)
	var tick <-chan time.Time
	if m.opts.ResyncInterval > 0 {
		t := time.NewTicker(m.opts.ResyncInterval)
		defer t.Stop()
		tick = t.C
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
	found := make(map[string]fileID)
	if err := w.watchTree(m.opts.Dir, func(path string, id fileID) { found[path] = id }); err != nil {
		m.log.Warn("scanning the registry directory", "dir", m.opts.Dir, "err", err)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	for path, id := range found {
		e, ok := m.entries[path]
		if !ok {
			// Known from now on (Synced promises it); the worker registers it.
			m.discoverLocked(path, id, nil)
		}
		if !ok || e.id != id {
			m.queue.add(path)
		}
	}
	for path := range m.entries {
		if _, ok := found[path]; !ok {
			m.queue.add(path)
		}
	}
}

// enqueueUnder queues every known socket below dir, which was removed or renamed.
func (m *Manager) enqueueUnder(dir string) {
	prefix := dir + string(filepath.Separator)
	m.mu.Lock()
	defer m.mu.Unlock()
	for path := range m.entries {
		if strings.HasPrefix(path, prefix) {
			m.queue.add(path)
		}
	}
}

// reconcile brings one socket path's registration in line with the file there
// now: it deregisters what is gone or replaced before it registers the
// successor. Only one worker runs it for a path at a time.
func (m *Manager) reconcile(ctx context.Context, path string) {
	id, present := statSocket(path)

	m.mu.Lock()
	e := m.entries[path]
	if e == nil && !present {
		m.mu.Unlock()
		return
	}
	if e != nil && e.busy {
		m.mu.Unlock() // the abandoned call queues the path again when it returns
		return
	}
	// Take back what is gone or replaced, and what a timed-out Register may
	// have left with the handler before it is registered again.
	if e != nil && e.reg != nil && (!present || e.reg.id != id || !e.status.State.registered()) {
		reg := e.reg
		e.reg = nil
		m.mu.Unlock()
		if !m.deregister(ctx, e, reg) {
			return
		}
		m.mu.Lock()
	}
	if !present {
		seen := e.status.Plugin
		m.forgetLocked(path, e)
		obs, _ := m.handlers[seen.Type].(Observer)
		m.mu.Unlock()
		if m.opts.Observe && obs != nil && seen.Type != "" {
			obs.Forget(seen)
		}
		return
	}
	if e == nil || e.id != id {
		if e = m.discoverLocked(path, id, e); e == nil {
			m.mu.Unlock() // over Options.MaxSockets
			return
		}
	}
	if m.opts.Observe {
		// Observing: look at a new socket at once, then once per interval.
		if e.status.State != StatePending && !e.probeDue {
			m.mu.Unlock()
			return
		}
		e.probeDue = false
		m.mu.Unlock()
		m.observe(ctx, path, e)
		return
	}
	if e.probeDue {
		e.probeDue = false
		if e.status.State.registered() {
			m.mu.Unlock()
			m.probe(ctx, path, e)
			return
		}
	}
	if !m.dueLocked(e) {
		m.mu.Unlock()
		return
	}
	e.status.State = StateRegistering
	e.status.Attempts++
	e.status.NextRetry = time.Time{}
	m.mu.Unlock()

	m.metrics.attempts.Inc()
	m.register(ctx, path, e)
}

// discoverLocked starts afresh for a new socket file at path: no attempts, no
// backoff, no verdict carried over from a file that was there before.
func (m *Manager) discoverLocked(path string, id fileID, e *entry) *entry {
	if e == nil {
		if len(m.entries) >= m.opts.MaxSockets {
			m.metrics.overLimit.Inc()
			m.overLimit = true
			if time.Since(m.lastLimitWarning) > time.Minute {
				m.lastLimitWarning = time.Now()
				m.log.Error("too many sockets: new ones are not tracked until some go; raise Options.MaxSockets if this node needs more",
					"limit", m.opts.MaxSockets, "socket", path)
			}
			return nil
		}
		e = &entry{}
		m.entries[path] = e
	}
	m.stopTimers(e)
	e.id = id
	m.discoveries++
	e.seq = m.discoveries
	e.backoff = m.newBackoff()
	e.status = PluginStatus{Plugin: Plugin{Socket: path}, State: StatePending, Discovered: time.Now(), Created: time.Unix(id.sec, id.nsec)}
	m.publishLocked(EventDiscovered, e)
	m.log.Debug("socket discovered", "socket", path)
	return e
}

// stopTimers stops e's pending retry and probe, and its connection watch.
func (m *Manager) stopTimers(e *entry) {
	if e.hang != nil {
		m.hangups.unwatch(e.hang)
		e.hang = nil
	}
	if e.retry != nil {
		e.retry.Stop()
		e.retry = nil
	}
	e.stopProbe()
	e.probeDue = false
}

func (m *Manager) forgetLocked(path string, e *entry) {
	m.stopTimers(e)
	if m.overLimit {
		// A place is free: find the sockets that were left untracked.
		m.overLimit = false
		select {
		case m.rescan <- struct{}{}:
		default:
		}
	}
	delete(m.entries, path)
	m.publishLocked(EventRemoved, e)
	m.log.Debug("socket removed", "socket", path)
}

// dueLocked reports whether e should be tried now.
func (m *Manager) dueLocked(e *entry) bool {
	switch e.status.State {
	case StatePending:
		return true
	case StateFailed, StateStale:
		return !time.Now().Before(e.status.NextRetry)
	case StateRejected:
		_, ok := m.handlers[e.status.Type]
		return e.status.Reason == ReasonNoHandler && ok
	}
	return false
}

// register runs the handshake with the plugin and its handler.
func (m *Manager) register(ctx context.Context, path string, e *entry) {
	p := Plugin{Socket: path}

	conn, err := m.dial(ctx, path)
	if err != nil {
		m.fail(ctx, e, p, ReasonDial, err, false)
		return
	}
	who := peerOf(conn)
	// From here, refuse takes conn, to tell the plugin; a registration keeps
	// it for the liveness watch.

	infoCtx, cancel := context.WithTimeoutCause(ctx, m.opts.GetInfoTimeout,
		fmt.Errorf("no answer within %s", m.opts.GetInfoTimeout))
	info, err := getInfo(infoCtx, conn)
	cancel()
	if status.Code(err) == codes.ResourceExhausted {
		// An answer over the size cap is malformed, not unlucky: retrying
		// would only make the plugin send it again.
		m.refuse(ctx, conn, e, p, ReasonInvalidInfo, fmt.Errorf("%w: the GetInfo answer is larger than %d bytes: %w", errInvalidInfo, maxInfoBytes, err), true)
		return
	}
	if err != nil {
		conn.Close()
		// A plugin that does not serve Registration at all will not start to by retrying.
		m.fail(ctx, e, p, ReasonGetInfo, err, unimplemented(err))
		return
	}
	if p, err = pluginFromInfo(info, path); err != nil {
		// Keep none of what it said: the error says what was wrong, bounded.
		m.refuse(ctx, conn, e, Plugin{Socket: path}, ReasonInvalidInfo, err, true)
		return
	}

	if err := m.checkPolicy(p, who); err != nil {
		m.refuse(ctx, conn, e, p, ReasonPolicy, err, true)
		return
	}

	m.mu.Lock()
	e.status.Plugin = p
	h := m.handlers[p.Type]
	m.mu.Unlock()
	if h == nil {
		m.refuse(ctx, conn, e, p, ReasonNoHandler, fmt.Errorf("%w %q: the manager has none for it", errNoHandler, p.Type), true)
		return
	}

	if err := m.callHandler(ctx, e, "Validate", func(ctx context.Context) error { return h.Validate(ctx, p) }); err != nil {
		// A refusal is final; a handler that timed out or panicked may do better next time.
		m.refuse(ctx, conn, e, p, ReasonValidate, err, !isFault(err))
		return
	}

	m.mu.Lock()
	e.reg = &registration{id: e.id, plugin: p, handler: h}
	m.mu.Unlock()
	if err := m.callHandler(ctx, e, "Register", func(ctx context.Context) error { return h.Register(ctx, p) }); err != nil {
		if !isFault(err) {
			// The handler said no. One that timed out may still take the plugin,
			// so that registration is kept, to be taken back if the socket goes.
			m.mu.Lock()
			e.reg = nil
			m.mu.Unlock()
		}
		m.refuse(ctx, conn, e, p, ReasonRegister, err, isTerminal(err))
		return
	}

	notifyCtx, cancel := context.WithTimeoutCause(ctx, m.opts.NotifyTimeout,
		fmt.Errorf("no answer within %s", m.opts.NotifyTimeout))
	conn, notifyErr := m.notify(notifyCtx, conn, path, true, "")
	cancel()

	m.armHangup(ctx, path, e, conn)
	m.mu.Lock()
	defer m.mu.Unlock()
	now := time.Now()
	e.status.State = StateRegistered
	e.status.RegisteredSince = now
	e.status.Reason, e.status.LastError = "", ""
	label := m.typeLabelLocked(p.Type)
	if notifyErr != nil {
		// The handler holds the plugin; failing the registration now would only
		// make the handler flap. The plugin learns of it from its next GetInfo.
		e.status.Reason, e.status.LastError = ReasonNotify, printable(notifyErr.Error())
		m.metrics.failures.WithLabelValues(label, string(ReasonNotify)).Inc()
		m.log.Warn("plugin registered but could not be told so", "socket", path, "type", p.Type, "name", p.Name, "err", e.status.LastError)
	}
	m.metrics.latency.WithLabelValues(label).Observe(now.Sub(e.status.Discovered).Seconds())
	m.scheduleProbeLocked(path, e, m.opts.ProbeInterval, true)
	m.publishLocked(EventRegistered, e)
	m.log.Info("plugin registered", "socket", path, "type", p.Type, "name", p.Name, "endpoint", p.Endpoint, "versions", p.Versions, "attempt", e.status.Attempts)
}

// refuse tells the plugin, over conn, that it was not registered, then
// records the failure. conn is closed.
func (m *Manager) refuse(ctx context.Context, conn *unaryconn.Conn, e *entry, p Plugin, reason Reason, err error, terminal bool) {
	if ctx.Err() == nil {
		notifyCtx, cancel := context.WithTimeoutCause(ctx, m.opts.NotifyTimeout,
			fmt.Errorf("no answer within %s", m.opts.NotifyTimeout))
		used, nerr := m.notify(notifyCtx, conn, p.Socket, false, err.Error())
		if nerr != nil {
			m.log.Warn("could not tell plugin it was not registered", "socket", p.Socket, "err", printable(nerr.Error()))
		}
		closeConn(used)
		cancel()
	} else {
		conn.Close()
	}
	m.fail(ctx, e, p, reason, err, terminal)
}

// fail records a failed attempt: Rejected if terminal, else Failed with a retry
// after backoff.
func (m *Manager) fail(ctx context.Context, e *entry, p Plugin, reason Reason, err error, terminal bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if ctx.Err() != nil {
		// Shutting down: the attempt was cut short, not failed.
		e.status.State = StatePending
		return
	}
	e.status.Plugin = p
	e.status.Reason, e.status.LastError = reason, printable(err.Error())
	m.metrics.failures.WithLabelValues(m.typeLabelLocked(p.Type), string(reason)).Inc()
	if terminal {
		e.status.State = StateRejected
		if _, ok := m.handlers[p.Type]; ok && reason == ReasonNoHandler {
			// AddHandler ran while this attempt was refusing the plugin, and
			// saw it Registering, not Rejected: it is up to us to retry.
			m.queue.add(p.Socket)
		}
		m.publishLocked(EventRejected, e)
		m.log.Warn("plugin rejected", "socket", p.Socket, "type", p.Type, "name", p.Name, "reason", reason, "err", e.status.LastError)
		return
	}
	delay := m.backoff(e, reason, err)
	e.status.State = StateFailed
	if reason == ReasonDial && errors.Is(err, syscall.ECONNREFUSED) {
		// A socket file nobody listens on: what a crashed plugin leaves.
		e.status.State = StateStale
		m.removeIfStaleLocked(e)
	}
	e.status.NextRetry = time.Now().Add(delay)
	path := p.Socket
	e.retry = time.AfterFunc(delay, func() { m.queue.add(path) })
	m.publishLocked(EventFailed, e)
	m.log.Warn("plugin registration failed", "socket", path, "type", p.Type, "name", p.Name, "reason", reason, "err", e.status.LastError, "attempt", e.status.Attempts, "retryIn", delay)
}

// newBackoff is the retry delay of a new socket: BackoffInitial, doubled
// for each failure since the socket appeared, up to BackoffMax, with ±20%
// jitter so that plugins that failed together do not retry together.
func (m *Manager) newBackoff() backoff.Backoff {
	return backoff.New(m.opts.BackoffInitial, m.opts.BackoffMax, 0.2)
}

// backoff is the delay before the next attempt at e.
func (m *Manager) backoff(e *entry, reason Reason, err error) time.Duration {
	// A socket that refuses connections just after it appeared is most likely
	// bound but not yet listening: look again very soon.
	if reason == ReasonDial && errors.Is(err, syscall.ECONNREFUSED) && e.status.Attempts == 1 && time.Since(e.status.Discovered) < time.Second {
		return min(10*time.Millisecond, m.opts.BackoffInitial)
	}
	return e.backoff.Next()
}

// deregister takes reg back from its handler. It reports false if the handler
// call was abandoned at its deadline; the path is queued again when it returns.
func (m *Manager) deregister(ctx context.Context, e *entry, reg *registration) bool {
	err := m.callHandler(ctx, e, "Deregister", func(ctx context.Context) error {
		reg.handler.Deregister(ctx, reg.plugin)
		return nil
	})
	p := reg.plugin
	m.mu.Lock()
	defer m.mu.Unlock()
	if e.status.State.registered() {
		e.status.State = StatePending
	}
	e.stopProbe()
	if e.hang != nil {
		m.hangups.unwatch(e.hang)
		e.hang = nil
	}
	e.probeDue = false
	e.status.RegisteredSince, e.status.UnhealthySince = time.Time{}, time.Time{}
	m.metrics.deregistrations.WithLabelValues(m.typeLabelLocked(p.Type)).Inc()
	ev := m.eventLocked(EventDeregistered, e)
	ev.Plugin = p
	if err != nil {
		ev.Error = printable(err.Error())
		m.log.Warn("plugin deregistration failed", "socket", p.Socket, "type", p.Type, "name", p.Name, "err", ev.Error)
	} else {
		m.log.Info("plugin deregistered", "socket", p.Socket, "type", p.Type, "name", p.Name)
	}
	m.events.publish(ev)
	return !e.busy
}

func (m *Manager) eventLocked(typ EventType, e *entry) Event {
	s := e.status
	return Event{
		Time:      time.Now(),
		Type:      typ,
		Plugin:    s.Plugin,
		State:     s.State,
		Reason:    s.Reason,
		Error:     s.LastError,
		Attempt:   s.Attempts,
		NextRetry: s.NextRetry,
	}
}

// publishLocked publishes while m.mu is held, so that events are in the order
// of the changes they report.
func (m *Manager) publishLocked(typ EventType, e *entry) {
	m.events.publish(m.eventLocked(typ, e))
}

// handlerFault is a handler call that timed out or panicked: the handler's
// trouble, not a verdict on the plugin, so it is retried.
type handlerFault struct{ err error }

func (f *handlerFault) Error() string { return f.err.Error() }
func (f *handlerFault) Unwrap() error { return f.err }

func isFault(err error) bool {
	var f *handlerFault
	return errors.As(err, &f)
}

// callHandler calls a handler method with a deadline, recovering a panic. If
// the deadline passes first, the call is abandoned: callHandler returns, and e
// stays busy until the call does return, then its path is queued again.
func (m *Manager) callHandler(ctx context.Context, e *entry, op string, call func(context.Context) error) error {
	ctx, cancel := context.WithTimeoutCause(ctx, m.opts.HandlerTimeout,
		fmt.Errorf("handler %s did not return within %s", op, m.opts.HandlerTimeout))
	defer cancel()
	done := make(chan error, 1)
	abandoned := false // guarded by m.mu
	m.calls.Add(1)
	go func() {
		defer m.calls.Done()
		err := safeCall(ctx, op, call)
		m.mu.Lock()
		defer m.mu.Unlock()
		if abandoned {
			e.busy = false
			m.queue.add(e.status.Socket)
			return
		}
		done <- err // buffered, and read only while m.mu is not held by the reader
	}()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	select {
	case err := <-done: // returned just in time
		return err
	default:
	}
	abandoned = true
	e.busy = true
	return &handlerFault{context.Cause(ctx)}
}

func safeCall(ctx context.Context, op string, call func(context.Context) error) (err error) {
	defer func() {
		if v := recover(); v != nil {
			err = &handlerFault{handlerPanic(op, v)}
		}
	}()
	return call(ctx)
}
