package dra

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/goleak"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2"
	drahealthv1 "k8s.io/kubelet/pkg/apis/dra-health/v1"
	testingclock "k8s.io/utils/clock/testing"

	"github.com/plugd/plugd/api"
	"github.com/plugd/plugd/internal/testenv"
	"github.com/plugd/plugd/plugin"
	"github.com/plugd/plugd/pluginmanager"
	"github.com/plugd/plugd/plugintest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// env is a running manager with the DRA handler, on a fresh registry directory.
type env struct {
	t   *testing.T
	pm  *plugintest.Manager
	m   *pluginmanager.Manager
	h   *Handler
	reg *prometheus.Registry
	clk *testingclock.FakeClock // set by the observe tests
	dir string                  // the registry directory
	sub *pluginmanager.Subscription
}

// start runs a manager and a handler with opts, and at the end of the test
// stops the manager, then closes the handler.
func start(t *testing.T, opts Options) *env {
	t.Helper()
	e := &env{t: t, reg: prometheus.NewPedanticRegistry()}
	opts.Registerer = e.reg
	e.h = New(opts)
	e.run(pluginmanager.Options{BackoffInitial: 20 * time.Millisecond, BackoffMax: 200 * time.Millisecond})
	return e
}

// run runs a manager with mopts and e.h for Type until the end of the test,
// then closes the handler.
func (e *env) run(mopts pluginmanager.Options) {
	e.t.Helper()
	// Registered first, so run last: after the manager has stopped.
	e.t.Cleanup(func() {
		e.h.Close()
		if e.sub != nil {
			e.sub.Close()
		}
	})
	e.pm = plugintest.NewManagerWith(e.t, mopts, map[string]pluginmanager.Handler{Type: e.h})
	e.pm.Timeout = testenv.Timeout
	e.m = e.pm.Manager()
	e.dir = e.pm.Dir
	e.sub = e.m.Subscribe()
}

// until waits for cond, re-checking it whenever the handler's state changes
// or the manager publishes an event, and fails the test at the deadline.
func (e *env) until(what string, cond func() bool) {
	e.t.Helper()
	deadline := time.After(testenv.Timeout)
	for {
		changed := e.h.changes()
		if cond() {
			return
		}
		select {
		case <-changed:
		case <-e.sub.Events():
		case <-deadline:
			e.t.Fatalf("timed out waiting for %s\nplugins: %+v\ndrivers: %+v", what, e.m.Plugins(), e.h.Drivers())
		}
	}
}

// plugin returns the manager's status of the socket at path.
func (e *env) plugin(path string) (pluginmanager.PluginStatus, bool) {
	for _, p := range e.m.Plugins() {
		if p.Socket == path {
			return p, true
		}
	}
	return pluginmanager.PluginStatus{}, false
}

// driver returns the handler's snapshot of the named driver.
func (e *env) driver(name string) (Driver, bool) {
	for _, d := range e.h.Drivers() {
		if d.Name == name {
			return d, true
		}
	}
	return Driver{}, false
}

// driverWhen waits for the named driver's snapshot to satisfy cond.
func (e *env) driverWhen(name, what string, cond func(Driver) bool) Driver {
	e.t.Helper()
	var d Driver
	e.until(name+" "+what, func() bool {
		var ok bool
		d, ok = e.driver(name)
		return ok && cond(d)
	})
	return d
}

// testDriver is a DRA driver that prepares and unprepares nothing, and
// reports the health of devices if it has any.
type testDriver struct {
	devices []kubeletplugin.DeviceHealth
}

func (testDriver) PrepareResourceClaims(_ context.Context, claims []*resourceapi.ResourceClaim) (map[types.UID]kubeletplugin.PrepareResult, error) {
	result := make(map[types.UID]kubeletplugin.PrepareResult, len(claims))
	for _, c := range claims {
		result[c.UID] = kubeletplugin.PrepareResult{}
	}
	return result, nil
}

func (testDriver) UnprepareResourceClaims(_ context.Context, claims []kubeletplugin.NamespacedObject) (map[types.UID]error, error) {
	result := make(map[types.UID]error, len(claims))
	for _, c := range claims {
		result[c.UID] = nil
	}
	return result, nil
}

func (testDriver) HandleError(context.Context, error, string) {}

func (d testDriver) WatchHealthStatus(ctx context.Context, reports chan<- kubeletplugin.DeviceHealthReport) error {
	if len(d.devices) == 0 {
		return kubeletplugin.ErrHealthNotSupported
	}
	select {
	case reports <- kubeletplugin.DeviceHealthReport{Devices: d.devices}:
	case <-ctx.Done():
		return nil
	}
	<-ctx.Done()
	return nil
}

// startDriver runs a real DRA driver with kubeletplugin, registering in the
// env's registry directory, and stops it at the end of the test.
func (e *env) startDriver(drv testDriver, name, dataDir string, opts ...kubeletplugin.Option) *kubeletplugin.Helper {
	e.t.Helper()
	// The helper logs through klog; its errors when a stream is cut are
	// expected here, and would only clutter the output.
	ctx := klog.NewContext(context.Background(), logr.Discard())
	opts = append([]kubeletplugin.Option{
		kubeletplugin.DriverName(name),
		kubeletplugin.KubeClient(fake.NewClientset()),
		kubeletplugin.NodeName("node-1"),
		kubeletplugin.RegistrarDirectoryPath(e.dir),
		kubeletplugin.PluginDataDirectoryPath(dataDir),
	}, opts...)
	helper, err := kubeletplugin.Start(ctx, drv, opts...)
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(helper.Stop)
	return helper
}

