package dra

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"k8s.io/apimachinery/pkg/util/validation"
	drahealthv1 "k8s.io/kubelet/pkg/apis/dra-health/v1"
	drahealthv1alpha1 "k8s.io/kubelet/pkg/apis/dra-health/v1alpha1"
	drav1 "k8s.io/kubelet/pkg/apis/dra/v1"
	drav1beta1 "k8s.io/kubelet/pkg/apis/dra/v1beta1"
	"k8s.io/utils/clock"

	"github.com/plugd/plugd/api"
	"github.com/plugd/plugd/handlers/internal/defaults"
	"github.com/plugd/plugd/handlers/internal/observed"
	"github.com/plugd/plugd/pluginmanager"
)

// Type is the plugin type this handler is for.
const Type = api.DRAPlugin

// ErrClosed is returned by Register once Close has been called.
var ErrClosed = errors.New("dra: handler closed")

// The services a DRA plugin may advertise in its versions, as gRPC service
// names, newest first. The DRA service used is the plugin's choice: the first
// in its order that is known here; the health service is the kubelet's (v1.37):
// the first of these that the plugin advertises.
var (
	draServices    = []string{drav1.DRAPluginService, drav1beta1.DRAPluginService}
	healthServices = []string{drahealthv1.DRAResourceHealthService, drahealthv1alpha1.DRAResourceHealthService}
)

const (
	// maxDevices bounds the device health entries kept per driver, so that a
	// plugin cannot make the handler grow without limit.
	maxDevices = 1024
	// maxMessageLen bounds a device's health message, and a plugin's error
	// message in the logs; longer ones are cut, as the kubelet cuts them.
	maxMessageLen = 1024
	// maxNameLen bounds a pool or device name taken from a health report.
	maxNameLen = 253
	// maxHealthMessageSize bounds one health report as received: ample for
	// maxDevices devices, and small enough that a plugin cannot make the
	// handler decode, and walk under its lock, a report of any size.
	maxHealthMessageSize = 256 << 10
	// The pace of a health stream (see package pacing): reports of 512 KiB
	// a second (a report of maxDevices devices is about 70 KiB), 1 MiB at
	// once, each counted as at least 1 KiB. A driver that sends faster
	// waits in its own Send, held back by gRPC's flow control with a window
	// of windowBytes (rather than one that grows to 16 MiB).
	healthBytesPerSecond = 512 << 10
	healthBurst          = 1 << 20
	minHealthCost        = 1 << 10
	windowBytes          = 1 << 20
	// defaultHealthTimeout is how long a device's reported health holds when the
	// plugin names no timeout of its own: the kubelet's default.
	defaultHealthTimeout = 30 * time.Second
	// maxHealthTimeout bounds the health check timeout a plugin may name.
	maxHealthTimeout = time.Hour
)

// Options configure a Handler. The zero value of every field means the default
// written beside it.
type Options struct {
	// Logger receives the handler's logs. Nil discards them.
	Logger *slog.Logger

	// Registerer, if set, receives the handler's Prometheus metrics:
	//
	//	plugd_dra_instances{state}       instances, "connected" or "disconnected"
	//	plugd_dra_drivers                drivers known
	//	plugd_dra_drivers_available      drivers available
	//	plugd_dra_devices{health}        devices by reported health
	Registerer prometheus.Registerer

	// GracePeriod is how long a driver may be without a connected instance
	// before it is reported unavailable; it is also how long a driver whose
	// instances have all been deregistered is remembered, so that a driver
	// restarting in place never looks unavailable. Zero means
	// DefaultGracePeriod, the kubelet's.
	GracePeriod time.Duration

	// CallTimeout bounds connecting to a plugin's endpoint in Register (the
	// manager's deadline for the call applies as well). Zero means
	// DefaultCallTimeout.
	CallTimeout time.Duration

	// Clock tells the time of what the handler records (registrations,
	// disconnections, health reports) and when reported health goes stale,
	// and paces the health streams; tests set a fake one. Nil means the real
	// clock.
	Clock clock.Clock

	// EndpointRoots, if set, are the directories endpoints must be in: the
	// manager's Options.EndpointRoots. The manager checks an endpoint when
	// its plugin registers; the handler checks again at every connection,
	// reconnections included, and refuses an endpoint that resolves outside
	// them by then (one swapped for a symlink, say).
	EndpointRoots []string

	// Changed, if set, is called at every change of the handler's state,
	// a device's reported health among them, with the handler's lock held:
	// it must not block, nor call the handler. plugd's node agent judges
	// a driver's devices by their health, within a second of a report.
	Changed func()
}

