package deviceplugin_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	api "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	testingclock "k8s.io/utils/clock/testing"

	plugdapi "github.com/plugd/plugd/api"
	"github.com/plugd/plugd/handlers/deviceplugin"
	"github.com/plugd/plugd/internal/testenv"
	"github.com/plugd/plugd/plugin"
	"github.com/plugd/plugd/pluginmanager"
	"github.com/plugd/plugd/plugintest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

const gpu = "example.com/gpu"

// devicePlugin is a device plugin speaking the real v1beta1 service. Its
// ListAndWatch sends the current list, then every list set gives it.
type devicePlugin struct {
	api.UnimplementedDevicePluginServer
	options *api.DevicePluginOptions

	// hang, if set, makes GetDevicePluginOptions tell it was called, then
	// answer only when the caller gives up.
	hang chan<- struct{}

	mu             sync.Mutex
	devices        []*api.Device
	silent         bool          // ListAndWatch sends nothing
	once           bool          // ListAndWatch ends the stream after its first list
	stopped        bool          // ListAndWatch fails at once
	devicesChanged chan struct{} // closed and replaced by set and stop
	active         int           // ListAndWatch calls in progress
	activeChanged  chan struct{} // closed and replaced when active changes
}

func newDevicePlugin(devs ...*api.Device) *devicePlugin {
	return &devicePlugin{devices: devs, devicesChanged: make(chan struct{}), activeChanged: make(chan struct{})}
}

func dev(id, health string, numa ...int64) *api.Device {
	d := &api.Device{ID: id, Health: health}
	if len(numa) > 0 {
		d.Topology = &api.TopologyInfo{}
		for _, n := range numa {
			d.Topology.Nodes = append(d.Topology.Nodes, &api.NUMANode{ID: n})
		}
	}
	return d
}

func (p *devicePlugin) register(s grpc.ServiceRegistrar) { api.RegisterDevicePluginServer(s, p) }

// set replaces the device list and sends it on every open stream.
func (p *devicePlugin) set(devs ...*api.Device) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.devices = devs
	p.silent = false
	close(p.devicesChanged)
	p.devicesChanged = make(chan struct{})
}

// stop ends every stream with an error, and fails those opened later: the
// plugin's process is alive but its device service is not.
func (p *devicePlugin) stop() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.stopped = true
	close(p.devicesChanged)
	p.devicesChanged = make(chan struct{})
}

func (p *devicePlugin) setActive(delta int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.active += delta
	close(p.activeChanged)
	p.activeChanged = make(chan struct{})
}

// waitIdle waits until no ListAndWatch call is in progress.
func (p *devicePlugin) waitIdle(t *testing.T) {
	t.Helper()
	deadline := time.After(testenv.Timeout)
	for {
		p.mu.Lock()
		n, changed := p.active, p.activeChanged
		p.mu.Unlock()
		if n == 0 {
			return
		}
		select {
		case <-changed:
		case <-deadline:
			t.Fatalf("%d ListAndWatch streams still open", n)
		}
	}
}

func (p *devicePlugin) GetDevicePluginOptions(ctx context.Context, _ *api.Empty) (*api.DevicePluginOptions, error) {
	if p.hang != nil {
		p.hang <- struct{}{}
		<-ctx.Done()
		return nil, ctx.Err()
	}
	if p.options == nil {
		return &api.DevicePluginOptions{}, nil
	}
	return p.options, nil
}

func (p *devicePlugin) ListAndWatch(_ *api.Empty, s api.DevicePlugin_ListAndWatchServer) error {
	p.setActive(1)
	defer p.setActive(-1)
	for {
		p.mu.Lock()
		devs, silent, once, stopped, changed := p.devices, p.silent, p.once, p.stopped, p.devicesChanged
		p.mu.Unlock()
		if stopped {
			return status.Error(codes.Unavailable, "device service stopped")
		}
		if !silent {
			if err := s.Send(&api.ListAndWatchResponse{Devices: devs}); err != nil {
				return err
			}
			if once {
				return nil
			}
		}
		select {
		case <-s.Context().Done():
			return nil
		case <-changed:
		}
	}
}

// env is a manager on a fresh registry directory with a device plugin handler
// added for type DevicePlugin, and the registry of the handler's metrics.
type env struct {
	t   *testing.T
	h   *deviceplugin.Handler
	pm  *plugintest.Manager
	m   *pluginmanager.Manager
	sub *pluginmanager.Subscription
	reg *prometheus.Registry
	clk *testingclock.FakeClock // set by the observe tests
	dir string
}

func newEnv(t *testing.T, opts deviceplugin.Options) *env {
	t.Helper()
	e := &env{t: t, reg: prometheus.NewPedanticRegistry()}
	opts.Registerer = e.reg
	if opts.ReconnectBackoff == 0 {
		opts.ReconnectBackoff = 10 * time.Millisecond
		opts.ReconnectBackoffMax = 50 * time.Millisecond
	}
	e.h = deviceplugin.New(opts)
	// Registered first, so run last: after the manager has stopped.
	t.Cleanup(func() { e.h.Close() })
	e.startManager(pluginmanager.Options{BackoffInitial: 20 * time.Millisecond, BackoffMax: 200 * time.Millisecond})
	return e
}

// startManager runs a manager with opts and e.h for DevicePlugin, until the
// end of the test.
func (e *env) startManager(opts pluginmanager.Options) {
	e.t.Helper()
	e.pm = plugintest.NewManagerWith(e.t, opts, map[string]pluginmanager.Handler{deviceplugin.Type: e.h})
	e.pm.Timeout = testenv.Timeout
	e.m = e.pm.Manager()
	e.dir = e.pm.Dir
	e.sub = e.m.Subscribe()
}