// regSocket is where kubeletplugin puts a driver's registration socket.
func (e *env) regSocket(name string, uid types.UID) string {
	if uid == "" {
		return filepath.Join(e.dir, name+"-reg.sock")
	}
	return filepath.Join(e.dir, kubeletplugin.RollingUpdateRegistrarSocketFile(e.dir, name, uid))
}

func instanceOf(d Driver, socket string) (Instance, bool) {
	for _, in := range d.Instances {
		if in.Socket == socket {
			return in, true
		}
	}
	return Instance{}, false
}

// A real kubeletplugin driver registers, is told so, and its devices' health
// is followed.
func TestRealDriver(t *testing.T) {
	e := start(t, Options{})
	const name = "gpu.example.com"
	lastUpdated := time.Unix(1_700_000_000, 0)
	helper := e.startDriver(testDriver{devices: []kubeletplugin.DeviceHealth{
		{PoolName: "pool-a", DeviceName: "gpu-0", Health: kubeletplugin.HealthStatusHealthy, LastUpdated: lastUpdated},
		{PoolName: "pool-a", DeviceName: "gpu-1", Health: kubeletplugin.HealthStatusUnhealthy, Message: "ECC errors"},
	}}, name, testenv.ShortDir(t, "drap"))

	socket := e.regSocket(name, "")
	ps := e.pm.WaitSocket(socket, pluginmanager.StateRegistered)
	if st := helper.RegistrationStatus(); st == nil || !st.PluginRegistered {
		t.Errorf("the plugin was not told it is registered: %+v", st)
	}

	d := e.driverWhen(name, "to report 2 devices", func(d Driver) bool { return len(d.Devices) == 2 })
	if !d.Available || d.Serving != socket || !d.UnavailableSince.IsZero() {
		t.Errorf("driver = %+v, want available, served by %s", d, socket)
	}
	if len(d.Instances) != 1 {
		t.Fatalf("instances = %+v, want 1", d.Instances)
	}
	in := d.Instances[0]
	if in.Service != "v1.DRAPlugin" || in.HealthService != "v1.DRAResourceHealth" || !in.Connected ||
		in.Endpoint != ps.Endpoint || in.RegisteredAt.IsZero() {
		t.Errorf("instance = %+v, want v1.DRAPlugin with v1.DRAResourceHealth, connected to %s", in, ps.Endpoint)
	}
	want := []DeviceHealth{
		{Pool: "pool-a", Device: "gpu-0", Health: Healthy, LastUpdated: lastUpdated},
		{Pool: "pool-a", Device: "gpu-1", Health: Unhealthy, Message: "ECC errors"},
	}
	for i := range d.Devices {
		d.Devices[i].ReceivedAt = time.Time{}
	}
	if !slices.Equal(d.Devices, want) {
		t.Errorf("devices = %+v, want %+v", d.Devices, want)
	}

	details, ok := e.h.Details(ps.Plugin).(*InstanceStatus)
	if !ok || details.Driver != name || !details.Serving || !details.DriverAvailable || details.Service != "v1.DRAPlugin" {
		t.Errorf("details = %+v", e.h.Details(ps.Plugin))
	}
	if b, err := json.Marshal(e.h.Details(ps.Plugin)); err != nil || !strings.Contains(string(b), `"driver":"gpu.example.com"`) ||
		!strings.Contains(string(b), `"serving":true`) || !strings.Contains(string(b), `"service":"v1.DRAPlugin"`) {
		t.Errorf("details as JSON = %s, %v", b, err)
	}
	if got := e.h.Details(pluginmanager.Plugin{Socket: "/nowhere"}); got != nil {
		t.Errorf("details of an unknown socket = %+v, want nil", got)
	}

	if err := testutil.GatherAndCompare(e.reg, strings.NewReader(`
# HELP plugd_dra_devices Devices whose health DRA drivers report, by health.
# TYPE plugd_dra_devices gauge
plugd_dra_devices{health="Healthy"} 1
plugd_dra_devices{health="Unhealthy"} 1
plugd_dra_devices{health="Unknown"} 0
# HELP plugd_dra_drivers DRA drivers known, available or not.
# TYPE plugd_dra_drivers gauge
plugd_dra_drivers 1
# HELP plugd_dra_drivers_available DRA drivers with a connected instance, or within the grace period after losing the last one.
# TYPE plugd_dra_drivers_available gauge
plugd_dra_drivers_available 1
# HELP plugd_dra_instances Registered DRA driver instances, by the state of their connection.
# TYPE plugd_dra_instances gauge
plugd_dra_instances{state="connected"} 1
plugd_dra_instances{state="disconnected"} 0
`)); err != nil {
		t.Error(err)
	}

	// Stopping the driver removes its socket: the instance is let go, and
	// the driver is forgotten once the grace period is over (30s here, so it
	// is still listed).
	helper.Stop()
	e.until("the instance to be deregistered", func() bool {
		_, ok := e.plugin(socket)
		d, _ := e.driver(name)
		return !ok && len(d.Instances) == 0
	})
	if d, ok := e.driver(name); !ok || !d.Available || d.Serving != "" {
		t.Errorf("driver within its grace period = %+v, %v; want available, served by none", d, ok)
	}
}