// Handler is the pluginmanager.Handler for DRA drivers (type "DRAPlugin"),
// such as those built with k8s.io/dynamic-resource-allocation/kubeletplugin.
//
// It keeps a gRPC connection to every registered instance's endpoint and
// watches its state; of a driver's connected instances the newest serves. A
// driver left without a connected instance for Options.GracePeriod is
// reported unavailable until one connects again. Instances that advertise the
// DRAResourceHealth service have their devices' health followed.
//
// Create one with New and end it with Close. Its methods are safe for
// concurrent use.
type Handler struct {
	opts      Options
	log       *slog.Logger
	collector *collector

	mu      sync.Mutex
	closed  bool
	drivers map[string]*driver   // by driver name
	sockets map[string]*instance // by registration socket
	seq     uint64               // orders registrations: newest is highest
	changed chan struct{}        // closed and replaced on every change; see notifyLocked

	// observed holds what Observe saw, by registration socket; observe mode only.
	observed *observed.Table[*observation]
	// followed are the health streams of observed drivers, by registration
	// socket.
	followed map[string]*observedHealth

	// registering holds the cancel function of every Register in flight, for
	// Close to end them.
	registering map[*context.CancelCauseFunc]struct{}

	// observe, if set, is called with mu held at every change of state, before
	// notifyLocked wakes the waiters: tests see every state through it, which
	// the coalescing changed channel does not promise.
	observe func()

	wg sync.WaitGroup // every instance goroutine, and every Register in flight
}

// driver is one DRA driver and everything registered under its name.
type driver struct {
	name      string
	instances map[string]*instance // by registration socket

	// lostAt is when the driver was last left without a connected instance,
	// zero while one is connected.
	lostAt           time.Time
	available        bool
	unavailableSince time.Time
	timer            *time.Timer // runs out the grace period after lostAt
	timerGen         uint64      // invalidates a timer that fired while being stopped

	devices        map[deviceKey]*device
	devicesDropped int  // devices named in reports while maxDevices were kept
	overflow       bool // a report named more devices than maxDevices; logged once
}

// instance is one registration socket of a driver and its connection.
type instance struct {
	driver        *driver
	socket        string
	endpoint      string
	service       string
	healthService string // empty if none is advertised, or the plugin said Unimplemented
	registeredAt  time.Time
	seq           uint64

	connected      bool
	disconnectedAt time.Time
	report         func(error) // tells the manager whether the endpoint serves
	// An endpoint that keeps dropping its connection is warned of at most
	// once per lossWarnEvery: when it last was, the losses since, and
	// whether the last one was left at debug level.
	lossWarned time.Time
	losses     int
	quietLoss  bool

	conn   *grpc.ClientConn
	cancel context.CancelFunc
	done   chan struct{} // closed when the instance's goroutines have returned
}

type deviceKey struct{ pool, device string }

type device struct {
	health      Health
	message     string
	lastUpdated time.Time
	receivedAt  time.Time
	timeout     time.Duration
}

// Health is a device's health as its driver reports it.
type Health string

// The health values a device may have. A device whose driver has not
// refreshed its health within the driver's timeout is Unknown.
const (
	Healthy   Health = "Healthy"
	Unhealthy Health = "Unhealthy"
	Unknown   Health = "Unknown"
)

// Driver is a snapshot of one DRA driver.
type Driver struct {
	Name string `json:"name"`
	// Serving is the registration socket of the instance that serves the
	// driver: the newest connected one. It is empty when none is connected.
	Serving string `json:"serving,omitempty"`
	// Available is false once the driver has been without a connected
	// instance for longer than the grace period, since UnavailableSince.
	Available        bool      `json:"available"`
	UnavailableSince time.Time `json:"unavailableSince,omitzero"`
	// Instances are the driver's registered sockets, newest first. It is empty
	// for a driver whose instances have all gone, during the grace period.
	Instances []Instance `json:"instances"`
	// Devices are the devices whose health the driver reported, sorted by pool
	// and device name. Names and messages are as the driver sent them, with
	// characters that are not printable written as Go escapes (\n, \u202e),
	// and cut to a bounded length.
	Devices []DeviceHealth `json:"devices,omitempty"`
	// DevicesDropped counts the new devices the driver's health reports named
	// while 1024 devices were already kept, and so were not followed.
	DevicesDropped int `json:"devicesDropped,omitempty"`
}

