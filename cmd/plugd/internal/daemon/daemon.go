// Package daemon is plugd, the service: the plugin manager run from a
// configuration, with a status API, metrics, logs and signal handling.
// cmd/plugd is a thin main around Command.
package daemon

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/plugd/plugd/api"
	"github.com/plugd/plugd/cmd/internal/version"
	"github.com/plugd/plugd/cmd/plugd/internal/kubenode"
	"github.com/plugd/plugd/internal/confine"
	"github.com/plugd/plugd/internal/dirtrust"
	"github.com/plugd/plugd/pluginmanager"
	"k8s.io/klog/v2"
)

// Daemon is one plugd: a plugin manager and the status API in front of it.
type Daemon struct {
	log     *slog.Logger
	level   *slog.LevelVar
	metrics *prometheus.Registry
	m       *pluginmanager.Manager
	doctors chan struct{}  // a slot per doctor run (GET /v1/findings) under way
	answers *answers       // for requests that come through no statusListener (tests)
	kube    *kubenode.Node // nil unless cfg.Kubernetes is set
	// detailChanges is signalled when a handler's details change without an
	// event of the manager (a DRA device's health): follow tells kube.
	detailChanges chan struct{}

	streamsMu   sync.Mutex
	streamsBy   map[string]int // open event streams by client (statusConn.peer); guarded by streamsMu
	streamsOpen int            // all of them; guarded by streamsMu

	mu       sync.Mutex
	cfg      Config             // as applied; guarded by mu
	handlers map[string]handler // by plugin type; guarded by mu
}

// New checks cfg and builds a daemon that logs to logOut. Nothing runs until Run.
func New(cfg Config, logOut io.Writer) (*Daemon, error) {
	cfg, err := cfg.WithDefaults()
	if err != nil {
		return nil, err
	}
	level := new(slog.LevelVar)
	l, _ := parseLevel(cfg.Log.Level) // checked by WithDefaults
	level.Set(l)
	hopts := &slog.HandlerOptions{Level: level}
	var h slog.Handler = slog.NewTextHandler(logOut, hopts)
	if cfg.Log.Format == "json" {
		h = slog.NewJSONHandler(logOut, hopts)
	}
	d := &Daemon{
		log:           slog.New(h),
		level:         level,
		metrics:       prometheus.NewRegistry(),
		doctors:       make(chan struct{}, maxDoctors),
		answers:       newAnswers(),
		streamsBy:     map[string]int{},
		cfg:           cfg,
		detailChanges: make(chan struct{}, 1),
	}
	d.metrics.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	if d.m, err = pluginmanager.New(cfg.managerOptions(d.log, d.metrics)); err != nil {
		return nil, err
	}
	d.handlers = make(map[string]handler)
	for _, hc := range cfg.Handlers {
		if err := d.addHandler(hc); err != nil {
			d.closeHandlers()
			return nil, err
		}
	}
	if k := cfg.Kubernetes; k != nil {
		// client-go logs through klog; plugd logs each change of the API's
		// state itself, once, so client-go's own lines are for debugging.
		klog.SetSlogLogger(slog.New(debugHandler{h}).With("source", "client-go"))
		var expect []kubenode.Expectation
		for _, e := range cfg.Expect {
			expect = append(expect, e.expectation())
		}
		d.kube, err = kubenode.New(kubenode.Config{
			Kubeconfig: k.Kubeconfig, NodeName: k.NodeName, UserAgent: "plugd/" + version.String(),
			Expect: expect, RemoveTaint: k.RemoveTaintWhenReady, StartupWindow: time.Duration(k.StartupWindow), DisagreementGrace: time.Duration(k.DisagreementGrace),
			HeartbeatInterval: time.Duration(k.HeartbeatInterval), Kubelet: k.kubeletConfig(),
			RegistryDir: cfg.RegistryDir, Sockets: d.kubePlugins, Scanned: d.m.Synced(), Logger: d.log.With("component", "kubernetes"), Registerer: d.metrics,
		})
		if err != nil {
			d.closeHandlers()
			return nil, err
		}
	}
	return d, nil
}