// During a rolling update, the old and the new instance are registered side
// by side; the newer serves, and the driver stays available when the old
// one stops.
func TestRollingUpdate(t *testing.T) {
	e := start(t, Options{})
	const name = "roll.example.com"
	data := testenv.ShortDir(t, "drap")

	oldHelper := e.startDriver(testDriver{}, name, data, kubeletplugin.RollingUpdate("pod-a"))
	oldSocket := e.regSocket(name, "pod-a")
	e.pm.WaitSocket(oldSocket, pluginmanager.StateRegistered)
	d, _ := e.driver(name)
	if !d.Available || d.Serving != oldSocket {
		t.Fatalf("with the old instance: driver = %+v, want available, served by %s", d, oldSocket)
	}

	e.startDriver(testDriver{}, name, data, kubeletplugin.RollingUpdate("pod-b"))
	newSocket := e.regSocket(name, "pod-b")
	if ps := e.pm.WaitSocket(newSocket, pluginmanager.StateRegistered); !ps.Newest {
		t.Errorf("the manager does not mark the new instance newest: %+v", ps)
	}
	d, _ = e.driver(name)
	if !d.Available || d.Serving != newSocket || len(d.Instances) != 2 || d.Instances[0].Socket != newSocket {
		t.Fatalf("with both instances: driver = %+v, want available, served by %s, newest first", d, newSocket)
	}
	if in, _ := instanceOf(d, oldSocket); !in.Connected {
		t.Errorf("the old instance is no longer connected: %+v", in)
	}

	// While the old instance stops and goes, the driver must be served
	// throughout: every state it passes through is recorded, under the
	// handler's lock, at the change itself.
	var states []Driver
	e.h.mu.Lock()
	e.h.observe = func() {
		d, ok := e.h.drivers[name]
		if !ok {
			states = append(states, Driver{Name: "(forgotten)"})
			return
		}
		states = append(states, d.snapshot(time.Now()))
	}
	e.h.mu.Unlock()
	oldHelper.Stop()
	e.until("the old instance to be deregistered", func() bool {
		d, _ := e.driver(name)
		_, old := instanceOf(d, oldSocket)
		return !old
	})
	e.h.mu.Lock()
	e.h.observe = nil
	seen := states
	e.h.mu.Unlock()
	if len(seen) == 0 {
		t.Fatal("no change of state recorded while the old instance went")
	}
	for i, s := range seen {
		if !s.Available || s.Serving != newSocket {
			t.Errorf("change %d of %d: driver = %+v, want available, served by %s throughout", i+1, len(seen), s, newSocket)
		}
	}
	d, _ = e.driver(name)
	if !d.Available || d.Serving != newSocket || len(d.Instances) != 1 || !d.UnavailableSince.IsZero() {
		t.Fatalf("after the old instance stopped: driver = %+v, want available, served by %s", d, newSocket)
	}
}

// An instance whose DRA service goes away, while its registration socket
// stays, is disconnected; past the grace period its driver is unavailable,
// and available again once the service is back.
//
// kubeletplugin removes both sockets when a Helper stops, so the registration
// and the DRA service run in two Helpers on the same endpoint (the split
// deployment the helper supports with DRAService(false) and
// RegistrationService(false)); stopping the second one kills the DRA service
// alone.
func TestLostConnection(t *testing.T) {
	e := start(t, Options{GracePeriod: 300 * time.Millisecond})
	const name = "lost.example.com"
	data := testenv.ShortDir(t, "drap")
	service := func() *kubeletplugin.Helper {
		return e.startDriver(testDriver{}, name, data, kubeletplugin.RegistrationService(false))
	}

	svc := service()
	e.startDriver(testDriver{}, name, data, kubeletplugin.DRAService(false))
	socket := e.regSocket(name, "")
	e.pm.WaitSocket(socket, pluginmanager.StateRegistered)

	// This driver advertises the health service but answers Unimplemented,
	// as kubeletplugin does for a driver without health reporting.
	d := e.driverWhen(name, "to stop following health", func(d Driver) bool {
		return len(d.Instances) == 1 && d.Instances[0].HealthService == ""
	})
	if !d.Available || d.Serving != socket || !d.Instances[0].Connected {
		t.Fatalf("driver = %+v, want available, served by %s", d, socket)
	}

	svc.Stop()
	d = e.driverWhen(name, "to lose its instance's connection", func(d Driver) bool {
		return len(d.Instances) == 1 && !d.Instances[0].Connected
	})
	if d.Instances[0].DisconnectedAt.IsZero() || d.Serving != "" {
		t.Errorf("disconnected: driver = %+v, want DisconnectedAt set, served by none", d)
	}
	lost := d.Instances[0].DisconnectedAt
	d = e.driverWhen(name, "to become unavailable", func(d Driver) bool { return !d.Available })
	if since := d.UnavailableSince.Sub(lost); since < 300*time.Millisecond {
		t.Errorf("unavailable %s after the connection was lost, before the grace period of 300ms", since)
	}
	// The registration stands, Unhealthy for its endpoint until the
	// manager's grace period ends.
	if ps := e.pm.WaitSocket(socket, pluginmanager.StateUnhealthy); ps.Reason != pluginmanager.ReasonEndpoint {
		t.Errorf("the registration should stand, Unhealthy for its endpoint: %+v", ps)
	}
	if err := testutil.GatherAndCompare(e.reg, strings.NewReader(`
# HELP plugd_dra_drivers_available DRA drivers with a connected instance, or within the grace period after losing the last one.
# TYPE plugd_dra_drivers_available gauge
plugd_dra_drivers_available 0
# HELP plugd_dra_instances Registered DRA driver instances, by the state of their connection.
# TYPE plugd_dra_instances gauge
plugd_dra_instances{state="connected"} 0
plugd_dra_instances{state="disconnected"} 1
`), "plugd_dra_drivers_available", "plugd_dra_instances"); err != nil {
		t.Error(err)
	}

	service()
	d = e.driverWhen(name, "to be available again", func(d Driver) bool { return d.Available })
	if d.Serving != socket || !d.Instances[0].Connected || !d.UnavailableSince.IsZero() || !d.Instances[0].DisconnectedAt.IsZero() {
		t.Errorf("reconnected: driver = %+v", d)
	}
}