// startPlugin registers a device plugin through the manager, its socket
// named after the plugin's name, and closes it at the end of the test.
func (e *env) startPlugin(cfg plugin.Config) *plugin.Server {
	e.t.Helper()
	cfg.Dir = e.dir
	cfg.Type = deviceplugin.Type
	if cfg.Versions == nil {
		cfg.Versions = []string{"v1beta1"}
	}
	s, err := plugin.Start(cfg)
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { s.Close() })
	return s
}

// registered waits until the manager told the plugin it is registered: the
// handler's Register has returned, so its devices are known.
func registered(t *testing.T, s *plugin.Server) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testenv.Timeout)
	defer cancel()
	if err := s.WaitRegistered(ctx); err != nil {
		t.Fatal(err)
	}
}

// serveEndpoint serves dp on a unix socket at path, outside the registry
// directory, as a plugin with an endpoint of its own does; Stop kills it.
func serveEndpoint(t *testing.T, path string, dp *devicePlugin) *testenv.GRPCServer {
	t.Helper()
	return testenv.ServeGRPC(t, path, dp.register)
}

// until waits, for at most within, for cond to hold on the handler's
// resources (by name), re-checking on every change.
func (e *env) until(what string, within time.Duration, cond func(map[string]deviceplugin.Resource) bool) map[string]deviceplugin.Resource {
	e.t.Helper()
	deadline := time.After(within)
	for {
		changed := e.h.Changed()
		byName := make(map[string]deviceplugin.Resource)
		for _, r := range e.h.Resources() {
			byName[r.Name] = r
		}
		if cond(byName) {
			return byName
		}
		select {
		case <-changed:
		case <-deadline:
			e.t.Fatalf("not within %s: %s; resources: %+v", within, what, byName)
		}
	}
}

// reconnects returns the value of plugd_deviceplugin_stream_reconnects_total
// for resource, or -1 if there is no such series.
func (e *env) reconnects(resource string) int {
	e.t.Helper()
	mfs, err := e.reg.Gather()
	if err != nil {
		e.t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "plugd_deviceplugin_stream_reconnects_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "resource" && l.GetValue() == resource {
					return int(m.GetCounter().GetValue())
				}
			}
		}
	}
	return -1
}

// resource returns the resource name, failing the test if there is none.
func (e *env) resource(name string) deviceplugin.Resource {
	e.t.Helper()
	for _, r := range e.h.Resources() {
		if r.Name == name {
			return r
		}
	}
	e.t.Fatalf("no resource %s in %+v", name, e.h.Resources())
	return deviceplugin.Resource{}
}

// instanceDetails is Details as plugd's status API encodes it.
type instanceDetails struct {
	Resource  string                `json:"resource"`
	Endpoint  string                `json:"endpoint"`
	Serving   bool                  `json:"serving"`
	Connected bool                  `json:"connected"`
	Dropped   bool                  `json:"dropped"`
	Devices   map[string]int        `json:"devices"`
	Inventory []deviceplugin.Device `json:"inventory"`
	Options   map[string]any        `json:"options"`
	LastError string                `json:"lastError"`
}

// details returns the handler's Details of the plugin registered on socket,
// through JSON.
func (e *env) details(socket string) instanceDetails {
	e.t.Helper()
	var p pluginmanager.Plugin
	for _, s := range e.m.Plugins() {
		if s.Socket == socket {
			p = s.Plugin
		}
	}
	d := e.h.Details(p)
	switch d.(type) {
	case nil:
		e.t.Fatalf("no details for %s", socket)
	case plugdapi.DevicePluginDetails, plugdapi.DevicePluginObserved:
	default:
		e.t.Fatalf("details of %s are a %T; plugd's node agent reads an api.DevicePluginDetails or an api.DevicePluginObserved", socket, d)
	}
	b, err := json.Marshal(d)
	if err != nil {
		e.t.Fatal(err)
	}
	var out instanceDetails
	if err := json.Unmarshal(b, &out); err != nil {
		e.t.Fatal(err)
	}
	return out
}

func ids(r deviceplugin.Resource) []string {
	var out []string
	for _, d := range r.Devices {
		out = append(out, d.ID)
	}
	return out
}

func allUnhealthy(r deviceplugin.Resource) bool {
	for _, d := range r.Devices {
		if d.Health != api.Unhealthy {
			return false
		}
	}
	return len(r.Devices) > 0
}