// Instance is a snapshot of one registered instance of a driver (plugd's
// status API type).
type Instance = api.DRAInstance

// DeviceHealth is the last health a driver reported for one of its devices.
type DeviceHealth struct {
	Pool    string `json:"pool"`
	Device  string `json:"device"`
	Health  Health `json:"health"`
	Message string `json:"message,omitempty"`
	// LastUpdated is when the driver determined the health, zero if it did
	// not say; ReceivedAt is when the handler received it.
	LastUpdated time.Time `json:"lastUpdated,omitzero"`
	ReceivedAt  time.Time `json:"receivedAt"`
}

// InstanceStatus is what Details returns: one instance, and where it stands
// within its driver (plugd's status API type).
type InstanceStatus = api.DRADetails

// What a zero Options.GracePeriod and Options.CallTimeout mean; the
// deviceplugin handler's are the same.
const (
	DefaultGracePeriod = defaults.GracePeriod // 30s
	DefaultCallTimeout = defaults.CallTimeout // 10s
)

// New returns a Handler for opts. Nothing runs until a plugin registers. It
// panics if opts.Registerer refuses the handler's metrics (as
// prometheus.MustRegister does), which happens when two handlers share a
// registry.
func New(opts Options) *Handler {
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.GracePeriod <= 0 {
		opts.GracePeriod = DefaultGracePeriod
	}
	if opts.CallTimeout <= 0 {
		opts.CallTimeout = DefaultCallTimeout
	}
	if opts.Clock == nil {
		opts.Clock = clock.RealClock{}
	}
	h := &Handler{
		opts:        opts,
		log:         opts.Logger,
		drivers:     make(map[string]*driver),
		sockets:     make(map[string]*instance),
		changed:     make(chan struct{}),
		registering: make(map[*context.CancelCauseFunc]struct{}),
		followed:    make(map[string]*observedHealth),
	}
	h.observed = observed.New[*observation](&h.mu, h.notifyLocked, opts.CallTimeout, opts.EndpointRoots)
	if opts.Registerer != nil {
		h.collector = newCollector(h)
		opts.Registerer.MustRegister(h.collector)
	}
	return h
}

// Validate accepts a plugin whose name is a DNS subdomain, whose endpoint
// follows pluginmanager.EndpointPath, and whose versions name a DRA service
// this handler speaks.
func (h *Handler) Validate(_ context.Context, p pluginmanager.Plugin) error {
	_, _, err := check(&p)
	return err
}

// check validates p and returns the DRA service and health service (if any)
// to use, as the kubelet chooses them: the DRA service first in the plugin's
// order, the health service first in healthServices' order. It makes p's
// endpoint the clean path that pluginmanager.EndpointPath gives.
func check(p *pluginmanager.Plugin) (service, health string, err error) {
	if msgs := validation.IsDNS1123Subdomain(p.Name); len(msgs) > 0 {
		return "", "", fmt.Errorf("driver name %q is not a DNS subdomain: %s", p.Name, strings.Join(msgs, "; "))
	}
	ep, err := pluginmanager.EndpointPath(p.Endpoint)
	if err != nil {
		return "", "", fmt.Errorf("DRA driver %q: %w", p.Name, err)
	}
	p.Endpoint = ep
	for _, v := range p.Versions {
		if slices.Contains(draServices, v) {
			service = v
			break
		}
	}
	for _, h := range healthServices {
		if slices.Contains(p.Versions, h) {
			health = h
			break
		}
	}
	if service == "" {
		return "", "", fmt.Errorf("driver %q offers none of the DRA services supported (%s); it offers %q",
			p.Name, strings.Join(draServices, ", "), p.Versions)
	}
	return service, health, nil
}