// A driver that breaks a rule is rejected, says why, and is told so.
func TestRejected(t *testing.T) {
	e := start(t, Options{})

	t.Run("bad name", func(t *testing.T) {
		helper := e.startDriver(testDriver{}, "Bad_Driver", testenv.ShortDir(t, "drap"))
		ps := e.pm.WaitSocket(e.regSocket("Bad_Driver", ""), pluginmanager.StateRejected)
		if ps.Reason != pluginmanager.ReasonValidate || !strings.Contains(ps.LastError, `driver name "Bad_Driver" is not a DNS subdomain`) {
			t.Errorf("status = %+v", ps)
		}
		if st := helper.RegistrationStatus(); st == nil || st.PluginRegistered || !strings.Contains(st.Error, "not a DNS subdomain") {
			t.Errorf("the plugin was told %+v", st)
		}
	})

	for _, tc := range []struct {
		name, endpoint string
		versions       []string
		want           string
		reason         pluginmanager.Reason // zero: validate (this handler's refusal)
	}{
		{"unsupported version", "/run/dra.sock", []string{"v2.DRAPlugin", "v1.DRAResourceHealth"},
			`offers none of the DRA services supported (v1.DRAPlugin, v1beta1.DRAPlugin); it offers ["v2.DRAPlugin" "v1.DRAResourceHealth"]`, ""},
		// The manager itself refuses a relative endpoint, before the handler sees it.
		{"relative endpoint", "run/dra.sock", []string{"v1.DRAPlugin"}, `endpoint "run/dra.sock" is not an absolute path`, pluginmanager.ReasonInvalidInfo},
		// And one too long for a unix socket, by the same rule (pluginmanager.EndpointPath).
		{"long endpoint", "/" + strings.Repeat("x", 107), []string{"v1.DRAPlugin"}, "is 108 bytes long; a unix socket path must be shorter than 108", pluginmanager.ReasonInvalidInfo},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := plugin.Start(plugin.Config{
				Dir: e.dir, Socket: strings.ReplaceAll(tc.name, " ", "-") + ".sock",
				Type: Type, Name: "ok.example.com", Endpoint: tc.endpoint, Versions: tc.versions,
			})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { s.Close() })
			ps := e.pm.WaitSocket(s.Path(), pluginmanager.StateRejected)
			reason := cmp.Or(tc.reason, pluginmanager.ReasonValidate)
			if ps.Reason != reason || !strings.Contains(ps.LastError, tc.want) {
				t.Errorf("status = %+v, want an error containing %q", ps, tc.want)
			}
			if st, _ := s.Status(); st.Registered || !strings.Contains(st.Error, tc.want) {
				t.Errorf("the plugin was told %+v", st)
			}
		})
	}
	// One that lists no version at all, which the SDK does not make but
	// another plugin may.
	err := e.h.Validate(context.Background(), pluginmanager.Plugin{Type: Type, Name: "ok.example.com", Endpoint: "/run/dra.sock", Socket: filepath.Join(e.dir, "none.sock")})
	if err == nil || !strings.Contains(err.Error(), "offers none of the DRA services supported") {
		t.Errorf("Validate of a plugin with no version: %v", err)
	}
	if len(e.h.Drivers()) != 0 {
		t.Errorf("drivers = %+v, want none", e.h.Drivers())
	}
}