// debugHandler writes every record at debug level.
type debugHandler struct{ h slog.Handler }

func (d debugHandler) Enabled(ctx context.Context, _ slog.Level) bool {
	return d.h.Enabled(ctx, slog.LevelDebug)
}

func (d debugHandler) Handle(ctx context.Context, r slog.Record) error {
	r.Level = slog.LevelDebug
	return d.h.Handle(ctx, r)
}

func (d debugHandler) WithAttrs(as []slog.Attr) slog.Handler { return debugHandler{d.h.WithAttrs(as)} }
func (d debugHandler) WithGroup(g string) slog.Handler       { return debugHandler{d.h.WithGroup(g)} }

// follow tells the node agent of every change of the plugins, until ctx is
// done or the manager stops.
func (d *Daemon) follow(ctx context.Context, sub *pluginmanager.Subscription) {
	defer sub.Close()
	synced := d.m.Synced() // an empty directory's walk brings no event
	for {
		select {
		case <-ctx.Done():
			return
		case <-synced:
			synced = nil
			d.kube.Changed()
		case <-d.detailChanges:
			d.kube.Changed()
		case _, ok := <-sub.Events():
			if !ok {
				return
			}
			d.kube.Changed()
		}
	}
}

// identify is s known by what its socket last said in GetInfo when it says
// nothing now, and whether that is what it said when it last answered
// rather than now: the manager keeps a socket's identity while it does not
// answer (Stale, Unhealthy, a failed dial or GetInfo), and, until a new
// file at the same path answers, the one before's (LastAnswer).
func identify(s pluginmanager.PluginStatus) (pluginmanager.PluginStatus, bool) {
	if s.Type == "" {
		if s.LastAnswer.Type == "" {
			return s, false
		}
		s.Plugin = s.LastAnswer
		return s, true
	}
	silent := s.State == pluginmanager.StateStale || s.Reason == pluginmanager.ReasonDial || s.Reason == pluginmanager.ReasonGetInfo ||
		s.State == pluginmanager.StateUnhealthy && s.Reason == pluginmanager.ReasonUnhealthy
	return s, silent
}

// answering says the socket's plugin answers now.
func answering(s pluginmanager.PluginStatus) bool {
	return s.State == pluginmanager.StateRegistered || s.State == pluginmanager.StateAnswering
}

// kubePlugins is the node agent's input: the node's plugins as the
// manager's snapshot has them, each with what its handler says of it, from
// which the node agent reads the facts it holds against the kubelet's.
func (d *Daemon) kubePlugins() []kubenode.Socket {
	var out []kubenode.Socket
	for _, s := range d.m.Plugins() {
		s, _ = identify(s)
		out = append(out, kubenode.Socket{Path: s.Socket, Type: s.Type, Name: s.Name, State: string(s.State),
			Answering: answering(s), Unsettled: s.State == pluginmanager.StatePending || s.State == pluginmanager.StateRegistering,
			Created: s.Created, Details: d.details(s.Plugin)})
	}
	return out
}

// kubeletView is the kubelet's view of s, when plugd is connected to
// Kubernetes and s has said who it is.
func (d *Daemon) kubeletView(s pluginmanager.PluginStatus) *api.KubeletView {
	if d.kube == nil || s.Type == "" {
		return nil
	}
	v, ok := d.kube.KubeletView(s.Type, s.Name)
	if !ok {
		v = api.KubeletView{State: api.KubeletUnknown, Reason: "Pending", Message: "plugd has not compared it with the Kubernetes API yet"}
	}
	return &v
}

// detailsChanged tells follow that a handler's details changed; it never
// blocks.
func (d *Daemon) detailsChanged() {
	select {
	case d.detailChanges <- struct{}{}:
	default:
	}
}