func TestRegisterOnRegistrationSocket(t *testing.T) {
	e := newEnv(t, deviceplugin.Options{})
	dp := newDevicePlugin(dev("gpu-1", api.Healthy, 0), dev("gpu-0", api.Healthy))
	dp.options = &api.DevicePluginOptions{PreStartRequired: true}
	before := time.Now()
	s := e.startPlugin(plugin.Config{Name: gpu, Socket: "gpu.sock", Services: dp.register})
	registered(t, s)

	r := e.resource(gpu)
	wantDevices := []deviceplugin.Device{{ID: "gpu-0", Health: api.Healthy}, {ID: "gpu-1", Health: api.Healthy, Topology: []int64{0}}}
	if r.Socket != s.Path() || r.Endpoint != s.Path() || !r.Connected || r.Dropped || r.LastError != "" || r.Since.Before(before) {
		t.Errorf("resource = %+v, want served from %s, connected, since registration", r, s.Path())
	}
	if !r.Options.PreStartRequired || r.Options.GetPreferredAllocationAvailable {
		t.Errorf("options = %+v, want what the plugin answered", r.Options)
	}
	if !reflect.DeepEqual(r.Devices, wantDevices) {
		t.Errorf("devices = %+v, want %+v", r.Devices, wantDevices)
	}
	// Issue 25, item 10: the details list the devices, by ID, as an
	// observer's do; before, they only counted them.
	want := instanceDetails{
		Resource: gpu, Endpoint: s.Path(), Serving: true, Connected: true,
		Devices:   map[string]int{api.Healthy: 2, api.Unhealthy: 0},
		Inventory: wantDevices,
		Options:   map[string]any{"preStartRequired": true},
	}
	if d := e.details(s.Path()); !reflect.DeepEqual(d, want) {
		t.Errorf("details = %+v, want %+v", d, want)
	}
	if d := e.h.Details(pluginmanager.Plugin{Type: deviceplugin.Type, Name: gpu, Socket: "/nowhere.sock"}); d != nil {
		t.Errorf("details of an unknown plugin = %+v, want nil", d)
	}

	// A snapshot is a copy.
	r.Devices[1].Topology[0] = 7
	if got := e.resource(gpu).Devices[1].Topology[0]; got != 0 {
		t.Errorf("changing a snapshot changed the handler's state: topology %d", got)
	}

	// A device turning Unhealthy shows at once.
	dp.set(dev("gpu-0", api.Healthy), dev("gpu-1", "Broken"), dev("gpu-2", api.Healthy))
	e.until("gpu-1 Unhealthy, gpu-2 added", time.Second, func(rs map[string]deviceplugin.Resource) bool {
		r := rs[gpu]
		return len(r.Devices) == 3 && r.Devices[0].Health == api.Healthy && r.Devices[1].Health == api.Unhealthy && r.Devices[1].Topology == nil
	})
	if d := e.details(s.Path()); d.Devices[api.Healthy] != 2 || d.Devices[api.Unhealthy] != 1 {
		t.Errorf("details devices = %v, want 2 Healthy, 1 Unhealthy", d.Devices)
	}

	// The socket is gone with the plugin: its devices are Unhealthy at once,
	// and the resource waits for a new instance (see TestRestartWithinGracePeriod).
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	rs := e.until("devices Unhealthy", testenv.Timeout, func(rs map[string]deviceplugin.Resource) bool {
		return allUnhealthy(rs[gpu])
	})
	if r := rs[gpu]; r.Connected || r.Dropped || r.LastError == "" || len(r.Devices) != 3 || r.Socket != s.Path() {
		t.Errorf("resource = %+v, want its 3 devices kept, disconnected, with the reason", r)
	}
	dp.waitIdle(t)
}

// endpointPlugin registers a plugin whose device service is served on its
// own socket, which the test can kill and restart.
func endpointPlugin(t *testing.T, e *env, dp *devicePlugin) (reg *plugin.Server, endpoint string, srv *testenv.GRPCServer) {
	t.Helper()
	endpoint = filepath.Join(testenv.ShortDir(t, "dpe"), "gpu.sock")
	srv = serveEndpoint(t, endpoint, dp)
	reg = e.startPlugin(plugin.Config{Name: gpu, Socket: "gpu.sock", Endpoint: endpoint})
	registered(t, reg)
	return reg, endpoint, srv
}

func TestStreamLossMarksUnhealthyAndRestartRestores(t *testing.T) {
	e := newEnv(t, deviceplugin.Options{GracePeriod: testenv.Timeout})
	dp := newDevicePlugin(dev("gpu-0", api.Healthy), dev("gpu-1", api.Healthy))
	reg, endpoint, srv := endpointPlugin(t, e, dp)
	if r := e.resource(gpu); r.Endpoint != endpoint || r.Socket != reg.Path() || len(r.Devices) != 2 {
		t.Fatalf("resource = %+v, want 2 devices served from %s", r, endpoint)
	}

	srv.Stop() // the plugin died
	rs := e.until("all devices Unhealthy", time.Second, func(rs map[string]deviceplugin.Resource) bool {
		return allUnhealthy(rs[gpu])
	})
	if r := rs[gpu]; r.Connected || r.Dropped || r.LastError == "" || len(r.Devices) != 2 {
		t.Errorf("resource = %+v, want its 2 devices kept, disconnected, with the error", r)
	}
	if d := e.details(reg.Path()); d.Connected || !d.Serving || d.Devices[api.Unhealthy] != 2 {
		t.Errorf("details = %+v, want disconnected, 2 Unhealthy", d)
	}
	if err := testutil.CollectAndCompare(e.reg, strings.NewReader(`
# HELP plugd_deviceplugin_connected 1 while the ListAndWatch stream of the instance serving the resource is up, 0 while it is redialed.
# TYPE plugd_deviceplugin_connected gauge
plugd_deviceplugin_connected{resource="example.com/gpu"} 0
# HELP plugd_deviceplugin_devices Devices of each registered device plugin resource, by health.
# TYPE plugd_deviceplugin_devices gauge
plugd_deviceplugin_devices{health="Healthy",resource="example.com/gpu"} 0
plugd_deviceplugin_devices{health="Unhealthy",resource="example.com/gpu"} 2
`), "plugd_deviceplugin_connected", "plugd_deviceplugin_devices"); err != nil {
		t.Error(err)
	}

	// It restarts within the grace period, with a different inventory.
	serveEndpoint(t, endpoint, newDevicePlugin(dev("gpu-0", api.Healthy), dev("gpu-2", api.Healthy)))
	rs = e.until("restored", testenv.Timeout, func(rs map[string]deviceplugin.Resource) bool { return rs[gpu].Connected })
	if r := rs[gpu]; r.Dropped || r.LastError != "" || !reflect.DeepEqual(ids(r), []string{"gpu-0", "gpu-2"}) || allUnhealthy(r) {
		t.Errorf("resource = %+v, want the restarted plugin's healthy devices", r)
	}
	if err := testutil.CollectAndCompare(e.reg, strings.NewReader(`
# HELP plugd_deviceplugin_stream_reconnects_total ListAndWatch streams of the resource's instances re-established after a break, since it was registered.
# TYPE plugd_deviceplugin_stream_reconnects_total counter
plugd_deviceplugin_stream_reconnects_total{resource="example.com/gpu"} 1
`), "plugd_deviceplugin_stream_reconnects_total"); err != nil {
		t.Error(err)
	}
	// The manager saw none of it: the registration socket stayed up.
	if s := e.pm.WaitSocket(reg.Path(), pluginmanager.StateRegistered); s.Attempts != 1 {
		t.Errorf("registration attempts = %d, want 1", s.Attempts)
	}
}