// A driver whose endpoint takes no connections is not registered, nor told
// so: the manager waits for the endpoint, with the reason shown.
func TestUnreachableEndpoint(t *testing.T) {
	e := start(t, Options{})
	endpoint := filepath.Join(testenv.ShortDir(t, "drap"), "dra.sock")
	s, err := plugin.Start(plugin.Config{
		Dir: e.dir, Type: Type, Name: "away.example.com", Endpoint: endpoint, Versions: []string{"v1beta1.DRAPlugin"},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	ps := e.pm.WaitSocket(s.Path(), pluginmanager.StateFailed)
	if ps.Reason != pluginmanager.ReasonEndpoint || !strings.Contains(ps.LastError, "waiting for its endpoint "+endpoint) || !strings.Contains(ps.LastError, "no such file") {
		t.Errorf("status = %+v, want a failure waiting for its endpoint %s, saying why", ps, endpoint)
	}
	if n := s.Notifications(); n != 0 {
		t.Errorf("the plugin was told %d times while its endpoint was down, want never", n)
	}
	if len(e.h.Drivers()) != 0 {
		t.Errorf("drivers = %+v, want none", e.h.Drivers())
	}
}

func TestValidate(t *testing.T) {
	h := New(Options{})
	defer h.Close()
	for _, tc := range []struct {
		versions        []string
		service, health string
	}{
		{[]string{"v1.DRAPlugin", "v1beta1.DRAPlugin", "v1.DRAResourceHealth", "v1alpha1.DRAResourceHealth"}, "v1.DRAPlugin", "v1.DRAResourceHealth"},
		{[]string{"v1alpha1.DRAResourceHealth", "v1beta1.DRAPlugin", "v1.DRAPlugin"}, "v1beta1.DRAPlugin", "v1alpha1.DRAResourceHealth"},
		{[]string{"v0.DRAPlugin", "v1beta1.DRAPlugin"}, "v1beta1.DRAPlugin", ""},
		// The health service in the kubelet's order (v1.37), not the
		// plugin's: it follows the stream the kubelet follows.
		{[]string{"v1.DRAPlugin", "v1alpha1.DRAResourceHealth", "v1.DRAResourceHealth"}, "v1.DRAPlugin", "v1.DRAResourceHealth"},
	} {
		p := pluginmanager.Plugin{Type: Type, Name: "a.example.com", Endpoint: "/run/a.sock", Versions: tc.versions}
		if err := h.Validate(context.Background(), p); err != nil {
			t.Errorf("Validate(%q) = %v", tc.versions, err)
		}
		service, health, _ := check(&p)
		if service != tc.service || health != tc.health {
			t.Errorf("versions %q: chose %q and %q, want %q and %q", tc.versions, service, health, tc.service, tc.health)
		}
	}
}

// After Close, nothing registers.
func TestClosed(t *testing.T) {
	h := New(Options{})
	h.Close()
	h.Close()
	err := h.Register(context.Background(), pluginmanager.Plugin{Type: Type, Name: "a.example.com", Endpoint: "/run/a.sock", Versions: []string{"v1.DRAPlugin"}})
	if !errors.Is(err, ErrClosed) {
		t.Errorf("Register after Close = %v, want ErrClosed", err)
	}
}

// Health reports are bounded: devices per driver, message length; a device
// not refreshed within its timeout is Unknown.
func TestHealthBounds(t *testing.T) {
	// The devices' health holds for a second: on the real clock a slow
	// machine could see it go stale before the first look.
	clk := testingclock.NewFakeClock(time.Now())
	h := New(Options{Clock: clk})
	_, in := handMade(h)

	var resp drahealthv1.NodeWatchResourcesResponse
	for i := range maxDevices + 10 {
		resp.Devices = append(resp.Devices, &drahealthv1.DeviceHealth{
			Device:                    &drahealthv1.DeviceIdentifier{PoolName: "pool", DeviceName: fmt.Sprintf("dev-%04d", i)},
			Health:                    drahealthv1.HealthStatus_HEALTHY,
			Message:                   strings.Repeat("é", maxMessageLen),
			HealthCheckTimeoutSeconds: 1,
		})
	}
	resp.Devices = append(resp.Devices, &drahealthv1.DeviceHealth{Device: &drahealthv1.DeviceIdentifier{PoolName: "pool"}}) // no name
	h.recordHealth(in, &resp)

	devs := h.Drivers()[0].Devices
	if len(devs) != maxDevices {
		t.Fatalf("%d devices kept, want %d", len(devs), maxDevices)
	}
	if m := devs[0].Message; len(m) > maxMessageLen || !strings.HasSuffix(m, "...") || !utf8.ValidString(m) {
		t.Errorf("message of %d bytes, valid UTF-8 %v, want at most %d ending in ...", len(m), utf8.ValidString(m), maxMessageLen)
	}
	if devs[0].Health != Healthy {
		t.Errorf("health = %s, want Healthy", devs[0].Health)
	}

	// Once stale, devices read Unknown, and make room for new ones.
	clk.SetTime(clk.Now().Add(time.Second))
	if devs := h.Drivers()[0].Devices; devs[0].Health != Healthy {
		t.Errorf("device health at its timeout = %s, want still Healthy", devs[0].Health)
	}
	clk.SetTime(clk.Now().Add(time.Nanosecond))
	if devs := h.Drivers()[0].Devices; devs[0].Health != Unknown {
		t.Errorf("stale device health = %s, want Unknown", devs[0].Health)
	}
	h.recordHealth(in, &drahealthv1.NodeWatchResourcesResponse{Devices: []*drahealthv1.DeviceHealth{
		{Device: &drahealthv1.DeviceIdentifier{PoolName: "pool", DeviceName: "new"}, Health: drahealthv1.HealthStatus_UNHEALTHY},
	}})
	if devs := h.Drivers()[0].Devices; len(devs) != 1 || devs[0].Device != "new" || devs[0].Health != Unhealthy {
		t.Errorf("devices = %+v, want only the new one", devs)
	}
}

// handMade adds a driver and an instance to h by hand, without a connection
// or goroutines, so there is nothing for Close to stop.
func handMade(h *Handler) (*driver, *instance) {
	d := &driver{name: "a.example.com", instances: make(map[string]*instance), available: true, devices: make(map[deviceKey]*device)}
	in := &instance{driver: d, socket: "/reg/a.sock"}
	h.mu.Lock()
	h.drivers[d.name], h.sockets[in.socket], d.instances[in.socket] = d, in, in
	h.mu.Unlock()
	return d, in
}

// healthReport is a report of n healthy devices in pool, named prefix-NNNNN.
func healthReport(pool, prefix string, n int, health drahealthv1.HealthStatus) *drahealthv1.NodeWatchResourcesResponse {
	var resp drahealthv1.NodeWatchResourcesResponse
	for i := range n {
		resp.Devices = append(resp.Devices, &drahealthv1.DeviceHealth{
			Device: &drahealthv1.DeviceIdentifier{PoolName: pool, DeviceName: fmt.Sprintf("%s-%05d", prefix, i)},
			Health: health,
		})
	}
	return &resp
}

// logs is a slog.Handler that keeps every record, for tests to look at.
type logs struct {
	mu      sync.Mutex
	records []slog.Record
	changed chan struct{} // closed and replaced at every record
}

func newLogs() *logs { return &logs{changed: make(chan struct{})} }

func (l *logs) Enabled(context.Context, slog.Level) bool { return true }
func (l *logs) WithAttrs([]slog.Attr) slog.Handler       { return l }
func (l *logs) WithGroup(string) slog.Handler            { return l }

func (l *logs) Handle(_ context.Context, r slog.Record) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.records = append(l.records, r.Clone())
	close(l.changed)
	l.changed = make(chan struct{})
	return nil
}

// find returns the records whose message is msg, and a channel closed at the
// next record.
func (l *logs) find(msg string) ([]slog.Record, <-chan struct{}) {
	l.mu.Lock()
	defer l.mu.Unlock()
	var found []slog.Record
	for _, r := range l.records {
		if r.Message == msg {
			found = append(found, r)
		}
	}
	return found, l.changed
}

// wait waits for a record whose message is msg, and returns it.
func (l *logs) wait(t *testing.T, msg string) slog.Record {
	t.Helper()
	deadline := time.After(testenv.Timeout)
	for {
		found, changed := l.find(msg)
		if len(found) > 0 {
			return found[0]
		}
		select {
		case <-changed:
		case <-deadline:
			t.Fatalf("no log %q within %s", msg, testenv.Timeout)
		}
	}
}

// attr returns the value of the record's attribute key, as a string.
func attr(r slog.Record, key string) string {
	var v string
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == key {
			v = a.Value.String()
			return false
		}
		return true
	})
	return v
}