// Register connects to the plugin's endpoint and waits, within
// Options.CallTimeout, for the connection to be ready; a plugin that is not
// reachable is refused and retried by the manager. The instance then joins its
// driver and, being the newest connected, serves it. Close ends a call in
// flight, which then returns ErrClosed.
func (h *Handler) Register(ctx context.Context, p pluginmanager.Plugin) error {
	service, health, err := check(&p)
	if err != nil {
		return pluginmanager.TerminalError(err)
	}
	ctx, cancelCall := context.WithCancelCause(ctx)
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		cancelCall(nil)
		return ErrClosed
	}
	h.registering[&cancelCall] = struct{}{}
	h.wg.Add(1)
	h.mu.Unlock()
	defer func() {
		h.mu.Lock()
		delete(h.registering, &cancelCall)
		h.mu.Unlock()
		cancelCall(nil)
		h.wg.Done()
	}()

	conn, err := h.connect(ctx, p)
	if err != nil {
		if errors.Is(context.Cause(ctx), ErrClosed) {
			return ErrClosed
		}
		return err
	}

	// The instance's goroutines outlive this call: they keep the context's
	// values but not its deadline, and end with Deregister or Close.
	ictx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	in := &instance{
		socket:        p.Socket,
		endpoint:      p.Endpoint,
		service:       service,
		healthService: health,
		registeredAt:  h.opts.Clock.Now(),
		connected:     true,
		report:        pluginmanager.EndpointReporter(ctx),
		conn:          conn,
		cancel:        cancel,
		done:          make(chan struct{}),
	}

	if err := h.join(ctx, ictx, in, p.Name); err != nil {
		return err
	}
	h.log.Info("DRA driver instance registered", "driver", p.Name, "socket", p.Socket,
		"endpoint", p.Endpoint, "service", service, "healthService", health)
	return nil
}

// join makes in, connected, an instance of the driver name, and the newest,
// which serves it; its goroutines run until ictx ends. An instance
// registered before at its socket is stopped, and waited for until ctx is
// done. It returns ErrClosed after Close.
func (h *Handler) join(ctx, ictx context.Context, in *instance, name string) error {
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		in.stop()
		return ErrClosed
	}
	// The manager deregisters a socket before registering it again; should a
	// registration it abandoned have completed here anyway, the new one wins.
	old := h.sockets[in.socket]
	if old != nil {
		h.removeLocked(old)
	}
	d := h.drivers[name]
	if d == nil {
		d = &driver{name: name, instances: make(map[string]*instance), available: true, devices: make(map[deviceKey]*device)}
		h.drivers[name] = d
	}
	h.seq++
	in.seq = h.seq
	in.driver = d
	d.instances[in.socket] = in
	h.sockets[in.socket] = in
	h.updateLocked(d)
	in.report(nil) // connected: it serves, and the instance's watch says when that changes
	h.start(ictx, in)
	h.notifyLocked()
	h.mu.Unlock()

	if old != nil {
		old.stop()
		select {
		case <-old.done:
		case <-ctx.Done():
		}
	}
	return nil
}

// Deregister stops following the instance and closes its connection; the
// driver's next newest connected instance serves it. It waits for the
// instance's goroutines until ctx is done (Close waits for the rest).
func (h *Handler) Deregister(ctx context.Context, p pluginmanager.Plugin) {
	h.mu.Lock()
	in := h.sockets[p.Socket]
	if in == nil {
		h.mu.Unlock()
		return
	}
	h.removeLocked(in)
	h.notifyLocked()
	h.mu.Unlock()

	in.stop()
	select {
	case <-in.done:
	case <-ctx.Done():
		h.log.Warn("DRA driver instance did not stop in time", "driver", p.Name, "socket", p.Socket)
	}
	h.log.Info("DRA driver instance deregistered", "driver", p.Name, "socket", p.Socket)
}

// Close deregisters every instance, closes their connections, ends every
// Register in flight and waits for them and all the handler's goroutines.
// Register fails with ErrClosed afterwards. It may be called more than once.
func (h *Handler) Close() {
	h.mu.Lock()
	first := !h.closed
	h.closed = true
	for cancel := range h.registering {
		(*cancel)(ErrClosed)
	}
	var stop []*instance
	for _, in := range h.sockets {
		stop = append(stop, in)
	}
	for _, d := range h.drivers {
		d.stopTimer()
	}
	clear(h.sockets)
	clear(h.drivers)
	for _, f := range h.followed {
		f.cancel()
	}
	clear(h.followed)
	h.notifyLocked()
	h.mu.Unlock()
	h.observed.Close()

	for _, in := range stop {
		in.stop()
	}
	h.wg.Wait()
	if first && h.collector != nil {
		h.opts.Registerer.Unregister(h.collector)
	}
}