func TestDroppedAfterGracePeriod(t *testing.T) {
	const grace = 200 * time.Millisecond
	e := newEnv(t, deviceplugin.Options{GracePeriod: grace})
	dp := newDevicePlugin(dev("gpu-0", api.Healthy))
	reg, endpoint, srv := endpointPlugin(t, e, dp)

	killed := time.Now()
	srv.Stop()
	rs := e.until("resource dropped", testenv.Timeout, func(rs map[string]deviceplugin.Resource) bool { return rs[gpu].Dropped })
	if elapsed := time.Since(killed); elapsed < grace {
		t.Errorf("dropped %s after the plugin died, before the %s grace period was over", elapsed, grace)
	}
	if r := rs[gpu]; r.Connected || len(r.Devices) != 0 || r.LastError == "" || r.Socket != reg.Path() {
		t.Errorf("resource = %+v, want no devices, disconnected, with the error", r)
	}
	if d := e.details(reg.Path()); !d.Dropped || d.Connected || d.Devices[api.Healthy]+d.Devices[api.Unhealthy] != 0 {
		t.Errorf("details = %+v, want dropped with no devices", d)
	}
	if n := testutil.CollectAndCount(e.reg); n != 0 {
		t.Errorf("%d series for a dropped resource, want none", n)
	}

	// Still registered, it is redialed, and a plugin back later restores it.
	serveEndpoint(t, endpoint, newDevicePlugin(dev("gpu-0", api.Healthy)))
	rs = e.until("restored", testenv.Timeout, func(rs map[string]deviceplugin.Resource) bool { return rs[gpu].Connected })
	if r := rs[gpu]; r.Dropped || !reflect.DeepEqual(ids(r), []string{"gpu-0"}) {
		t.Errorf("resource = %+v, want restored", r)
	}
	if n := testutil.CollectAndCount(e.reg, "plugd_deviceplugin_devices"); n != 2 {
		t.Errorf("%d device series, want 2 again", n)
	}
}

// A plugin that restarts removes its socket and creates a new one: the
// resource stays throughout, its devices Unhealthy in between, and the new
// instance takes it over with its own list.
func TestRestartWithinGracePeriod(t *testing.T) {
	e := newEnv(t, deviceplugin.Options{GracePeriod: testenv.Timeout})
	dp := newDevicePlugin(dev("gpu-0", api.Healthy), dev("gpu-1", api.Healthy))
	s := e.startPlugin(plugin.Config{Name: gpu, Socket: "gpu.sock", Services: dp.register})
	registered(t, s)
	present := func(rs map[string]deviceplugin.Resource) {
		t.Helper()
		if _, ok := rs[gpu]; !ok {
			t.Fatalf("resource gone during the restart: %+v", rs)
		}
	}

	stopped := time.Now()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	rs := e.until("devices Unhealthy", testenv.Timeout, func(rs map[string]deviceplugin.Resource) bool {
		present(rs)
		return allUnhealthy(rs[gpu])
	})
	if r := rs[gpu]; r.Connected || r.Dropped || r.LastError == "" || len(r.Devices) != 2 || r.Socket != s.Path() {
		t.Errorf("resource = %+v, want its 2 devices kept, disconnected, with the reason", r)
	}
	if err := testutil.CollectAndCompare(e.reg, strings.NewReader(`
# HELP plugd_deviceplugin_connected 1 while the ListAndWatch stream of the instance serving the resource is up, 0 while it is redialed.
# TYPE plugd_deviceplugin_connected gauge
plugd_deviceplugin_connected{resource="example.com/gpu"} 0
# HELP plugd_deviceplugin_devices Devices of each registered device plugin resource, by health.
# TYPE plugd_deviceplugin_devices gauge
plugd_deviceplugin_devices{health="Healthy",resource="example.com/gpu"} 0
plugd_deviceplugin_devices{health="Unhealthy",resource="example.com/gpu"} 2
`), "plugd_deviceplugin_connected", "plugd_deviceplugin_devices"); err != nil {
		t.Error(err)
	}
	dp.waitIdle(t)

	// It starts again on the same socket, with another inventory.
	s2 := e.startPlugin(plugin.Config{Name: gpu, Socket: "gpu.sock", Services: newDevicePlugin(dev("gpu-0", api.Healthy), dev("gpu-2", api.Healthy)).register})
	rs = e.until("taken over", testenv.Timeout, func(rs map[string]deviceplugin.Resource) bool {
		present(rs)
		return rs[gpu].Connected
	})
	registered(t, s2)
	if r := rs[gpu]; r.Dropped || r.LastError != "" || !reflect.DeepEqual(ids(r), []string{"gpu-0", "gpu-2"}) || allUnhealthy(r) || !r.Since.After(stopped) {
		t.Errorf("resource = %+v, want the restarted plugin's healthy devices", r)
	}
	if d := e.details(s2.Path()); !d.Serving || !d.Connected || d.Devices[api.Healthy] != 2 {
		t.Errorf("details = %+v, want serving, connected, 2 Healthy", d)
	}
}