// A report naming many more devices than are kept is cut to the bound: the
// devices kept are refreshed, the others counted and dropped, and the
// overflow logged once. (What it costs: BenchmarkHealthReportLarge.)
func TestHealthReportLarge(t *testing.T) {
	logs := newLogs()
	h := New(Options{Logger: slog.New(logs)})
	d, in := handMade(h)

	// The driver is at the cap, and its devices are fresh: there is nothing
	// to prune to make room.
	h.recordHealth(in, healthReport("pool", "kept", maxDevices, drahealthv1.HealthStatus_HEALTHY))

	// 20,000 new devices, then the kept ones, now unhealthy.
	resp := healthReport("pool", "new", 20_000, drahealthv1.HealthStatus_HEALTHY)
	resp.Devices = append(resp.Devices, healthReport("pool", "kept", maxDevices, drahealthv1.HealthStatus_UNHEALTHY).Devices...)
	for range 2 {
		h.recordHealth(in, resp)
	}

	ds := h.Drivers()
	if len(ds) != 1 {
		t.Fatalf("drivers = %d, want 1", len(ds))
	}
	if got := len(ds[0].Devices); got != maxDevices {
		t.Errorf("%d devices kept, want %d", got, maxDevices)
	}
	for _, dev := range ds[0].Devices {
		if !strings.HasPrefix(dev.Device, "kept-") || dev.Health != Unhealthy {
			t.Errorf("device %+v, want only the kept ones, refreshed to Unhealthy", dev)
			break
		}
	}
	if ds[0].DevicesDropped != 2*20_000 {
		t.Errorf("DevicesDropped = %d, want %d", ds[0].DevicesDropped, 2*20_000)
	}
	warned, _ := logs.find("DRA driver reports more devices than are kept; ignoring the rest")
	if len(warned) != 1 || attr(warned[0], "dropped") != "20000" || attr(warned[0], "driver") != d.name {
		t.Errorf("overflow logged %d times (%v), want once, with 20000 dropped", len(warned), warned)
	}
}

// What a report naming 20 times more devices than are kept costs, under
// the handler's lock: one pass over the report, and at most one pass over
// the devices kept to prune the stale ones, not one per device it cannot
// keep. On a 2-core AMD EPYC: about 1 ms, where pruning once per device
// dropped took 300 ms.
func BenchmarkHealthReportLarge(b *testing.B) {
	h := New(Options{})
	_, in := handMade(h)
	h.recordHealth(in, healthReport("pool", "kept", maxDevices, drahealthv1.HealthStatus_HEALTHY))
	resp := healthReport("pool", "new", 20_000, drahealthv1.HealthStatus_HEALTHY)
	resp.Devices = append(resp.Devices, healthReport("pool", "kept", maxDevices, drahealthv1.HealthStatus_UNHEALTHY).Devices...)
	b.ReportAllocs()
	for b.Loop() {
		h.recordHealth(in, resp)
	}
}

// A device's health check timeout is bounded: a huge one neither overflows
// nor keeps a device's health for ever.
func TestHealthTimeoutBounded(t *testing.T) {
	h := New(Options{})
	d, in := handMade(h)
	h.recordHealth(in, &drahealthv1.NodeWatchResourcesResponse{Devices: []*drahealthv1.DeviceHealth{{
		Device:                    &drahealthv1.DeviceIdentifier{PoolName: "pool", DeviceName: "gpu-0"},
		Health:                    drahealthv1.HealthStatus_HEALTHY,
		HealthCheckTimeoutSeconds: math.MaxInt64,
	}}})
	if devs := h.Drivers()[0].Devices; len(devs) != 1 || devs[0].Health != Healthy {
		t.Fatalf("devices = %+v, want gpu-0 Healthy", devs)
	}
	h.mu.Lock()
	dev := d.devices[deviceKey{"pool", "gpu-0"}]
	timeout := dev.timeout
	dev.receivedAt = dev.receivedAt.Add(-maxHealthTimeout - time.Second)
	h.mu.Unlock()
	if timeout != maxHealthTimeout {
		t.Errorf("timeout = %s, want %s", timeout, maxHealthTimeout)
	}
	if devs := h.Drivers()[0].Devices; devs[0].Health != Unknown {
		t.Errorf("health past the bounded timeout = %s, want Unknown", devs[0].Health)
	}
}

