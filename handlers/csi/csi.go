package csi

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"maps"
	"reflect"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	utilversion "k8s.io/apimachinery/pkg/util/version"

	"github.com/plugd/plugd/api"
	"github.com/plugd/plugd/handlers/internal/endpointwatch"
	"github.com/plugd/plugd/internal/confine"
	"github.com/plugd/plugd/internal/unaryconn"
	"github.com/plugd/plugd/pluginmanager"
)

// Type is the plugin type CSI drivers register with, through node-driver-registrar.
const Type = api.CSIPlugin

// Options configure a Handler. The zero value of each field means the default
// written beside it.
type Options struct {
	// Logger receives the handler's logs. Nil discards them.
	Logger *slog.Logger

	// Registerer, if set, receives the handler's Prometheus metrics. Nil
	// means none are exported.
	Registerer prometheus.Registerer

	// CallTimeout bounds each CSI call made to a driver; the deadline of the
	// handler call it is made in bounds it too. Zero means 10s.
	CallTimeout time.Duration

	// EndpointRoots, if set, are the directories endpoints must be in: the
	// manager's Options.EndpointRoots. The manager checks an endpoint when
	// its plugin registers; the handler checks again at every connection to
	// the driver, and refuses an endpoint that resolves outside them by then
	// (one swapped for a symlink, say).
	EndpointRoots []string
}

// Handler is the pluginmanager.Handler for CSI drivers (type "CSIPlugin"). It
// validates what a driver's registrar announced, asks the driver about this
// node, and records each instance of each driver. Create one with New; it is
// safe for concurrent use.
type Handler struct {
	log         *slog.Logger
	callTimeout time.Duration
	roots       []string          // Options.EndpointRoots
	poller      *unaryconn.Poller // watches the connections held to the drivers' endpoints; Close closes it
	metrics     *metrics

	mu      sync.Mutex
	drivers map[string][]*record // by driver name, oldest registration first
	seq     uint64               // orders registrations; RegisteredAt may tie
}

// record is one registered instance and what ordering needs.
type record struct {
	Instance
	version *utilversion.Version
	seq     uint64
	watch   *endpointwatch.Watch // of the driver's endpoint
}

// Driver is a CSI driver with at least one registered instance.
type Driver struct {
	Name string `json:"name"`
	// Active is the instance in use: the most recently registered one.
	Active Instance `json:"active"`
	// Instances are all registered instances, oldest first; more than one
	// during a rolling restart.
	Instances []Instance `json:"instances"`
}

// Instance is one registration of a driver: one registration socket, and the
// driver endpoint it announced (plugd's status API type).
type Instance = api.CSIInstance

// New returns a Handler for opts. It panics if opts.Registerer refuses its
// metrics (say, because another Handler's are already there), as
// prometheus.MustRegister does.
func New(opts Options) *Handler {
	h := &Handler{
		log:         opts.Logger,
		callTimeout: opts.CallTimeout,
		roots:       opts.EndpointRoots,
		poller:      unaryconn.NewPoller(unaryconn.PollerOptions{}),
		metrics:     newMetrics(),
		drivers:     make(map[string][]*record),
	}
	if h.log == nil {
		h.log = slog.New(slog.DiscardHandler)
	}
	if h.callTimeout <= 0 {
		h.callTimeout = 10 * time.Second
	}
	if opts.Registerer != nil {
		opts.Registerer.MustRegister(h.metrics.calls, driversCollector{h})
	}
	return h
}

