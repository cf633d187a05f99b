package deviceplugin

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	api "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	"k8s.io/utils/clock"

	plugdapi "github.com/plugd/plugd/api"
	"github.com/plugd/plugd/handlers/internal/defaults"
	"github.com/plugd/plugd/handlers/internal/observed"
	"github.com/plugd/plugd/pluginmanager"
)

// Type is the plugin type device plugins register with.
const Type = plugdapi.DevicePlugin

// Options configure a Handler. The zero value of every field means the
// default written beside it.
type Options struct {
	// Logger receives the handler's logs. Nil discards them.
	Logger *slog.Logger

	// Registerer, if set, receives the handler's Prometheus metrics. New
	// panics if they cannot be registered, as prometheus.MustRegister does.
	Registerer prometheus.Registerer

	// GracePeriod is how long a resource whose stream broke keeps its
	// (Unhealthy) devices while the handler redials, before it is dropped;
	// and how long a resource whose last instance deregistered keeps them,
	// waiting for a new instance to register it. Zero means
	// DefaultGracePeriod.
	GracePeriod time.Duration

	// CallTimeout bounds each call to a plugin: GetDevicePluginOptions, and
	// the wait for ListAndWatch's first device list. Zero means
	// DefaultCallTimeout.
	CallTimeout time.Duration

	// ReconnectBackoff is the delay before redialing a plugin whose stream
	// broke; it doubles after every failed attempt, and after every stream
	// that breaks within ReconnectBackoffMax of opening, up to
	// ReconnectBackoffMax. A stream that stayed up longer starts it again
	// from ReconnectBackoff. Zero means 100ms and 5s.
	ReconnectBackoff    time.Duration
	ReconnectBackoffMax time.Duration

	// EndpointRoots, if set, are the directories endpoints must be in: the
	// manager's Options.EndpointRoots. The manager checks an endpoint when
	// its plugin registers; the handler checks again at every connection,
	// redials included, and refuses an endpoint that resolves outside them
	// by then (one swapped for a symlink, say).
	EndpointRoots []string

	// Clock paces each plugin's ListAndWatch stream (1 MiB of device lists a
	// second, 4 MiB at once); tests set a fake one. Nil means the real clock.
	Clock clock.Clock
}

// What a zero Options.GracePeriod and Options.CallTimeout mean; the dra
// handler's are the same.
const (
	DefaultGracePeriod = defaults.GracePeriod // 30s
	DefaultCallTimeout = defaults.CallTimeout // 10s
)

// withDefaults returns a copy of o with the zero fields filled in.
func (o Options) withDefaults() Options {
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.GracePeriod <= 0 {
		o.GracePeriod = DefaultGracePeriod
	}
	if o.CallTimeout <= 0 {
		o.CallTimeout = DefaultCallTimeout
	}
	if o.ReconnectBackoff <= 0 {
		o.ReconnectBackoff = 100 * time.Millisecond
	}
	if o.ReconnectBackoffMax <= 0 {
		o.ReconnectBackoffMax = 5 * time.Second
	}
	o.ReconnectBackoffMax = max(o.ReconnectBackoffMax, o.ReconnectBackoff)
	return o
}

// Resource is what the handler knows of one extended resource, as served by
// its newest registered instance, or, in the grace period after the last one
// deregistered, as that one left it.
type Resource struct {
	// Name is the extended resource name, e.g. "vendor.example/gpu".
	Name string `json:"name"`
	// Socket and Endpoint are those of the instance serving the resource.
	Socket   string `json:"socket"`
	Endpoint string `json:"endpoint"`
	// Options are what the serving instance answered to GetDevicePluginOptions.
	Options PluginOptions `json:"options"`
	// Devices are the serving instance's devices, sorted by ID; none once the
	// resource is dropped.
	Devices []Device `json:"devices"`
	// Connected is set while the serving instance's ListAndWatch stream is up.
	Connected bool `json:"connected"`
	// Dropped is set when the stream stayed down longer than the grace period.
	Dropped bool `json:"dropped,omitempty"`
	// LastError says why the stream broke or could not be re-established, or
	// that the instance deregistered; empty while it is up.
	LastError string `json:"lastError,omitempty"`
	// Since is when the resource entered its current state: connected,
	// disconnected, dropped, or served by a new instance.
	Since time.Time `json:"since"`
}