// A real driver whose health report is larger than the handler takes is
// refused it, and the handler says so.
func TestHealthReportTooLarge(t *testing.T) {
	logs := newLogs()
	e := start(t, Options{Logger: slog.New(logs)})
	const name = "big.example.com"
	var devices []kubeletplugin.DeviceHealth
	for i := range 20_000 {
		devices = append(devices, kubeletplugin.DeviceHealth{
			PoolName: "pool-a", DeviceName: fmt.Sprintf("gpu-%05d", i), Health: kubeletplugin.HealthStatusHealthy,
		})
	}
	e.startDriver(testDriver{devices: devices}, name, testenv.ShortDir(t, "drap"))
	e.pm.WaitSocket(e.regSocket(name, ""), pluginmanager.StateRegistered)

	r := logs.wait(t, "DRA health report too large; reopening the stream")
	if attr(r, "driver") != name || !strings.Contains(attr(r, "error"), "ResourceExhausted") {
		t.Errorf("logged %v", r)
	}
	if d, _ := e.driver(name); len(d.Devices) != 0 || !d.Available {
		t.Errorf("driver = %+v, want available, without devices", d)
	}
}

// Close ends a Register waiting for an endpoint that never becomes ready,
// and leaves no goroutine behind.
func TestCloseEndsRegisterInFlight(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())

	// The endpoint accepts connections and never speaks: gRPC waits for its
	// preface, for as long as CallTimeout lets it.
	endpoint := filepath.Join(testenv.ShortDir(t, "drae"), "dra.sock")
	l, err := net.Listen("unix", endpoint)
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu    sync.Mutex
		conns []net.Conn
	)
	accepted := make(chan struct{}, 1)
	acceptDone := make(chan struct{})
	go func() {
		defer close(acceptDone)
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			select {
			case accepted <- struct{}{}:
			default:
			}
		}
	}()
	defer func() {
		l.Close()
		<-acceptDone
		for _, c := range conns {
			c.Close()
		}
	}()

	h := New(Options{CallTimeout: time.Hour})
	ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
	defer cancel()
	p := pluginmanager.Plugin{Type: Type, Name: "a.example.com", Endpoint: endpoint, Versions: []string{"v1.DRAPlugin"}, Socket: "/reg/a.sock"}
	registerErr := make(chan error, 1)
	go func() { registerErr <- h.Register(ctx, p) }()
	select {
	case <-accepted:
	case <-time.After(testenv.Timeout):
		t.Fatal("Register did not connect to the endpoint")
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
	// Close waited for Register's work to end (its result reaches the test
	// after it returns, on a goroutine a loaded machine may run late).
	h.mu.Lock()
	inFlight := len(h.registering)
	h.mu.Unlock()
	if inFlight != 0 {
		t.Error("Close returned before Register did")
	}
	select {
	case err := <-registerErr:
		if !errors.Is(err, ErrClosed) {
			t.Errorf("Register = %v, want ErrClosed", err)
		}
	case <-time.After(testenv.Timeout):
		t.Error("Register did not return after Close")
	}
	if ds := h.Drivers(); len(ds) != 0 {
		t.Errorf("drivers = %+v, want none", ds)
	}
}

func TestPrintable(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   string
		n    int
		want string
	}{
		{"plain", "gpu-0", 10, "gpu-0"},
		{"space kept", "ECC errors on bank 3", 100, "ECC errors on bank 3"},
		{"printable non-ASCII kept", "café 日本", 100, "café 日本"},
		{"newline and tab", "a\nb\tc", 100, `a\nb\tc`},
		{"terminal escape", "\x1b[31mred", 100, `\x1b[31mred`},
		{"NUL and DEL", "a\x00b\x7f", 100, `a\x00b\x7f`},
		{"C1 control", "a\u0085b\u009bc", 100, `a\u0085b\u009bc`},
		{"bidi override", "abc\u202edcba", 100, `abc\u202edcba`},
		{"bidi isolate", "\u2066x\u2069", 100, `\u2066x\u2069`},
		{"zero width space", "a\u200bb", 100, `a\u200bb`},
		{"line separator", "a\u2028b", 100, `a\u2028b`},
		{"invalid UTF-8", "a\xffb\xc3", 100, `a\xffb\xc3`},
		{"replacement character kept", "a\uFFFDb", 100, "a\uFFFDb"},
		{"exactly n", "abcdefghij", 10, "abcdefghij"},
		{"cut", "abcdefghijk", 10, "abcdefg..."},
		{"cut at a character boundary", "ééééé", 8, "éé..."},
		{"escape not cut in two", "abcdef\x1b\x1b", 10, "abcdef..."},
		{"escape that fits", "abcdef\x1b", 10, `abcdef\x1b`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := printable(tc.in, tc.n)
			if got != tc.want {
				t.Errorf("printable(%q, %d) = %q, want %q", tc.in, tc.n, got, tc.want)
			}
			if len(got) > tc.n || !utf8.ValidString(got) {
				t.Errorf("printable(%q, %d) = %q: %d bytes, valid UTF-8 %v", tc.in, tc.n, got, len(got), utf8.ValidString(got))
			}
		})
	}
}