// Validate accepts a driver whose name follows the CSI spec, whose endpoint is
// an absolute unix socket path (or a unix:// URL of one), and that offers a CSI
// 1.x version. It makes no call to the driver; its error names what was wrong.
// It is safe for concurrent use, and returns at once but for the one check
// below that connects to a registration socket, which takes at most a second.
//
// A driver of a name already registered from another registration socket is
// a second instance of it, and is accepted when any of these holds:
//
//   - its endpoint differs from that of the active instance: it is a new
//     instance, as in a rolling or surge update of the driver's DaemonSet, or
//     a driver that moved its socket;
//   - the active instance's registration socket no longer accepts connections:
//     its registrar is gone, leaving only a stale file the manager has not yet
//     let go;
//   - its highest 1.x version is higher than the active instance's: an
//     upgrade (the kubelet's rule).
//
// Otherwise it is refused: two live registrars announcing one endpoint at the
// same version are a mistake, and accepting the second would hide it. An
// accepted instance becomes the active one once registered; the older ones stay
// recorded until their sockets go. A refused registrar is told so; the
// node-driver-registrar exits then, and its restart, by when the old registrar
// is usually gone, is a new socket and is tried afresh.
//
// The common rolling restart, a new registrar re-creating the same socket
// path, needs none of this: the manager deregisters the old socket before it
// registers the new one. The kubelet refuses any same-name driver whose version is not higher, and
// deregisters by name, so a registrar restarted under a new socket name is
// either refused, or deregisters the driver when the old socket goes. The
// liveness check is on the old registration socket, not on the endpoint: when
// both instances announce the same endpoint, whoever answers there is the new
// driver as much as the old.
func (h *Handler) Validate(ctx context.Context, p pluginmanager.Plugin) error {
	if err := checkName(p.Name); err != nil {
		return err
	}
	raw, v, err := highestSupported(p.Name, p.Versions)
	if err != nil {
		return err
	}
	endpoint, err := endpointPath(p.Endpoint)
	if err != nil {
		return err
	}

	h.mu.Lock()
	var old record
	rs := h.drivers[p.Name]
	// An instance already recorded for this socket (its Register outlived the
	// manager's deadline, and is being retried) was accepted before.
	again := slices.ContainsFunc(rs, func(r *record) bool { return r.Socket == p.Socket })
	if len(rs) > 0 {
		old = *activeOf(rs)
	}
	h.mu.Unlock()
	switch {
	case len(rs) == 0 || again:
		return nil
	case endpoint != old.Endpoint:
		h.log.Info("new instance of CSI driver", "driver", p.Name, "socket", p.Socket, "endpoint", endpoint, "activeSocket", old.Socket, "activeEndpoint", old.Endpoint)
		return nil
	case old.version.LessThan(v):
		h.log.Info("upgrade of CSI driver", "driver", p.Name, "socket", p.Socket, "version", raw, "activeSocket", old.Socket, "activeVersion", old.Version)
		return nil
	case !answers(ctx, old.Socket):
		h.log.Info("CSI driver replaces an instance whose registrar is gone", "driver", p.Name, "socket", p.Socket, "activeSocket", old.Socket)
		return nil
	}
	return fmt.Errorf("CSI driver %q is already registered from %s with the same endpoint %s at version %q, not lower than %q, and that registration socket still answers: "+
		"give the new instance its own endpoint, or stop the old registrar", p.Name, old.Socket, endpoint, old.Version, raw)
}

// Register calls the driver's GetPluginInfo, Probe, NodeGetCapabilities and
// NodeGetInfo, each with a deadline, and records the instance, which becomes
// the active one of its driver. A driver that is not ready yet, or does not
// answer, fails with an error the manager retries; one that answers with
// another name, breaks the spec's limits or lacks a required call fails with
// a pluginmanager.TerminalError. It blocks for the calls, each at most
// Options.CallTimeout and all within ctx's deadline, and closes the connection
// before it returns. Called again for the same socket, it replaces the record.
//
// It then watches the driver's endpoint until Deregister (or Close): a
// connection held open with no call on it, whose hang-up (the driver's
// process went, while its node-driver-registrar may stay up) it reports to
// the manager (pluginmanager.EndpointReporter), which makes the plugin
// Unhealthy, reason endpoint. It connects again with backoff, and once the
// driver answers the calls above again, records what it says now (a new
// node ID, say) and reports it serving.
func (h *Handler) Register(ctx context.Context, p pluginmanager.Plugin) error {
	raw, v, err := highestSupported(p.Name, p.Versions)
	if err != nil {
		return pluginmanager.TerminalError(err)
	}
	endpoint, err := endpointPath(p.Endpoint)
	if err != nil {
		return pluginmanager.TerminalError(err)
	}
	info, err := h.query(ctx, p, endpoint)
	if err != nil {
		return err
	}
	w, err := h.watch(ctx, p, endpoint)
	if err != nil {
		return err
	}
	st := h.store(p, endpoint, raw, v, info, w, false)
	h.log.Info("CSI driver registered", "driver", p.Name, "socket", p.Socket, "endpoint", endpoint,
		"version", raw, "vendorVersion", info.vendorVersion, "nodeID", info.nodeID,
		"maxVolumes", info.maxVolumes, "topology", info.topology, "instances", st.instances)
	return nil
}

// stored is what store did: how many instances the driver has now, and
// whether the socket's record is new or says something new.
type stored struct {
	instances int
	changed   bool
}