// holds are the expected resources' conditions plugin s holds (anyOf).
func (d *Daemon) holds(s pluginmanager.PluginStatus) []string {
	if d.kube == nil || s.Type == "" {
		return nil
	}
	return d.kube.Holds(s.Type, s.Name)
}

// taintViews are the startup taints that wait for s, an expected plugin,
// and their states, when plugd is connected to Kubernetes.
func (d *Daemon) taintViews(s pluginmanager.PluginStatus) []api.TaintView {
	if d.kube == nil || s.Type == "" {
		return nil
	}
	return d.kube.TaintViews(s.Type, s.Name)
}

// addHandler builds the handler hc names and hands it to the manager. d.mu
// must be held, or d not yet shared.
func (d *Daemon) addHandler(hc HandlerConfig) error {
	h, err := newHandler(hc, d.cfg.Policy.EndpointRoots, d.log, d.metrics, d.detailsChanged)
	if err != nil {
		return fmt.Errorf("handler %s for %s: %w", hc.Handler, hc.Type, err)
	}
	d.useHandler(hc.Type, h, d.cfg.handlerOptions(hc))
	return nil
}

// useHandler makes h the handler of plugins of type typ, and their observer
// if it is one. d.mu must be held, or d not yet shared.
func (d *Daemon) useHandler(typ string, h handler, opts pluginmanager.HandlerOptions) {
	d.handlers[typ] = h
	d.m.AddHandler(typ, h.Handler, opts)
	if obs, ok := h.Handler.(pluginmanager.Observer); ok {
		d.m.AddObserver(typ, obs) // used when observing
	}
}

// closeHandlers stops what the handlers started, once nothing calls them.
func (d *Daemon) closeHandlers() {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, h := range d.handlers {
		h.close()
	}
}

// details is what the plugin's handler says of it, if it is a
// pluginmanager.Detailer: the plugin's details in the status API, and what
// the node agent reads of it.
func (d *Daemon) details(p pluginmanager.Plugin) any {
	d.mu.Lock()
	h := d.handlers[p.Type]
	d.mu.Unlock()
	if dt, ok := h.Handler.(pluginmanager.Detailer); ok {
		return dt.Details(p)
	}
	return nil
}

// Config returns the configuration in force, defaults filled in.
func (d *Daemon) Config() Config {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.cfg
}

// Run serves until ctx is done, then shuts down within the configured
// shutdown timeout and returns nil; or returns an error at once if the status
// API or the registry directory cannot be set up.
func (d *Daemon) Run(ctx context.Context) error {
	cfg := d.Config()
	listeners, err := d.listen(cfg)
	if err != nil {
		return err
	}
	// Streams (GET /v1/events) end when serveCtx does, so that shutdown does
	// not wait on them.
	serveCtx, stopServing := context.WithCancel(context.WithoutCancel(ctx))
	defer stopServing()
	srv := &http.Server{
		Handler:           d.Handler(),
		ReadHeaderTimeout: readHeaderTimeout,
		// A backstop: every answer sets its own write deadline (streams
		// before each event), which takes the place of this one.
		WriteTimeout:   doctorTimeout + writeDeadline,
		IdleTimeout:    idleTimeout,
		MaxHeaderBytes: maxHeaderBytes,
		BaseContext:    func(net.Listener) context.Context { return serveCtx },
		ConnContext:    connContext,
		ConnState:      connState,
		ErrorLog:       slog.NewLogLogger(d.log.Handler(), slog.LevelWarn),
	}

	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	var wg sync.WaitGroup
	errs := make(chan error, len(listeners)+1)
	for _, l := range listeners {
		wg.Go(func() {
			if err := srv.Serve(l); !errors.Is(err, http.ErrServerClosed) {
				errs <- fmt.Errorf("serving the status API on %s: %w", l.Addr(), err)
				stop()
			}
		})
	}
	if d.kube != nil {
		sub := d.m.Subscribe()
		wg.Go(func() { d.follow(runCtx, sub) })
		wg.Go(func() { d.kube.Run(runCtx) })
	}
	wg.Go(func() {
		if err := d.m.Run(runCtx); err != nil {
			errs <- err
		}
		stop() // the manager is the daemon: if it stops, everything does
	})
	d.log.Info("plugd started", "version", version.String(), "registryDir", cfg.RegistryDir,
		"statusSocket", cfg.Status.Socket, "statusTCP", cfg.Status.TCP, "handlers", handlerList(cfg.Handlers))

	<-runCtx.Done()
	shutdownCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Duration(cfg.ShutdownTimeout))
	defer cancel()
	stopServing()
	if err := srv.Shutdown(shutdownCtx); err != nil {
		d.log.Warn("status API did not shut down in time; closing its connections", "err", err)
		srv.Close()
	}
	wg.Wait() // closing the listeners removed the status socket
	d.closeHandlers()
	close(errs)
	var all []error
	for err := range errs {
		all = append(all, err)
	}
	if err := errors.Join(all...); err != nil {
		return err
	}
	d.log.Info("plugd stopped")
	return nil
}