// Without a restart, the resource of a plugin whose socket went is dropped
// after the grace period.
func TestDeregisteredDroppedAfterGracePeriod(t *testing.T) {
	const grace = 500 * time.Millisecond
	e := newEnv(t, deviceplugin.Options{GracePeriod: grace})
	s := e.startPlugin(plugin.Config{Name: gpu, Socket: "gpu.sock", Services: newDevicePlugin(dev("gpu-0", api.Healthy)).register})
	registered(t, s)

	stopped := time.Now()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	e.until("devices Unhealthy", testenv.Timeout, func(rs map[string]deviceplugin.Resource) bool { return allUnhealthy(rs[gpu]) })
	e.until("resource gone", testenv.Timeout, func(rs map[string]deviceplugin.Resource) bool { return len(rs) == 0 })
	if elapsed := time.Since(stopped); elapsed < grace {
		t.Errorf("dropped %s after the socket went, before the %s grace period was over", elapsed, grace)
	}
	if n := testutil.CollectAndCount(e.reg); n != 0 {
		t.Errorf("%d series for a dropped resource, want none", n)
	}
}

// A plugin that sends one list and ends its stream, every time, is redialed
// ever more slowly: the backoff is not started again by a stream that broke
// as soon as it opened, and the warnings are rate-limited.
func TestStreamEndingAfterEachListBacksOff(t *testing.T) {
	const (
		initial  = 10 * time.Millisecond
		maxDelay = 200 * time.Millisecond
		window   = time.Second
		// The delays before the reconnects are 10, 20, 40, 80, 160, 200,
		// 200... ms, so there can be 8 within window (the 9th comes after
		// 1.11s); 2 more for a late look at the count. Without backoff
		// across streams there would be about 100.
		maxInWindow = 10
		// The sum of the delays before the 6th reconnect: without growth
		// it would be 60ms. Only lower bounds are asserted, which load
		// cannot break: a slow machine only makes reconnects later.
		minToSixth = 510 * time.Millisecond
	)
	var logs testenv.Buffer
	e := newEnv(t, deviceplugin.Options{
		Logger:           slog.New(slog.NewTextHandler(&logs, nil)),
		ReconnectBackoff: initial, ReconnectBackoffMax: maxDelay,
		GracePeriod: testenv.Timeout,
	})
	dp := newDevicePlugin(dev("gpu-0", api.Healthy))
	dp.once = true
	start := time.Now()
	s := e.startPlugin(plugin.Config{Name: gpu, Socket: "gpu.sock", Services: dp.register})
	registered(t, s)

	// Note when each reconnect is seen, for the window and until there
	// are 6.
	windowOver := time.NewTimer(time.Until(start.Add(window)))
	defer windowOver.Stop()
	deadline := time.After(testenv.Timeout)
	var seen []time.Duration // since start
	inWindow := -1
	for inWindow < 0 || len(seen) < 6 {
		changed := e.h.Changed()
		for n := e.reconnects(gpu); len(seen) < n; {
			seen = append(seen, time.Since(start))
		}
		select {
		case <-changed:
		case <-windowOver.C:
			inWindow = e.reconnects(gpu)
		case <-deadline:
			t.Fatalf("only %d reconnects within %s", len(seen), testenv.Timeout)
		}
	}
	elapsed := time.Since(start)
	t.Logf("%d reconnects within %s; the first 6 at %v", inWindow, window, seen[:6])

	if inWindow > maxInWindow {
		t.Errorf("%d reconnects within %s, want at most %d: the backoff does not grow", inWindow, window, maxInWindow)
	}
	if seen[5] < minToSixth {
		t.Errorf("6th reconnect after %s, want at least %s: the backoff does not grow", seen[5], minToSixth)
	}
	// The first break is a warning, then at most one per maxDelay.
	warned := strings.Count(logs.String(), `level=WARN msg="device plugin stream broke`)
	if most := 1 + int(elapsed/maxDelay); warned == 0 || warned > most {
		t.Errorf("%d warnings of a broken stream in %s, want 1 to %d", warned, elapsed, most)
	}
}

// Issue 25, item 10: a device plugin that stops cleanly (its gRPC server
// stopped, as the kubelet's sample device plugin does on SIGTERM) is not a
// warning, and the stream's end is told by its cause. Before, it logged
// WARN "device plugin stream broke ... context canceled": the handler read
// gRPC's own context of the failed stream, which gRPC cancels itself.
func TestCleanStopIsNotAWarning(t *testing.T) {
	log, warnings := testenv.WarnLogger()
	e := newEnv(t, deviceplugin.Options{Logger: log, GracePeriod: testenv.Timeout})
	endpoint := filepath.Join(testenv.ShortDir(t, "dpe"), "gpu.sock")
	srv := serveEndpoint(t, endpoint, newDevicePlugin(dev("gpu-0", api.Healthy)))
	s := e.startPlugin(plugin.Config{Name: gpu, Socket: "gpu.sock", Endpoint: endpoint})
	registered(t, s)

	srv.Stop()
	r := e.until("the stream to end", testenv.Timeout, func(rs map[string]deviceplugin.Resource) bool {
		return !rs[gpu].Connected && rs[gpu].LastError != ""
	})[gpu]
	if strings.Contains(r.LastError, "context canceled") {
		t.Errorf("the stream's end is told as %q, not by its cause", r.LastError)
	}
	// And its registration socket goes: deregistered, with nothing to warn of.
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	e.pm.WaitGone(s.Path())
	if w := warnings.String(); w != "" {
		t.Errorf("a device plugin that stopped cleanly was warned of:\n%s", w)
	}
}