// PluginOptions are a device plugin's answer to GetDevicePluginOptions
// (plugd's status API type).
type PluginOptions = plugdapi.DevicePluginOptions

// Device is one device of a resource (plugd's status API type). Its Health
// is "Healthy" or "Unhealthy" (plugd's api.DeviceHealthy and
// api.DeviceUnhealthy, spelt as v1beta1.Healthy and v1beta1.Unhealthy); a
// device whose plugin sent anything else counts as Unhealthy, as in the
// kubelet.
type Device = plugdapi.Device

// Handler is the pluginmanager.Handler for device plugins. Create it with
// New, add it to a manager for Type ("DevicePlugin"), and Close it when the
// manager's Run has returned. Its methods are safe for concurrent use.
type Handler struct {
	opts Options
	log  *slog.Logger
	reg  prometheus.Registerer // nil: no metrics

	// wg counts the stream goroutines and the Register calls in flight, so
	// that Close can wait for them.
	wg sync.WaitGroup

	mu        sync.Mutex
	closed    bool
	seq       uint64                        // registration order, to find the newest instance
	instances map[string]*instance          // by registration socket, including those still in Register
	resources map[string]*resource          // by name; only those with a registered instance
	changed   chan struct{}                 // closed and replaced on every change
	observed  *observed.Table[*observation] // by registration socket; observe mode only
}

// resource groups the registered instances of one resource name.
type resource struct {
	name       string
	instances  []*instance // in registration order: the last one serves
	reconnects uint64      // streams re-established, for the metric

	// left is the last instance, deregistered, while the resource waits for
	// a new one during the grace period; expiry then drops the resource.
	left   *instance
	expiry *time.Timer
}

// serving returns the instance whose state the resource shows: its newest
// registered instance, or left while it has none.
func (r *resource) serving() *instance {
	if len(r.instances) == 0 {
		return r.left
	}
	return r.instances[len(r.instances)-1]
}

// instance is one registered plugin socket. Its fields after done are guarded
// by Handler.mu; its stream goroutine changes them only while gone is unset.
type instance struct {
	plugin pluginmanager.Plugin
	cancel context.CancelFunc // stops the stream goroutine or the Register in flight
	done   chan struct{}      // closed when neither runs any more
	report func(error)        // tells the manager whether the endpoint serves (its stream is up)

	res       *resource // nil until Register succeeded
	seq       uint64
	gone      bool // deregistered, replaced or closed
	connected bool
	dropped   bool
	options   PluginOptions
	devices   []Device
	lastErr   string
	since     time.Time
}

var errClosed = errors.New("device plugin handler is closed")

// New returns a Handler for opts. It starts nothing until a plugin registers.
func New(opts Options) *Handler {
	opts = opts.withDefaults()
	h := &Handler{
		opts:      opts,
		log:       opts.Logger,
		reg:       opts.Registerer,
		instances: make(map[string]*instance),
		resources: make(map[string]*resource),
		changed:   make(chan struct{}),
	}
	h.observed = observed.New[*observation](&h.mu, h.notifyLocked, opts.CallTimeout, opts.EndpointRoots)
	if h.reg != nil {
		h.reg.MustRegister(collector{h})
	}
	return h
}