// listen opens the status API's listeners: the unix socket (0660) and, if
// configured, TCP. Each serves a bounded number of connections (see
// statusConnLimit), so that a flood on one neither starves the other nor
// takes the file descriptors plugins' sockets need.
func (d *Daemon) listen(cfg Config) ([]net.Listener, error) {
	var ls []net.Listener
	closeAll := func() {
		for _, l := range ls {
			l.Close()
		}
	}
	if cfg.Status.Socket != "none" {
		l, err := listenUnix(cfg.Status.Socket)
		if err != nil {
			return nil, err
		}
		ls = append(ls, l)
	}
	if cfg.Status.TCP != "" {
		l, err := net.Listen("tcp", cfg.Status.TCP)
		if err != nil {
			closeAll()
			return nil, fmt.Errorf("status.tcp: %w", err)
		}
		ls = append(ls, l)
	}
	nofile := openFileLimit()
	limit := statusConnLimit(nofile, len(ls))
	for i, l := range ls {
		ls[i] = newStatusListener(l, limit)
		d.log.Info("serving the status API", "address", l.Addr().String(), "maxConnections", limit, "openFileLimit", nofile)
	}
	return ls, nil
}

// listenUnix listens on path, replacing a stale socket left by a plugd that
// died, but never one that a running plugd still serves.
func listenUnix(path string) (net.Listener, error) {
	if len(path) > confine.MaxPath {
		return nil, fmt.Errorf("status.socket %s is %d bytes long; unix socket paths may have at most %d here: choose a shorter path", path, len(path), confine.MaxPath)
	}
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return nil, fmt.Errorf("status.socket: %w", err)
	}
	if err := checkPrivateDir(dir); err != nil {
		return nil, fmt.Errorf("status.socket: %w", err)
	}
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode()&os.ModeSocket == 0 {
			return nil, fmt.Errorf("status.socket %s exists and is not a socket; remove it or choose another path", path)
		}
		c, err := net.DialTimeout("unix", path, time.Second)
		switch {
		case err == nil:
			c.Close()
			return nil, fmt.Errorf("status.socket %s is in use: another plugd is running; stop it or choose another path", path)
		case !errors.Is(err, syscall.ECONNREFUSED):
			return nil, fmt.Errorf("status.socket %s exists and cannot be checked (%w); remove it if no plugd runs, or choose another path", path, err)
		}
		os.Remove(path) // refused: nobody listens, a plugd died and left it
	}
	l, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("status.socket: %w", err)
	}
	if err := os.Chmod(path, 0o660); err != nil {
		l.Close()
		return nil, fmt.Errorf("status.socket: %w", err)
	}
	return l, nil
}

// checkPrivateDir refuses a directory for the status socket that someone else
// could tamper with: replace the socket, and answer plugctl and probes in
// plugd's name. It is the registry directory's rule (dirtrust.Check), with no
// override.
func checkPrivateDir(dir string) error {
	return dirtrust.Check(dir, os.Geteuid())
}