// onlyPrintable reports whether s has nothing but printable characters and
// spaces.
func onlyPrintable(s string) bool {
	return utf8.ValidString(s) && strings.IndexFunc(s, func(r rune) bool { return !unicode.IsPrint(r) && r != ' ' }) < 0
}

// What a driver chooses (pool and device names, messages, its errors) is
// shown and logged escaped and bounded.
func TestHealthEscaped(t *testing.T) {
	for _, tc := range []struct {
		name              string
		pool, device, msg string
		wantPool, wantDev string
		wantMsg           string
	}{
		{"plain", "pool-a", "gpu-0", "ECC errors", "pool-a", "gpu-0", "ECC errors"},
		{"terminal escapes", "pool\x1b[2J", "gpu\r0", "bad\x1b]0;pwned\x07",
			`pool\x1b[2J`, `gpu\r0`, `bad\x1b]0;pwned\a`},
		{"C1 and bidi", "pool\u009b", "gpu\u202e0", "\u2067hidden\u2069 \u0085",
			`pool\u009b`, `gpu\u202e0`, `\u2067hidden\u2069 \u0085`},
		{"invalid UTF-8", "pool\xff", "gpu\xc3", "msg\xfe",
			`pool\xff`, `gpu\xc3`, `msg\xfe`},
		{"long name, escaped", strings.Repeat("\x01", maxNameLen), "gpu-0", "",
			strings.Repeat(`\x01`, (maxNameLen-3)/4) + "...", "gpu-0", ""},
		{"long message, escaped", "pool-a", "gpu-0", strings.Repeat("\u202e", maxMessageLen),
			"pool-a", "gpu-0", strings.Repeat(`\u202e`, (maxMessageLen-3)/6) + "..."},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := New(Options{})
			_, in := handMade(h)
			h.recordHealth(in, &drahealthv1.NodeWatchResourcesResponse{Devices: []*drahealthv1.DeviceHealth{{
				Device:  &drahealthv1.DeviceIdentifier{PoolName: tc.pool, DeviceName: tc.device},
				Health:  drahealthv1.HealthStatus_UNHEALTHY,
				Message: tc.msg,
			}}})
			devs := h.Drivers()[0].Devices
			if len(devs) != 1 {
				t.Fatalf("devices = %+v, want 1", devs)
			}
			dev := devs[0]
			if dev.Pool != tc.wantPool || dev.Device != tc.wantDev || dev.Message != tc.wantMsg {
				t.Errorf("device = %q %q %q, want %q %q %q", dev.Pool, dev.Device, dev.Message, tc.wantPool, tc.wantDev, tc.wantMsg)
			}
			if len(dev.Pool) > maxNameLen || len(dev.Device) > maxNameLen || len(dev.Message) > maxMessageLen {
				t.Errorf("lengths %d, %d, %d exceed %d, %d, %d", len(dev.Pool), len(dev.Device), len(dev.Message), maxNameLen, maxNameLen, maxMessageLen)
			}
			b, err := json.Marshal(h.Drivers())
			if err != nil {
				t.Fatal(err)
			}
			if !onlyPrintable(string(b)) {
				t.Errorf("JSON has characters that are not printable: %q", b)
			}
		})
	}

	// An Unimplemented answer's message is the plugin's, and is logged
	// escaped and bounded.
	logs := newLogs()
	h := New(Options{Logger: slog.New(logs)})
	_, in := handMade(h)
	in.healthService = "v1.DRAResourceHealth"
	h.healthUnsupported(in, status.Error(codes.Unimplemented, "no\x1b[2J\u202e"+strings.Repeat("x", 10*maxMessageLen)))
	found, _ := logs.find("DRA driver does not report device health")
	if len(found) != 1 {
		t.Fatalf("logged %d times, want once", len(found))
	}
	reason := attr(found[0], "reason")
	if !strings.HasPrefix(reason, `no\x1b[2J\u202exxx`) || len(reason) > maxMessageLen || !onlyPrintable(reason) {
		t.Errorf("reason logged %q (%d bytes), want it escaped and at most %d bytes", reason, len(reason), maxMessageLen)
	}
}

// A health report shows in the instance's Details, by device, without the
// times (a resend that changes nothing changes no Details), and Changed
// tells of it at once: plugd's node agent judges the driver's devices by
// it within a second.
func TestHealthInDetails(t *testing.T) {
	changes := 0
	h := New(Options{Changed: func() { changes++ }})
	_, in := handMade(h)
	p := pluginmanager.Plugin{Socket: in.socket}
	h.recordHealth(in, healthReport("pool", "gpu", 2, drahealthv1.HealthStatus_UNHEALTHY))
	first, ok := h.Details(p).(*InstanceStatus)
	if !ok || changes != 1 {
		t.Fatalf("Details = %#v, Changed called %d times; want an *InstanceStatus, once", h.Details(p), changes)
	}
	want := []api.DRADeviceHealth{{Pool: "pool", Device: "gpu-00000", Health: "Unhealthy"}, {Pool: "pool", Device: "gpu-00001", Health: "Unhealthy"}}
	if !reflect.DeepEqual(first.Devices, want) {
		t.Errorf("Details' devices = %+v; want %+v", first.Devices, want)
	}
	h.recordHealth(in, healthReport("pool", "gpu", 2, drahealthv1.HealthStatus_UNHEALTHY))
	if again := h.Details(p).(*InstanceStatus); !reflect.DeepEqual(again, first) {
		t.Errorf("a resend changed Details: %+v, then %+v", first, again)
	}
}