// Validate accepts a plugin that speaks v1beta1, whose name is an extended
// resource name outside the kubernetes.io namespace, and whose endpoint is an
// absolute unix socket path. A second socket for a resource that is already
// registered is accepted: it is a new instance, and takes over once
// registered.
func (h *Handler) Validate(_ context.Context, p pluginmanager.Plugin) error {
	if err := check(&p); err != nil {
		return err
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if r := h.resources[p.Name]; r != nil && r.serving().plugin.Socket != p.Socket {
		h.log.Info("new instance of a registered resource; it takes over once registered",
			"resource", p.Name, "socket", p.Socket, "current", r.serving().plugin.Socket)
	}
	return nil
}

// Register dials the plugin's endpoint, reads its options and its first
// device list, and from then on keeps its ListAndWatch stream open in a
// goroutine of the handler's; the stream breaking and coming back is what
// it tells the manager of the plugin's endpoint
// (pluginmanager.EndpointReporter). It blocks until the first list arrived, or
// fails at ctx's deadline or after Options.CallTimeout, leaving nothing
// behind. A plugin that does not serve the DevicePlugin service, or whose
// list breaks the bounds, is refused with a pluginmanager.TerminalError.
func (h *Handler) Register(ctx context.Context, p pluginmanager.Plugin) error {
	if err := check(&p); err != nil {
		return pluginmanager.TerminalError(err)
	}
	// The stream outlives this call, so its context keeps ctx's values but
	// not its deadline; Deregister and Close cancel it.
	life, cancel := context.WithCancel(context.WithoutCancel(ctx))
	inst := &instance{plugin: p, cancel: cancel, done: make(chan struct{}), report: pluginmanager.EndpointReporter(ctx)}

	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		cancel()
		return errClosed
	}
	// The manager deregisters a socket before registering it again; this
	// only guards against a caller that does not.
	old := h.instances[p.Socket]
	if old != nil {
		h.removeLocked(old, "replaced by a new registration of its socket")
	}
	h.instances[p.Socket] = inst
	h.wg.Add(1)
	h.mu.Unlock()
	defer h.wg.Done()
	if old != nil {
		waitDone(ctx, old)
	}

	s, devs, err := h.open(life, ctx, p)
	h.mu.Lock()
	defer h.mu.Unlock()
	if err == nil && inst.gone {
		s.close()
		err = errClosed
	}
	if err != nil {
		cancel()
		close(inst.done)
		if h.instances[p.Socket] == inst {
			delete(h.instances, p.Socket)
		}
		if errors.Is(err, errBadPlugin) {
			return pluginmanager.TerminalError(err)
		}
		return err
	}

	h.serveLocked(life, inst, s, devs)
	return nil
}

// serveLocked makes inst, whose stream s is open with devs, an instance of
// its resource, taking the resource over from one that deregistered within
// the grace period (a restart), and runs its stream until life ends. h.mu
// is locked.
func (h *Handler) serveLocked(life context.Context, inst *instance, s *session, devs []Device) {
	now := time.Now()
	h.seq++
	inst.seq = h.seq
	inst.connected = true
	inst.options = s.options
	inst.devices = devs
	inst.since = now
	p := inst.plugin
	r := h.resources[p.Name]
	if r == nil {
		r = &resource{name: p.Name}
		h.resources[p.Name] = r
	}
	previous, restart := r.serving(), r.left != nil
	if restart {
		// The last instance deregistered within the grace period, as a
		// restarting plugin's does: this one takes the resource over.
		h.stopExpiryLocked(r)
	}
	r.instances = append(r.instances, inst)
	inst.res = r
	inst.report(nil) // the stream is up; run reports when it breaks and is back
	h.notifyLocked()
	h.wg.Go(func() { h.run(life, inst, s) })

	log := h.log.With("resource", p.Name, "socket", p.Socket, "endpoint", p.Endpoint)
	switch {
	case restart:
		log.Info("device plugin registered within the grace period; it takes over the resource", "devices", len(devs), "previous", previous.plugin.Socket)
	case previous != nil:
		log.Info("device plugin registered; it now serves the resource", "devices", len(devs), "previous", previous.plugin.Socket)
	default:
		log.Info("device plugin registered", "devices", len(devs))
	}
}