// watch watches the driver's endpoint for the plugin registered (or
// observed) from p.Socket, reporting to the manager through ctx's
// reporter; after each reconnection the driver is asked again, and what it
// says recorded.
func (h *Handler) watch(ctx context.Context, p pluginmanager.Plugin, endpoint string) (*endpointwatch.Watch, error) {
	return endpointwatch.Start(ctx, endpoint, endpointwatch.Options{
		Report:  pluginmanager.EndpointReporter(ctx),
		Timeout: h.callTimeout,
		Dial:    confine.For(endpoint, p.Socket, h.roots).Dial,
		Poller:  h.poller,
		Check: func(ctx context.Context) error {
			info, err := h.query(ctx, p, endpoint)
			if err != nil {
				return err
			}
			h.refresh(p, info)
			return nil
		},
	})
}

// refresh records what a driver said after its endpoint came back, in the
// record of p.Socket, if it still has one.
func (h *Handler) refresh(p pluginmanager.Plugin, info *nodeInfo) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, r := range h.drivers[p.Name] {
		if r.Socket != p.Socket {
			continue
		}
		if r.NodeID != info.nodeID {
			h.log.Info("CSI driver is back with another node ID", "driver", p.Name, "socket", p.Socket, "nodeID", info.nodeID, "was", r.NodeID)
		}
		r.VendorVersion, r.Manifest, r.NodeID = info.vendorVersion, info.manifest, info.nodeID
		r.MaxVolumes, r.Topology, r.Capabilities = info.maxVolumes, info.topology, info.capabilities
	}
}

// store records the instance p.Socket announced, replacing any earlier record
// of that socket (under any name). A registered instance becomes the active
// one of its driver. An observed one that was already observed keeps its place
// and first-seen time, so that looking again does not change which instance is
// active.
func (h *Handler) store(p pluginmanager.Plugin, endpoint, raw string, v *utilversion.Version, info *nodeInfo, w *endpointwatch.Watch, observed bool) stored {
	h.mu.Lock()
	var replaced []*endpointwatch.Watch
	defer func() {
		h.mu.Unlock()
		for _, w := range replaced {
			w.Stop()
		}
	}()
	r := &record{
		Instance: Instance{
			Socket:        p.Socket,
			Endpoint:      endpoint,
			Version:       raw,
			VendorVersion: info.vendorVersion,
			Manifest:      info.manifest,
			NodeID:        info.nodeID,
			MaxVolumes:    info.maxVolumes,
			Topology:      info.topology,
			Capabilities:  info.capabilities,
			RegisteredAt:  time.Now(),
			Observed:      observed,
		},
		version: v,
		watch:   w,
	}
	rs := h.drivers[p.Name]
	if i := slices.IndexFunc(rs, func(r *record) bool { return r.Socket == p.Socket }); observed && i >= 0 && rs[i].Observed {
		prev := rs[i]
		r.seq, r.RegisteredAt = prev.seq, prev.RegisteredAt
		rs[i] = r
		replaced = append(replaced, prev.watch)
		return stored{instances: len(rs), changed: !reflect.DeepEqual(prev.Instance, r.Instance)}
	}
	h.seq++
	r.seq = h.seq
	replaced = h.dropLocked(p.Socket)
	h.drivers[p.Name] = append(h.drivers[p.Name], r)
	return stored{instances: len(h.drivers[p.Name]), changed: true}
}

// dropLocked forgets every record of socket, under whatever name, and
// returns the watches of those it dropped (nil for a record without one),
// for the caller to stop once it has let go of h.mu.
func (h *Handler) dropLocked(socket string) []*endpointwatch.Watch {
	var dropped []*endpointwatch.Watch
	for name, rs := range h.drivers {
		n := len(rs)
		for _, r := range rs {
			if r.Socket == socket {
				dropped = append(dropped, r.watch)
			}
		}
		rs = slices.DeleteFunc(rs, func(r *record) bool { return r.Socket == socket })
		switch {
		case len(rs) == n:
			continue
		case len(rs) == 0:
			delete(h.drivers, name)
		default:
			h.drivers[name] = rs
		}
	}
	return dropped
}