// removeLocked takes in out of its driver.
func (h *Handler) removeLocked(in *instance) {
	delete(h.sockets, in.socket)
	d := in.driver
	delete(d.instances, in.socket)
	h.updateLocked(d)
}

// stop ends the instance's goroutines and closes its connection.
func (in *instance) stop() {
	in.cancel()
	in.conn.Close()
}

// setConnected records a change in the instance's connection, and tells
// the manager (pluginmanager.EndpointReporter): a lost connection makes
// the plugin Unhealthy, reason endpoint.
func (h *Handler) setConnected(in *instance, connected bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.sockets[in.socket] != in || in.connected == connected {
		return
	}
	in.connected = connected
	now := h.opts.Clock.Now()
	if connected {
		in.disconnectedAt = time.Time{}
		if in.quietLoss {
			h.log.Debug("DRA driver instance connected", "driver", in.driver.name, "socket", in.socket) // so was the loss
		} else {
			h.log.Info("DRA driver instance connected", "driver", in.driver.name, "socket", in.socket)
		}
		in.report(nil)
	} else {
		in.disconnectedAt = now
		in.losses++
		in.quietLoss = !in.lossWarned.IsZero() && now.Sub(in.lossWarned) < lossWarnEvery
		const msg = "DRA driver instance lost its connection"
		if in.quietLoss {
			h.log.Debug(msg, "driver", in.driver.name, "socket", in.socket, "endpoint", in.endpoint)
		} else {
			h.log.Warn(msg, "driver", in.driver.name, "socket", in.socket, "endpoint", in.endpoint, "losses", in.losses)
			in.lossWarned, in.losses = now, 0
		}
		in.report(fmt.Errorf("DRA endpoint %s: the connection to it was lost", in.endpoint))
	}
	h.updateLocked(in.driver)
	h.notifyLocked()
}

// updateLocked re-derives d's availability after its instances changed: a
// connected instance makes it available at once; losing the last one starts
// the grace period, at the end of which expire reports it unavailable (or
// forgets it, if no instance is left at all).
func (h *Handler) updateLocked(d *driver) {
	for _, in := range d.instances {
		if in.connected {
			d.stopTimer()
			d.lostAt = time.Time{}
			if !d.available {
				h.log.Info("DRA driver available again", "driver", d.name)
			}
			d.available = true
			d.unavailableSince = time.Time{}
			return
		}
	}
	if !d.available && len(d.instances) == 0 {
		// Already past its grace period: nothing left to wait for.
		h.forgetLocked(d)
		return
	}
	if d.lostAt.IsZero() {
		d.lostAt = h.opts.Clock.Now()
		d.timerGen++
		gen := d.timerGen
		d.timer = time.AfterFunc(h.opts.GracePeriod, func() { h.expire(d, gen) })
	}
}

// expire ends a driver's grace period, unless a connected instance ended it
// first.
func (h *Handler) expire(d *driver, gen uint64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed || h.drivers[d.name] != d || d.timerGen != gen {
		return
	}
	d.timer = nil
	if len(d.instances) == 0 {
		h.log.Info("DRA driver gone: no instance came back within the grace period", "driver", d.name, "gracePeriod", h.opts.GracePeriod)
		h.forgetLocked(d)
	} else {
		d.available = false
		d.unavailableSince = h.opts.Clock.Now()
		h.log.Warn("DRA driver unavailable: no instance connected within the grace period", "driver", d.name, "gracePeriod", h.opts.GracePeriod)
	}
	h.notifyLocked()
}

func (h *Handler) forgetLocked(d *driver) {
	d.stopTimer()
	if h.drivers[d.name] == d {
		delete(h.drivers, d.name)
	}
}

func (d *driver) stopTimer() {
	if d.timer != nil {
		d.timer.Stop()
		d.timer = nil
	}
	d.timerGen++
}

// notifyLocked wakes whoever waits on changed (the tests).
func (h *Handler) notifyLocked() {
	if h.observe != nil {
		h.observe()
	}
	if h.opts.Changed != nil {
		h.opts.Changed()
	}
	close(h.changed)
	h.changed = make(chan struct{})
}