// Deregister stops the plugin's stream and forgets it. If it served its
// resource, the instance registered before it serves again. If there is
// none, the resource stays, disconnected and with its devices Unhealthy, for
// Options.GracePeriod: a new registration of the resource within that time,
// as a restarting plugin makes, takes it over with its own device list;
// without one, the resource is dropped then. It waits, until ctx is done,
// for the stream's goroutine to exit.
func (h *Handler) Deregister(ctx context.Context, p pluginmanager.Plugin) {
	h.mu.Lock()
	inst := h.instances[p.Socket]
	if inst != nil {
		h.removeLocked(inst, "deregistered")
	}
	h.mu.Unlock()
	if inst != nil {
		waitDone(ctx, inst)
	}
}

// waitDone waits for inst's goroutine (or Register) to finish, until ctx is done.
func waitDone(ctx context.Context, inst *instance) {
	select {
	case <-inst.done:
	case <-ctx.Done():
	}
}

// removeLocked stops inst and takes it out of its resource. If it was the
// last instance, the resource waits for a new one for the grace period, or
// is dropped at once if the handler is closing or inst was dropped already.
// h.mu must be held.
func (h *Handler) removeLocked(inst *instance, why string) {
	inst.gone = true
	inst.cancel()
	if h.instances[inst.plugin.Socket] == inst {
		delete(h.instances, inst.plugin.Socket)
	}
	r := inst.res
	if r == nil { // still in Register, which cleans up after itself
		return
	}
	wasServing := r.serving() == inst
	r.instances = slices.DeleteFunc(r.instances, func(i *instance) bool { return i == inst })
	log := h.log.With("resource", r.name, "socket", inst.plugin.Socket)
	switch {
	case len(r.instances) == 0 && (h.closed || inst.dropped):
		delete(h.resources, r.name)
		log.Info("device plugin "+why+"; resource dropped", "devices", len(inst.devices))
	case len(r.instances) == 0:
		now := time.Now()
		inst.connected = false
		inst.devices = unhealthy(inst.devices)
		inst.lastErr = "device plugin " + why
		inst.since = now
		r.left = inst
		h.wg.Add(1) // the expiry's call, unless stopExpiryLocked stops it first
		r.expiry = time.AfterFunc(h.opts.GracePeriod, func() {
			defer h.wg.Done()
			h.expireLeft(r, inst)
		})
		log.Info("device plugin "+why+"; its devices are Unhealthy until a new instance registers the resource",
			"devices", len(inst.devices), "grace", h.opts.GracePeriod)
	case wasServing:
		next := r.serving()
		next.since = time.Now()
		log.Info("device plugin "+why+"; the previous instance serves the resource again", "serving", next.plugin.Socket)
	default:
		log.Info("device plugin " + why)
	}
	h.notifyLocked()
}

// stopExpiryLocked ends the grace period of r, whose last instance
// deregistered: it no longer shows that instance, and will not be dropped
// for it. h.mu must be held.
func (h *Handler) stopExpiryLocked(r *resource) {
	if r.expiry.Stop() {
		h.wg.Done() // the call that will not happen
	}
	r.left, r.expiry = nil, nil
}

// expireLeft drops r at the end of the grace period that began when inst,
// its last instance, deregistered, unless a new instance registered it.
func (h *Handler) expireLeft(r *resource, inst *instance) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.resources[r.name] != r || r.left != inst {
		return
	}
	r.left, r.expiry = nil, nil
	delete(h.resources, r.name)
	h.log.Info("no new instance of the device plugin within the grace period; resource dropped",
		"resource", r.name, "socket", inst.plugin.Socket, "grace", h.opts.GracePeriod)
	h.notifyLocked()
}

// Close stops every stream and waits for the goroutines and the Register calls
// in flight to return. Resources is empty afterwards, the metrics are
// unregistered, and Register fails. It may be called more than once.
func (h *Handler) Close() {
	h.mu.Lock()
	first := !h.closed
	h.closed = true
	for _, inst := range h.instances {
		h.removeLocked(inst, "stopped by Close")
	}
	for name, r := range h.resources { // those waiting for a new instance
		if r.left != nil {
			h.stopExpiryLocked(r)
			delete(h.resources, name)
			h.notifyLocked()
		}
	}
	h.mu.Unlock()
	h.observed.Close()
	if first && h.reg != nil {
		h.reg.Unregister(collector{h})
	}
	h.wg.Wait()
}