func TestRollingUpdate(t *testing.T) {
	const grace = 200 * time.Millisecond
	e := newEnv(t, deviceplugin.Options{GracePeriod: grace})
	dpA := newDevicePlugin(dev("a-0", api.Healthy), dev("a-1", api.Healthy))
	a := e.startPlugin(plugin.Config{Name: gpu, Socket: "a.sock", Services: dpA.register})
	registered(t, a)

	// A second instance takes over.
	b := e.startPlugin(plugin.Config{Name: gpu, Socket: "b.sock", Services: newDevicePlugin(dev("b-0", api.Healthy)).register})
	registered(t, b)
	if r := e.resource(gpu); r.Socket != b.Path() || !reflect.DeepEqual(ids(r), []string{"b-0"}) || !r.Connected {
		t.Errorf("resource = %+v, want served from the new instance", r)
	}
	if d := e.details(a.Path()); d.Serving || !d.Connected || d.Devices[api.Healthy] != 2 {
		t.Errorf("old instance details = %+v, want connected, not serving", d)
	}
	if d := e.details(b.Path()); !d.Serving || !d.Connected {
		t.Errorf("new instance details = %+v, want serving", d)
	}

	// The new one goes first (a rollback): the old one serves again.
	b.Close()
	e.until("served from a again", testenv.Timeout, func(rs map[string]deviceplugin.Resource) bool {
		return rs[gpu].Socket == a.Path() && rs[gpu].Connected && len(rs[gpu].Devices) == 2
	})

	// Another new one; then the old one's stream ends, and it is dropped at
	// once rather than after the grace period, without touching the resource.
	c := e.startPlugin(plugin.Config{Name: gpu, Socket: "c.sock", Services: newDevicePlugin(dev("c-0", api.Healthy)).register})
	registered(t, c)
	dpA.stop()
	deadline := time.After(testenv.Timeout)
	for {
		changed := e.h.Changed()
		if e.details(a.Path()).Dropped {
			break
		}
		select {
		case <-changed:
		case <-deadline:
			t.Fatalf("old instance not dropped: %+v", e.details(a.Path()))
		}
	}
	if r := e.resource(gpu); r.Socket != c.Path() || !r.Connected || r.Dropped || !reflect.DeepEqual(ids(r), []string{"c-0"}) {
		t.Errorf("resource = %+v, want served from c throughout", r)
	}

	a.Close()
	e.pm.WaitGone(a.Path())
	if r := e.resource(gpu); r.Socket != c.Path() || !r.Connected || r.Dropped {
		t.Errorf("resource = %+v after the old instance went, want still served from c", r)
	}
	// The last one goes: the resource waits out the grace period, then goes.
	c.Close()
	e.until("resource gone", testenv.Timeout, func(rs map[string]deviceplugin.Resource) bool { return len(rs) == 0 })
	if n := testutil.CollectAndCount(e.reg); n != 0 {
		t.Errorf("%d series after every instance went, want none", n)
	}
}

func TestMetrics(t *testing.T) {
	e := newEnv(t, deviceplugin.Options{GracePeriod: 100 * time.Millisecond})
	dp := newDevicePlugin(dev("0", api.Healthy), dev("1", api.Unhealthy), dev("2", api.Healthy))
	s := e.startPlugin(plugin.Config{Name: gpu, Services: dp.register, Socket: "gpu.sock"})
	registered(t, s)
	other := e.startPlugin(plugin.Config{Name: "vendor.example/fpga", Services: newDevicePlugin().register, Socket: "fpga.sock"})
	registered(t, other)

	if err := testutil.CollectAndCompare(e.reg, strings.NewReader(`
# HELP plugd_deviceplugin_connected 1 while the ListAndWatch stream of the instance serving the resource is up, 0 while it is redialed.
# TYPE plugd_deviceplugin_connected gauge
plugd_deviceplugin_connected{resource="example.com/gpu"} 1
plugd_deviceplugin_connected{resource="vendor.example/fpga"} 1
# HELP plugd_deviceplugin_devices Devices of each registered device plugin resource, by health.
# TYPE plugd_deviceplugin_devices gauge
plugd_deviceplugin_devices{health="Healthy",resource="example.com/gpu"} 2
plugd_deviceplugin_devices{health="Unhealthy",resource="example.com/gpu"} 1
plugd_deviceplugin_devices{health="Healthy",resource="vendor.example/fpga"} 0
plugd_deviceplugin_devices{health="Unhealthy",resource="vendor.example/fpga"} 0
# HELP plugd_deviceplugin_stream_reconnects_total ListAndWatch streams of the resource's instances re-established after a break, since it was registered.
# TYPE plugd_deviceplugin_stream_reconnects_total counter
plugd_deviceplugin_stream_reconnects_total{resource="example.com/gpu"} 0
plugd_deviceplugin_stream_reconnects_total{resource="vendor.example/fpga"} 0
`)); err != nil {
		t.Error(err)
	}

	// A plugin's series go with it, once the grace period is over.
	other.Close()
	e.until("fpga gone", testenv.Timeout, func(rs map[string]deviceplugin.Resource) bool { return len(rs) == 1 })
	if n := testutil.CollectAndCount(e.reg); n != 4 {
		t.Errorf("%d series, want the 4 of the remaining resource", n)
	}
}