// Reload applies what can change while running, and says what needs a
// restart: the log level, and handlers for types that had none. Everything
// else is reported, not applied.
func (d *Daemon) Reload(next Config) (applied, needsRestart []string, err error) {
	next, err = next.WithDefaults()
	if err != nil {
		return nil, nil, err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	cur := d.cfg

	if next.Log.Level != cur.Log.Level {
		l, _ := parseLevel(next.Log.Level)
		d.level.Set(l)
		applied = append(applied, fmt.Sprintf("log.level: %s -> %s", cur.Log.Level, next.Log.Level))
		cur.Log.Level = next.Log.Level
	}
	// The manager can gain a handler, but not lose or swap one while plugins
	// may be registered with it.
	old := map[string]HandlerConfig{}
	for _, h := range cur.Handlers {
		old[h.Type] = h
	}
	for _, h := range next.Handlers {
		switch was, ok := old[h.Type]; {
		case !ok:
			if err := d.addHandler(h); err != nil {
				needsRestart = append(needsRestart, fmt.Sprintf("handlers: %s for %s could not be added: %v", h.Handler, h.Type, err))
				break
			}
			cur.Handlers = append(cur.Handlers, h)
			applied = append(applied, fmt.Sprintf("handlers: added %s for %s", h.Handler, h.Type))
		case was.Handler != h.Handler:
			needsRestart = append(needsRestart, fmt.Sprintf("handlers: %s changes from %s to %s", h.Type, was.Handler, h.Handler))
		case !reflect.DeepEqual(was, h):
			needsRestart = append(needsRestart, fmt.Sprintf("handlers: the settings of %s's %s handler change", h.Type, h.Handler))
		}
		delete(old, h.Type)
	}
	for typ := range old {
		needsRestart = append(needsRestart, fmt.Sprintf("handlers: %s removed", typ))
	}
	// Everything else is compared as a whole, field by field.
	for _, f := range configFields {
		if was, now := f.get(cur), f.get(next); was != now {
			needsRestart = append(needsRestart, fmt.Sprintf("%s: %s -> %s", f.name, showValue(was), showValue(now)))
		}
	}
	slices.Sort(needsRestart)
	d.cfg = cur
	return applied, needsRestart, nil
}

// showValue prints a setting for a person: a zero value is the default.
func showValue(v any) string {
	if reflect.ValueOf(v).IsZero() {
		return "default"
	}
	return fmt.Sprintf("%v", v)
}

// configFields are the settings only a restart applies.
var configFields = []struct {
	name string
	get  func(Config) any
}{
	{"mode", func(c Config) any { return c.Mode }},
	{"registryDir", func(c Config) any { return c.RegistryDir }},
	{"status", func(c Config) any { return c.Status }},
	{"workers", func(c Config) any { return c.Workers }},
	{"resyncInterval", func(c Config) any { return c.ResyncInterval }},
	{"backoff", func(c Config) any { return c.Backoff }},
	{"timeouts", func(c Config) any { return c.Timeouts }},
	{"deregisterOnShutdown", func(c Config) any { return c.DeregisterOnShutdown }},
	{"shutdownTimeout", func(c Config) any { return c.ShutdownTimeout }},
	{"log.format", func(c Config) any { return c.Log.Format }},
	{"liveness", func(c Config) any { return c.Liveness }},
	{"policy", func(c Config) any { return fmt.Sprintf("%+v", c.Policy) }}, // holds slices: compared as text
	{"kubernetes", func(c Config) any {
		if c.Kubernetes == nil {
			return ""
		}
		return fmt.Sprintf("%+v", *c.Kubernetes)
	}},
	{"expect", func(c Config) any { return fmt.Sprintf("%+v", c.Expect) }},
	{"doctor", func(c Config) any { return fmt.Sprintf("%+v", c.Doctor) }},
}