// Deregister forgets the instance registered from p.Socket, and stops
// watching its endpoint. If other instances of the driver remain, the most
// recently registered becomes active; if none does, the driver is gone. It
// makes no call to the driver, and does nothing for a socket it does not
// know, so it may be repeated.
func (h *Handler) Deregister(_ context.Context, p pluginmanager.Plugin) {
	h.mu.Lock()
	var stop []*endpointwatch.Watch
	defer func() {
		h.mu.Unlock()
		for _, w := range stop {
			w.Stop()
		}
	}()
	rs := h.drivers[p.Name]
	n := len(rs)
	for _, r := range rs {
		if r.Socket == p.Socket {
			stop = append(stop, r.watch)
		}
	}
	rs = slices.DeleteFunc(rs, func(r *record) bool { return r.Socket == p.Socket })
	switch {
	case len(rs) == n:
		return // never registered, or its Register failed
	case len(rs) == 0:
		delete(h.drivers, p.Name)
		h.log.Info("CSI driver deregistered", "driver", p.Name, "socket", p.Socket)
	default:
		h.drivers[p.Name] = rs
		h.log.Info("CSI driver instance deregistered", "driver", p.Name, "socket", p.Socket,
			"activeSocket", activeOf(rs).Socket, "instances", len(rs))
	}
}

// Close stops watching every driver's endpoint, and forgets every driver.
// The manager should have stopped by then: a handler closed is done. It may
// be called more than once.
func (h *Handler) Close() {
	h.mu.Lock()
	var stop []*endpointwatch.Watch
	for _, rs := range h.drivers {
		for _, r := range rs {
			stop = append(stop, r.watch)
		}
	}
	clear(h.drivers)
	h.mu.Unlock()
	for _, w := range stop {
		w.Stop()
	}
	h.poller.Close()
}

// activeOf returns the most recently registered of rs, which is not empty.
func activeOf(rs []*record) *record {
	return slices.MaxFunc(rs, func(a, b *record) int { return cmp.Compare(a.seq, b.seq) })
}

// Drivers returns a snapshot of the registered drivers (and, in observe mode,
// the observed ones), sorted by name. It is
// safe to call at any time; the result is the caller's to keep.
func (h *Handler) Drivers() []Driver {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make([]Driver, 0, len(h.drivers))
	for _, name := range slices.Sorted(maps.Keys(h.drivers)) {
		rs := h.drivers[name]
		d := Driver{Name: name, Active: activeOf(rs).clone()}
		for _, r := range rs {
			d.Instances = append(d.Instances, r.clone())
		}
		out = append(out, d)
	}
	return out
}

var _ pluginmanager.Detailer = (*Handler)(nil)

// Details describes the instance registered from p.Socket as an
// api.CSIDetails, for plugd's status API: the driver's name, whether the
// instance is the active one, how many instances the driver has, and the
// Instance's fields. It returns nil for a plugin this handler has not
// registered (or observed answering). It is safe to call at any time.
func (h *Handler) Details(p pluginmanager.Plugin) any {
	h.mu.Lock()
	defer h.mu.Unlock()
	rs := h.drivers[p.Name]
	for _, r := range rs {
		if r.Socket == p.Socket {
			return api.CSIDetails{Driver: p.Name, Active: activeOf(rs) == r, Instances: len(rs), CSIInstance: r.clone()}
		}
	}
	return nil
}

// clone copies the instance, so that a snapshot shares no maps or slices.
func (r *record) clone() Instance {
	in := r.Instance
	in.Manifest = maps.Clone(in.Manifest)
	in.Topology = maps.Clone(in.Topology)
	in.Capabilities = slices.Clone(in.Capabilities)
	return in
}

// checkName holds a driver name to the CSI spec: at most 63 characters,
// beginning and ending with an alphanumeric, with '-', '_', '.' and
// alphanumerics between.
func checkName(name string) error {
	const rule = "a CSI driver name must be at most 63 characters, begin and end with a letter or digit, and have only letters, digits, '-', '_' and '.' between (reverse domain notation such as \"csi.example.com\" is recommended)"
	alnum := func(c byte) bool { return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' }
	switch {
	case name == "":
		return fmt.Errorf("empty CSI driver name: %s", rule)
	case len(name) > 63:
		return fmt.Errorf("CSI driver name %.70q... is %d characters long: %s", name, len(name), rule)
	case !alnum(name[0]) || !alnum(name[len(name)-1]):
		return fmt.Errorf("invalid CSI driver name %q: it must begin and end with a letter or digit; %s", name, rule)
	}
	for _, r := range name {
		if r >= 0x80 || !alnum(byte(r)) && r != '-' && r != '_' && r != '.' {
			return fmt.Errorf("invalid CSI driver name %q: character %q is not allowed; %s", name, r, rule)
		}
	}
	return nil
}