// Changed returns a channel that is closed at the next change of what
// Resources or Details report: a device list, a stream's state, an instance
// coming or going. It never blocks the handler, and does not say what
// changed: read Resources again.
func (h *Handler) Changed() <-chan struct{} {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.changed
}

// notifyLocked wakes whoever waits on Changed. h.mu must be held.
func (h *Handler) notifyLocked() {
	close(h.changed)
	h.changed = make(chan struct{})
}

// Resources returns a snapshot of every registered resource, sorted by name.
// A resource whose last instance deregistered stays in it, disconnected and
// with its devices Unhealthy, for the grace period (see Deregister).
func (h *Handler) Resources() []Resource {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make([]Resource, 0, len(h.resources))
	for _, r := range h.resources {
		s := r.serving()
		out = append(out, Resource{
			Name:      r.name,
			Socket:    s.plugin.Socket,
			Endpoint:  s.plugin.Endpoint,
			Options:   s.options,
			Devices:   cloneDevices(s.devices),
			Connected: s.connected,
			Dropped:   s.dropped,
			LastError: s.lastErr,
			Since:     s.since,
		})
	}
	slices.SortFunc(out, func(a, b Resource) int { return cmp.Compare(a.Name, b.Name) })
	return out
}

// countByHealth counts devs by health, Healthy and Unhealthy both named
// even when none is.
func countByHealth(devs []Device) map[string]int {
	counts := map[string]int{plugdapi.DeviceHealthy: 0, plugdapi.DeviceUnhealthy: 0}
	for _, d := range devs {
		counts[d.Health]++
	}
	return counts
}

// cloneDevices copies devs deeply, so that a caller cannot change the handler's state.
func cloneDevices(devs []Device) []Device {
	if devs == nil {
		return nil
	}
	out := make([]Device, len(devs))
	for i, d := range devs {
		d.Topology = slices.Clone(d.Topology)
		out[i] = d
	}
	return out
}

var _ pluginmanager.Detailer = (*Handler)(nil)

// Details describes the registered instance p as a value that encodes to a
// JSON object: its resource, whether it serves it, whether its stream is up,
// and its devices, counted by health and listed. For a plugin seen in observe mode it
// describes the last look instead (marked "observed": true), with the device
// list then received. It returns nil for a plugin that is neither registered
// with the handler nor observed.
func (h *Handler) Details(p pluginmanager.Plugin) any {
	h.mu.Lock()
	defer h.mu.Unlock()
	inst := h.instances[p.Socket]
	if inst == nil || inst.res == nil || inst.plugin.Name != p.Name {
		return h.observedDetailsLocked(p)
	}
	return plugdapi.DevicePluginDetails{
		Resource:  inst.res.name,
		Endpoint:  inst.plugin.Endpoint,
		Serving:   inst.res.serving() == inst,
		Connected: inst.connected,
		Dropped:   inst.dropped,
		Devices:   countByHealth(inst.devices),
		Inventory: cloneDevices(inst.devices),
		Options:   inst.options,
		LastError: inst.lastErr,
		Since:     inst.since,
	}
}

// check is Validate's test of what the plugin said about itself. It makes
// p's endpoint the clean path that pluginmanager.EndpointPath gives.
func check(p *pluginmanager.Plugin) error {
	if !slices.Contains(p.Versions, api.Version) {
		return fmt.Errorf("device plugin %q offers versions %q, but this handler speaks only %s", p.Name, p.Versions, api.Version)
	}
	if err := checkResourceName(p.Name); err != nil {
		return fmt.Errorf("device plugin name %q is not an extended resource name: %w", p.Name, err)
	}
	ep, err := pluginmanager.EndpointPath(p.Endpoint)
	if err != nil {
		return fmt.Errorf("device plugin %q: %w", p.Name, err)
	}
	p.Endpoint = ep
	return nil
}