func TestValidate(t *testing.T) {
	h := deviceplugin.New(deviceplugin.Options{})
	defer h.Close()
	ok := pluginmanager.Plugin{Type: deviceplugin.Type, Name: gpu, Endpoint: "/run/dp/gpu.sock", Versions: []string{"v1beta1"}, Socket: "/run/reg/gpu.sock"}
	for _, tc := range []struct {
		name     string
		edit     func(p *pluginmanager.Plugin)
		contains string // "" means valid
	}{
		{"valid", func(p *pluginmanager.Plugin) {}, ""},
		{"several versions", func(p *pluginmanager.Plugin) { p.Versions = []string{"v1", "v1beta1"} }, ""},
		{"underscore and dots", func(p *pluginmanager.Plugin) { p.Name = "vendor.example/gpu_1.big" }, ""},
		{"lookalike of kubernetes.io", func(p *pluginmanager.Plugin) { p.Name = "notkubernetes.io/gpu" }, ""},
		{"wrong version", func(p *pluginmanager.Plugin) { p.Versions = []string{"v1alpha1", "v2"} }, `offers versions ["v1alpha1" "v2"], but this handler speaks only v1beta1`},
		{"no versions", func(p *pluginmanager.Plugin) { p.Versions = nil }, "offers versions []"},
		{"no domain", func(p *pluginmanager.Plugin) { p.Name = "gpu" }, "it has no domain"},
		{"kubernetes.io", func(p *pluginmanager.Plugin) { p.Name = "kubernetes.io/gpu" }, "kubernetes.io namespace"},
		{"subdomain of kubernetes.io", func(p *pluginmanager.Plugin) { p.Name = "nvidia.kubernetes.io/gpu" }, "kubernetes.io namespace"},
		{"quota prefix", func(p *pluginmanager.Plugin) { p.Name = "requests.example.com/gpu" }, "reserved for quota"},
		{"upper-case domain", func(p *pluginmanager.Plugin) { p.Name = "Example.com/gpu" }, "not a DNS subdomain"},
		{"empty domain", func(p *pluginmanager.Plugin) { p.Name = "/gpu" }, "domain is empty"},
		{"empty resource", func(p *pluginmanager.Plugin) { p.Name = "example.com/" }, "resource after the domain is empty"},
		{"two slashes", func(p *pluginmanager.Plugin) { p.Name = "example.com/gpu/0" }, `more than one "/"`},
		{"bad resource", func(p *pluginmanager.Plugin) { p.Name = "example.com/-gpu" }, "not a qualified name"},
		{"long resource", func(p *pluginmanager.Plugin) { p.Name = "example.com/" + strings.Repeat("g", 64) }, "at most 63"},
		{"long domain", func(p *pluginmanager.Plugin) { p.Name = strings.Repeat("a.", 122) + "io/gpu" }, "at most 244"},
		{"relative endpoint", func(p *pluginmanager.Plugin) { p.Endpoint = "gpu.sock" }, "not an absolute path"},
		{"long endpoint", func(p *pluginmanager.Plugin) { p.Endpoint = "/" + strings.Repeat("x", 107) }, "must be shorter than 108"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := ok
			tc.edit(&p)
			err := h.Validate(context.Background(), p)
			switch {
			case tc.contains == "" && err != nil:
				t.Errorf("Validate(%+v) = %v, want accepted", p, err)
			case tc.contains != "" && (err == nil || !strings.Contains(err.Error(), tc.contains)):
				t.Errorf("Validate(%+v) = %v, want an error saying %q", p, err, tc.contains)
			}
		})
	}
}

func TestRejected(t *testing.T) {
	e := newEnv(t, deviceplugin.Options{})
	tooMany := make([]*api.Device, 10001)
	for i := range tooMany {
		tooMany[i] = dev(fmt.Sprint("dev-", i), api.Healthy)
	}
	for i, tc := range []struct {
		name     string
		cfg      plugin.Config
		reason   pluginmanager.Reason
		contains string
	}{
		{"wrong version", plugin.Config{Name: gpu, Versions: []string{"v1alpha"}}, pluginmanager.ReasonValidate, `offers versions ["v1alpha"]`},
		{"bad name", plugin.Config{Name: "kubernetes.io/gpu"}, pluginmanager.ReasonValidate, "is not an extended resource name"},
		{"no device service", plugin.Config{Name: gpu}, pluginmanager.ReasonRegister, "does not serve the v1beta1 DevicePlugin service"},
		{"too many devices", plugin.Config{Name: gpu, Services: newDevicePlugin(tooMany...).register}, pluginmanager.ReasonRegister, "10001 devices, at most 10000"},
		{"empty device ID", plugin.Config{Name: gpu, Services: newDevicePlugin(dev("", api.Healthy)).register}, pluginmanager.ReasonRegister, "empty device ID"},
		{"device ID with a newline", plugin.Config{Name: gpu, Services: newDevicePlugin(dev("a\nb", api.Healthy)).register}, pluginmanager.ReasonRegister, "not printable"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			told := make(chan plugin.Status, 10)
			tc.cfg.Socket = fmt.Sprintf("bad%d.sock", i)
			tc.cfg.OnStatus = func(st plugin.Status) { told <- st }
			s := e.startPlugin(tc.cfg)
			st := e.pm.WaitSocket(s.Path(), pluginmanager.StateRejected)
			if st.Reason != tc.reason || !strings.Contains(st.LastError, tc.contains) {
				t.Errorf("rejected for %s %q, want %s saying %q", st.Reason, st.LastError, tc.reason, tc.contains)
			}
			select {
			case got := <-told:
				if got.Registered || !strings.Contains(got.Error, tc.contains) {
					t.Errorf("plugin was told %+v", got)
				}
			case <-time.After(testenv.Timeout):
				t.Error("plugin was not told")
			}
			if st.Attempts != 1 {
				t.Errorf("%d attempts, want 1: a rejection is not retried", st.Attempts)
			}
		})
	}
	if rs := e.h.Resources(); len(rs) != 0 {
		t.Errorf("resources = %+v, want none", rs)
	}
}