// changes returns a channel that is closed at the next change of state.
func (h *Handler) changes() <-chan struct{} {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.changed
}

// serving returns the newest connected instance of d, or nil.
func (d *driver) serving() *instance {
	var best *instance
	for _, in := range d.instances {
		if in.connected && (best == nil || in.seq > best.seq) {
			best = in
		}
	}
	return best
}

// Drivers returns a snapshot of every driver known, sorted by name. It is
// safe to call at any time.
func (h *Handler) Drivers() []Driver {
	now := h.opts.Clock.Now()
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make([]Driver, 0, len(h.drivers))
	for _, d := range h.drivers {
		out = append(out, d.snapshot(now))
	}
	slices.SortFunc(out, func(a, b Driver) int { return strings.Compare(a.Name, b.Name) })
	return out
}

func (d *driver) snapshot(now time.Time) Driver {
	s := Driver{
		Name:             d.name,
		Available:        d.available,
		UnavailableSince: d.unavailableSince,
		Instances:        make([]Instance, 0, len(d.instances)),
		DevicesDropped:   d.devicesDropped,
	}
	if in := d.serving(); in != nil {
		s.Serving = in.socket
	}
	ins := make([]*instance, 0, len(d.instances))
	for _, in := range d.instances {
		ins = append(ins, in)
	}
	slices.SortFunc(ins, func(a, b *instance) int { return cmp.Compare(b.seq, a.seq) }) // newest first
	for _, in := range ins {
		s.Instances = append(s.Instances, in.snapshot())
	}
	for k, dev := range d.devices {
		health := dev.healthAt(now)
		s.Devices = append(s.Devices, DeviceHealth{
			Pool: k.pool, Device: k.device, Health: health, Message: dev.message,
			LastUpdated: dev.lastUpdated, ReceivedAt: dev.receivedAt,
		})
	}
	slices.SortFunc(s.Devices, func(a, b DeviceHealth) int {
		if c := strings.Compare(a.Pool, b.Pool); c != 0 {
			return c
		}
		return strings.Compare(a.Device, b.Device)
	})
	return s
}

// healthAt is the device's health at now: Unknown once it was not
// refreshed in time, as what was reported no longer holds.
func (dev *device) healthAt(now time.Time) Health {
	if now.Sub(dev.receivedAt) > dev.timeout {
		return Unknown
	}
	return dev.health
}

// deviceHealth is the health of d's devices at now, as Details shows it:
// by pool and device, without the times (a report that changes nothing
// changes no Details).
func (d *driver) deviceHealth(now time.Time) []api.DRADeviceHealth {
	if len(d.devices) == 0 {
		return nil
	}
	out := make([]api.DRADeviceHealth, 0, len(d.devices))
	for k, dev := range d.devices {
		out = append(out, api.DRADeviceHealth{Pool: k.pool, Device: k.device, Health: string(dev.healthAt(now)), Message: dev.message})
	}
	slices.SortFunc(out, func(a, b api.DRADeviceHealth) int {
		return cmp.Or(strings.Compare(a.Pool, b.Pool), strings.Compare(a.Device, b.Device))
	})
	return out
}

func (in *instance) snapshot() Instance {
	return Instance{
		Socket:         in.socket,
		Endpoint:       in.endpoint,
		Service:        in.service,
		HealthService:  in.healthService,
		Connected:      in.connected,
		RegisteredAt:   in.registeredAt,
		DisconnectedAt: in.disconnectedAt,
	}
}

var _ pluginmanager.Detailer = (*Handler)(nil)

// Details describes the instance registered at p's socket as an
// *InstanceStatus, or, for a plugin seen in observe mode, the last look at it
// as an *ObservedStatus; it returns nil if there is neither. plugd's status
// API shows it as the plugin's details.
func (h *Handler) Details(p pluginmanager.Plugin) any {
	h.mu.Lock()
	defer h.mu.Unlock()
	in := h.sockets[p.Socket]
	if in == nil {
		return h.observedLocked(p)
	}
	return &InstanceStatus{
		Driver:          in.driver.name,
		DRAInstance:     in.snapshot(),
		Serving:         in.driver.serving() == in,
		DriverAvailable: in.driver.available,
		Devices:         in.driver.deviceHealth(h.opts.Clock.Now()),
	}
}