func TestRegisterWaitsForFirstList(t *testing.T) {
	e := newEnv(t, deviceplugin.Options{CallTimeout: 200 * time.Millisecond})
	dp := newDevicePlugin(dev("gpu-0", api.Healthy))
	dp.silent = true
	s := e.startPlugin(plugin.Config{Name: gpu, Socket: "gpu.sock", Services: dp.register})

	st := e.pm.WaitSocket(s.Path(), pluginmanager.StateFailed)
	if st.Reason != pluginmanager.ReasonRegister || !strings.Contains(st.LastError, "ListAndWatch: no device list within 200ms") {
		t.Errorf("failed for %s %q, want the wait for the first list", st.Reason, st.LastError)
	}
	if rs := e.h.Resources(); len(rs) != 0 {
		t.Errorf("resources = %+v, want none until the list arrived", rs)
	}
	if d := e.h.Details(st.Plugin); d != nil {
		t.Errorf("details = %+v, want none until registered", d)
	}

	// Once the plugin sends its list, a retry registers it.
	dp.set(dev("gpu-0", api.Healthy))
	registered(t, s)
	if r := e.resource(gpu); !reflect.DeepEqual(ids(r), []string{"gpu-0"}) {
		t.Errorf("resource = %+v", r)
	}
}

func TestClose(t *testing.T) {
	e := newEnv(t, deviceplugin.Options{})
	dp := newDevicePlugin(dev("gpu-0", api.Healthy))
	s := e.startPlugin(plugin.Config{Name: gpu, Socket: "gpu.sock", Services: dp.register})
	registered(t, s)
	p := e.pm.WaitSocket(s.Path(), pluginmanager.StateRegistered).Plugin
	// A resource whose last instance went, in its grace period, goes too.
	const fpga = "vendor.example/fpga"
	other := e.startPlugin(plugin.Config{Name: fpga, Socket: "fpga.sock", Services: newDevicePlugin(dev("fpga-0", api.Healthy)).register})
	registered(t, other)
	other.Close()
	e.until("fpga waiting for a new instance", testenv.Timeout, func(rs map[string]deviceplugin.Resource) bool { return allUnhealthy(rs[fpga]) })

	e.h.Close()
	e.h.Close()
	dp.waitIdle(t) // Close ended the stream
	if rs := e.h.Resources(); len(rs) != 0 {
		t.Errorf("resources after Close = %+v", rs)
	}
	if n := testutil.CollectAndCount(e.reg); n != 0 {
		t.Errorf("%d series after Close, want the collector unregistered", n)
	}
	ctx, cancel := context.WithTimeout(context.Background(), testenv.Timeout)
	defer cancel()
	if err := e.h.Register(ctx, p); err == nil {
		t.Error("Register after Close succeeded")
	}
	e.h.Deregister(ctx, p) // a no-op, and no panic
}

func TestCloseEndsRegisterInFlight(t *testing.T) {
	called := make(chan struct{}, 1)
	dp := newDevicePlugin()
	dp.hang = called
	endpoint := filepath.Join(testenv.ShortDir(t, "dpe"), "gpu.sock")
	serveEndpoint(t, endpoint, dp)
	h := deviceplugin.New(deviceplugin.Options{CallTimeout: time.Hour})

	ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
	defer cancel()
	p := pluginmanager.Plugin{Type: deviceplugin.Type, Name: gpu, Endpoint: endpoint, Versions: []string{"v1beta1"}, Socket: "/reg/gpu.sock"}
	registerErr := make(chan error, 1)
	go func() { registerErr <- h.Register(ctx, p) }()
	select {
	case <-called:
	case <-time.After(testenv.Timeout):
		t.Fatal("Register did not call GetDevicePluginOptions")
	}

	closed := make(chan struct{})
	go func() {
		h.Close()
		close(closed)
	}()
	select {
	case <-closed:
	case <-time.After(testenv.Timeout):
		t.Fatal("Close did not end the Register in flight")
	}
	// Close waited for Register to return, but its result reaches the
	// channel a moment later: wait for it rather than expect it there.
	select {
	case err := <-registerErr:
		if err == nil || !strings.Contains(err.Error(), "GetDevicePluginOptions: context canceled") {
			t.Errorf("Register = %v, want it cancelled", err)
		}
	case <-time.After(testenv.Timeout):
		t.Error("Register did not return")
	}
	if rs := h.Resources(); len(rs) != 0 {
		t.Errorf("resources = %+v", rs)
	}
}

// Issue 13, item 3: an endpoint inside the endpoint roots that is swapped for
// a symlink to a socket outside them while the stream is down does not lead
// the redial out: every connection is checked again.
func TestRedialStaysInEndpointRoots(t *testing.T) {
	base := testenv.ShortDir(t, "dpr")
	root, outside := filepath.Join(base, "root"), filepath.Join(base, "out")
	for _, d := range []string{root, outside} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	e := newEnv(t, deviceplugin.Options{GracePeriod: testenv.Timeout, EndpointRoots: []string{root}})
	endpoint := filepath.Join(root, "gpu.sock")
	srv := serveEndpoint(t, endpoint, newDevicePlugin(dev("gpu-0", api.Healthy)))
	reg := e.startPlugin(plugin.Config{Name: gpu, Socket: "gpu.sock", Endpoint: endpoint})
	registered(t, reg)

	srv.Stop()
	e.until("the stream to break", testenv.Timeout, func(rs map[string]deviceplugin.Resource) bool { return !rs[gpu].Connected })
	evil := testenv.CountAccepts(t, filepath.Join(outside, "evil.sock"))
	os.Remove(endpoint)
	if err := os.Symlink(filepath.Join(outside, "evil.sock"), endpoint); err != nil {
		t.Fatal(err)
	}
	rs := e.until("the redial to be refused or to connect", testenv.Timeout, func(rs map[string]deviceplugin.Resource) bool {
		return strings.Contains(rs[gpu].LastError, "outside the directories endpoints must be in") || evil.Count() > 0
	})
	if n := evil.Count(); n != 0 {
		t.Errorf("the redial connected %d times to the socket outside the roots; resource %+v", n, rs[gpu])
	}
	if r := rs[gpu]; r.Connected {
		t.Errorf("resource = %+v, want it disconnected", r)
	}
}
