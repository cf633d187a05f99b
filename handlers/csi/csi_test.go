package csi_test

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"

	"github.com/plugd/plugd/api"
	"github.com/plugd/plugd/handlers/csi"
	"github.com/plugd/plugd/internal/testenv"
	"github.com/plugd/plugd/pluginmanager"
	"github.com/plugd/plugd/plugintest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

const driverName = "csi.example.com"

// driver is a fake CSI node plugin serving Identity and Node on a unix socket.
type driver struct {
	csipb.UnimplementedIdentityServer
	csipb.UnimplementedNodeServer
	path string

	mu       sync.Mutex
	name     string                     // what GetPluginInfo answers
	ready    bool                       // what Probe answers
	nodeInfo *csipb.NodeGetInfoResponse // what NodeGetInfo answers
	infoErr  error                      // or this error
	hang     bool                       // NodeGetInfo blocks until its call is cancelled
	calls    map[string]int             // by method

	stop func() // stops the driver's server, removing its socket
}

// serveDriver starts a driver named name on dir/csi.sock, ready, and stops it
// at the end of the test.
func serveDriver(t *testing.T, dir, name string) *driver {
	t.Helper()
	d := &driver{
		path:  filepath.Join(dir, "csi.sock"),
		name:  name,
		ready: true,
		nodeInfo: &csipb.NodeGetInfoResponse{
			NodeId:             "node-1",
			MaxVolumesPerNode:  16,
			AccessibleTopology: &csipb.Topology{Segments: map[string]string{"topology.example.com/zone": "z1"}},
		},
		calls: make(map[string]int),
	}
	d.stop = testenv.ServeGRPC(t, d.path, func(s grpc.ServiceRegistrar) {
		csipb.RegisterIdentityServer(s, d)
		csipb.RegisterNodeServer(s, d)
	}).Stop // closes the listener, which removes the socket file
	return d
}

func (d *driver) set(f func(d *driver)) {
	d.mu.Lock()
	defer d.mu.Unlock()
	f(d)
}

func (d *driver) called(method string) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.calls[method]
}

func (d *driver) count(method string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.calls[method]++
}

func (d *driver) GetPluginInfo(context.Context, *csipb.GetPluginInfoRequest) (*csipb.GetPluginInfoResponse, error) {
	d.count("GetPluginInfo")
	d.mu.Lock()
	defer d.mu.Unlock()
	return &csipb.GetPluginInfoResponse{Name: d.name, VendorVersion: "0.1.0", Manifest: map[string]string{"url": "https://example.com"}}, nil
}

func (d *driver) GetPluginCapabilities(context.Context, *csipb.GetPluginCapabilitiesRequest) (*csipb.GetPluginCapabilitiesResponse, error) {
	d.count("GetPluginCapabilities")
	return &csipb.GetPluginCapabilitiesResponse{Capabilities: []*csipb.PluginCapability{{
		Type: &csipb.PluginCapability_Service_{Service: &csipb.PluginCapability_Service{
			Type: csipb.PluginCapability_Service_VOLUME_ACCESSIBILITY_CONSTRAINTS,
		}},
	}}}, nil
}

func (d *driver) Probe(context.Context, *csipb.ProbeRequest) (*csipb.ProbeResponse, error) {
	d.count("Probe")
	d.mu.Lock()
	defer d.mu.Unlock()
	return &csipb.ProbeResponse{Ready: wrapperspb.Bool(d.ready)}, nil
}

func (d *driver) NodeGetCapabilities(context.Context, *csipb.NodeGetCapabilitiesRequest) (*csipb.NodeGetCapabilitiesResponse, error) {
	d.count("NodeGetCapabilities")
	rpc := func(typ csipb.NodeServiceCapability_RPC_Type) *csipb.NodeServiceCapability {
		return &csipb.NodeServiceCapability{Type: &csipb.NodeServiceCapability_Rpc{Rpc: &csipb.NodeServiceCapability_RPC{Type: typ}}}
	}
	return &csipb.NodeGetCapabilitiesResponse{Capabilities: []*csipb.NodeServiceCapability{
		rpc(csipb.NodeServiceCapability_RPC_STAGE_UNSTAGE_VOLUME),
		rpc(csipb.NodeServiceCapability_RPC_GET_VOLUME_STATS),
	}}, nil
}

func (d *driver) NodeGetInfo(ctx context.Context, _ *csipb.NodeGetInfoRequest) (*csipb.NodeGetInfoResponse, error) {
	d.count("NodeGetInfo")
	d.mu.Lock()
	hang, info, err := d.hang, d.nodeInfo, d.infoErr
	d.mu.Unlock()
	if hang {
		<-ctx.Done() // the caller's deadline, or the server stopping
		return nil, status.FromContextError(ctx.Err()).Err()
	}
	return info, err
}

// registrar is node-driver-registrar's side of the protocol, written as it
// writes it: a plain gRPC server for the Registration service on its own
// socket in the registry directory, announcing the driver's endpoint.
type registrar struct {
	registerapi.UnimplementedRegistrationServer
	path     string
	info     *registerapi.PluginInfo
	stopping func()
	// exitWhenRefused makes it stop serving once told it is not
	// registered, as node-driver-registrar exits.
	exitWhenRefused atomic.Bool

	mu       sync.Mutex
	statuses []*registerapi.RegistrationStatus
	changed  chan struct{} // signalled on every status
}

// startRegistrar announces a CSI driver on regDir/socket (default
// "<name>-reg.sock", as node-driver-registrar names it) with the given
// endpoint and versions, and stops at the end of the test.
func startRegistrar(t *testing.T, regDir, socket, name, endpoint string, versions ...string) *registrar {
	t.Helper()
	if socket == "" {
		socket = name + "-reg.sock"
	}
	r := &registrar{
		path:    filepath.Join(regDir, socket),
		info:    &registerapi.PluginInfo{Type: "CSIPlugin", Name: name, Endpoint: endpoint, SupportedVersions: versions},
		changed: make(chan struct{}, 1),
	}
	// node-driver-registrar removes a socket left by its previous run.
	if err := os.Remove(r.path); err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	r.stopping = testenv.ServeGRPC(t, r.path, func(s grpc.ServiceRegistrar) { registerapi.RegisterRegistrationServer(s, r) }).Stop
	return r
}

// stop stops serving and removes the socket, as node-driver-registrar does
// when its pod is deleted.
func (r *registrar) stop() { r.stopping() }

func (r *registrar) GetInfo(context.Context, *registerapi.InfoRequest) (*registerapi.PluginInfo, error) {
	return r.info, nil
}

func (r *registrar) NotifyRegistrationStatus(_ context.Context, s *registerapi.RegistrationStatus) (*registerapi.RegistrationStatusResponse, error) {
	r.mu.Lock()
	r.statuses = append(r.statuses, s)
	r.mu.Unlock()
	select {
	case r.changed <- struct{}{}:
	default:
	}
	if !s.PluginRegistered && r.exitWhenRefused.Load() {
		go r.stopping() // after this answer
	}
	return &registerapi.RegistrationStatusResponse{}, nil
}

// told waits for the first status that says registered == want.
func (r *registrar) told(t *testing.T, want bool) *registerapi.RegistrationStatus {
	t.Helper()
	deadline := time.After(testenv.Timeout)
	for {
		r.mu.Lock()
		i := slices.IndexFunc(r.statuses, func(s *registerapi.RegistrationStatus) bool { return s.PluginRegistered == want })
		var s *registerapi.RegistrationStatus
		if i >= 0 {
			s = r.statuses[i]
		}
		all := slices.Clone(r.statuses)
		r.mu.Unlock()
		if s != nil {
			return s
		}
		select {
		case <-r.changed:
		case <-deadline:
			t.Fatalf("timed out waiting for %s to be told registered=%v; told %v", filepath.Base(r.path), want, all)
		}
	}
}

func (r *registrar) all() []*registerapi.RegistrationStatus {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.statuses)
}

// plugin is what the manager hands the handler for r.
func (r *registrar) plugin() pluginmanager.Plugin {
	return pluginmanager.Plugin{Type: r.info.Type, Name: r.info.Name, Endpoint: r.info.Endpoint, Versions: r.info.SupportedVersions, Socket: r.path}
}

// harness is a running manager with the CSI handler.
type harness struct {
	*plugintest.Manager
	t *testing.T
	m *pluginmanager.Manager
	h *csi.Handler
}

// start runs a manager on a fresh registry directory with h for CSIPlugin and
// fast retries, until the end of the test.
func start(t *testing.T, h *csi.Handler) *harness {
	t.Helper()
	return newHarness(t, h, pluginmanager.Options{})
}

// newHarness runs a manager with opts and h for CSIPlugin, until the end of
// the test.
func newHarness(t *testing.T, h *csi.Handler, opts pluginmanager.Options) *harness {
	t.Helper()
	t.Cleanup(h.Close) // after the manager has stopped
	pm := plugintest.NewManagerWith(t, opts, map[string]pluginmanager.Handler{csi.Type: h})
	pm.Timeout = testenv.Timeout
	return &harness{Manager: pm, t: t, m: pm.Manager(), h: h}
}

// event waits for the next event of type typ and reason for the socket at path.
func (hm *harness) event(path string, typ pluginmanager.EventType, reason pluginmanager.Reason) pluginmanager.Event {
	hm.t.Helper()
	for {
		if ev := hm.WaitEvent(path, typ); ev.Reason == reason {
			return ev
		}
	}
}

// wantInstance is the instance a default driver at endpoint registers from socket.
func wantInstance(socket, endpoint, version string) csi.Instance {
	return csi.Instance{
		Socket:        socket,
		Endpoint:      endpoint,
		Version:       version,
		VendorVersion: "0.1.0",
		Manifest:      map[string]string{"url": "https://example.com"},
		NodeID:        "node-1",
		MaxVolumes:    16,
		Topology:      map[string]string{"topology.example.com/zone": "z1"},
		Capabilities:  []string{"STAGE_UNSTAGE_VOLUME", "GET_VOLUME_STATS"},
	}
}

// checkDrivers compares a snapshot with want, ignoring (but requiring) the
// registration times.
func checkDrivers(t *testing.T, got []csi.Driver, want ...csi.Driver) {
	t.Helper()
	got = slices.Clone(got)
	for i, d := range got {
		if d.Active.RegisteredAt.IsZero() {
			t.Errorf("driver %s: active instance has no registration time", d.Name)
		}
		d.Active.RegisteredAt = time.Time{}
		d.Instances = slices.Clone(d.Instances)
		for j := range d.Instances {
			if d.Instances[j].RegisteredAt.IsZero() {
				t.Errorf("driver %s: instance %s has no registration time", d.Name, d.Instances[j].Socket)
			}
			d.Instances[j].RegisteredAt = time.Time{}
		}
		got[i] = d
	}
	if want == nil {
		want = []csi.Driver{}
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("drivers:\n got %+v\nwant %+v", got, want)
	}
}

func TestRegister(t *testing.T) {
	for _, tc := range []struct{ name, scheme string }{{"path", ""}, {"unix URL", "unix://"}} {
		t.Run(tc.name, func(t *testing.T) {
			d := serveDriver(t, testenv.ShortDir(t, "csi"), driverName)
			reg := prometheus.NewPedanticRegistry()
			hm := start(t, csi.New(csi.Options{Registerer: reg}))
			r := startRegistrar(t, hm.Dir, "", driverName, tc.scheme+d.path, "1.0.0")

			if st := r.told(t, true); st.Error != "" {
				t.Errorf("registrar told %+v", st)
			}
			s := hm.WaitSocket(r.path, pluginmanager.StateRegistered)
			if n := len(r.all()); n != 1 {
				t.Errorf("registrar notified %d times: %v", n, r.all())
			}
			want := wantInstance(r.path, d.path, "1.0.0")
			checkDrivers(t, hm.h.Drivers(), csi.Driver{Name: driverName, Active: want, Instances: []csi.Instance{want}})

			// Details is what plugd's status API shows for the plugin, and
			// where plugd's node agent reads its node id.
			if d, ok := hm.h.Details(s.Plugin).(api.CSIDetails); !ok || d.NodeID != "node-1" {
				t.Errorf("Details = %#v; want an api.CSIDetails with the node id", hm.h.Details(s.Plugin))
			}
			b, err := json.Marshal(hm.h.Details(s.Plugin))
			if err != nil {
				t.Fatal(err)
			}
			var details map[string]any
			if err := json.Unmarshal(b, &details); err != nil {
				t.Fatal(err)
			}
			for k, v := range map[string]any{
				"driver": driverName, "active": true, "instances": 1.0, "socket": r.path, "endpoint": d.path,
				"version": "1.0.0", "vendorVersion": "0.1.0", "nodeID": "node-1", "maxVolumes": 16.0,
				"topology":     map[string]any{"topology.example.com/zone": "z1"},
				"capabilities": []any{"STAGE_UNSTAGE_VOLUME", "GET_VOLUME_STATS"},
			} {
				if !reflect.DeepEqual(details[k], v) {
					t.Errorf("details[%q] = %#v, want %#v; details: %s", k, details[k], v, b)
				}
			}
			if _, err := time.Parse(time.RFC3339Nano, details["registeredAt"].(string)); err != nil {
				t.Errorf("details registeredAt: %v", err)
			}

			err = testutil.CollectAndCompare(reg, strings.NewReader(`
# HELP plugd_csi_calls_total CSI calls made to drivers, by method and gRPC status code.
# TYPE plugd_csi_calls_total counter
plugd_csi_calls_total{code="OK",method="GetPluginInfo"} 1
plugd_csi_calls_total{code="OK",method="NodeGetCapabilities"} 1
plugd_csi_calls_total{code="OK",method="NodeGetInfo"} 1
plugd_csi_calls_total{code="OK",method="Probe"} 1
# HELP plugd_csi_driver_instances Registered instances of each CSI driver; more than one during a rolling restart.
# TYPE plugd_csi_driver_instances gauge
plugd_csi_driver_instances{driver="csi.example.com"} 1
# HELP plugd_csi_drivers CSI drivers registered (with at least one instance).
# TYPE plugd_csi_drivers gauge
plugd_csi_drivers 1
`))
			if err != nil {
				t.Error(err)
			}
		})
	}
}

func TestUnsupportedVersionRejected(t *testing.T) {
	hm := start(t, csi.New(csi.Options{}))
	good := serveDriver(t, testenv.ShortDir(t, "csi"), driverName)
	startRegistrar(t, hm.Dir, "", driverName, good.path, "1.0.0").told(t, true)

	old := serveDriver(t, testenv.ShortDir(t, "csi"), "old.example.com")
	r := startRegistrar(t, hm.Dir, "", "old.example.com", old.path, "0.3.0")
	st := r.told(t, false)
	t.Log(st.Error)
	for _, want := range []string{`"old.example.com"`, `["0.3.0"]`, "CSI 1.x"} {
		if !strings.Contains(st.Error, want) {
			t.Errorf("registrar told %q, want it to say %s", st.Error, want)
		}
	}
	s := hm.WaitSocket(r.path, pluginmanager.StateRejected)
	if s.Reason != pluginmanager.ReasonValidate || s.LastError != st.Error {
		t.Errorf("status = %s %q, want the validation error the registrar was told", s.Reason, s.LastError)
	}
	if n := old.called("GetPluginInfo"); n != 0 {
		t.Errorf("a rejected driver was called %d times", n)
	}
	if ds := hm.h.Drivers(); len(ds) != 1 || ds[0].Name != driverName {
		t.Errorf("drivers = %+v, want only %s", ds, driverName)
	}
}

func TestNameMismatchRejected(t *testing.T) {
	hm := start(t, csi.New(csi.Options{}))
	d := serveDriver(t, testenv.ShortDir(t, "csi"), "other.example.com")
	r := startRegistrar(t, hm.Dir, "", driverName, d.path, "1.0.0")

	st := r.told(t, false)
	for _, want := range []string{`"csi.example.com"`, `"other.example.com"`, "GetPluginInfo"} {
		if !strings.Contains(st.Error, want) {
			t.Errorf("registrar told %q, want it to name %s", st.Error, want)
		}
	}
	if s := hm.WaitSocket(r.path, pluginmanager.StateRejected); s.Reason != pluginmanager.ReasonRegister {
		t.Errorf("rejected for %s, want %s", s.Reason, pluginmanager.ReasonRegister)
	}
	if n := d.called("GetPluginInfo"); n != 1 {
		t.Errorf("GetPluginInfo called %d times, want once: a terminal error is not retried", n)
	}
	checkDrivers(t, hm.h.Drivers())
}

func TestNotReadyRetried(t *testing.T) {
	hm := start(t, csi.New(csi.Options{}))
	d := serveDriver(t, testenv.ShortDir(t, "csi"), driverName)
	d.set(func(d *driver) { d.ready = false })
	r := startRegistrar(t, hm.Dir, "", driverName, d.path, "1.0.0")

	ev := hm.event(r.path, pluginmanager.EventFailed, pluginmanager.ReasonRegister)
	if !strings.Contains(ev.Error, "driver not ready") {
		t.Errorf("failure %q, want it to say the driver is not ready", ev.Error)
	}
	if st := r.told(t, false); !strings.Contains(st.Error, "driver not ready") {
		t.Errorf("registrar told %q", st.Error)
	}
	checkDrivers(t, hm.h.Drivers())

	d.set(func(d *driver) { d.ready = true })
	r.told(t, true)
	hm.WaitSocket(r.path, pluginmanager.StateRegistered)
	want := wantInstance(r.path, d.path, "1.0.0")
	checkDrivers(t, hm.h.Drivers(), csi.Driver{Name: driverName, Active: want, Instances: []csi.Instance{want}})
	if n := d.called("Probe"); n < 2 {
		t.Errorf("Probe called %d times, want a retry", n)
	}
}

func TestRollingRestart(t *testing.T) {
	hm := start(t, csi.New(csi.Options{}))
	oldDriver := serveDriver(t, testenv.ShortDir(t, "csi"), driverName)
	oldReg := startRegistrar(t, hm.Dir, "", driverName, oldDriver.path, "1.0.0")
	oldReg.told(t, true)

	// The new pod's driver serves on its own endpoint, and its registrar on a
	// socket of its own; it offers more versions, the highest 1.x of which is
	// chosen.
	newDriver := serveDriver(t, testenv.ShortDir(t, "csi"), driverName)
	newReg := startRegistrar(t, hm.Dir, driverName+"-new-reg.sock", driverName, newDriver.path, "0.3.0", "1.2", "v1.5.0", "1.0.0")
	if st := newReg.told(t, true); st.Error != "" {
		t.Errorf("new registrar told %+v", st)
	}
	if s := hm.WaitSocket(newReg.path, pluginmanager.StateRegistered); !s.Newest {
		t.Errorf("new instance's status %+v is not the newest", s)
	}
	oldInst := wantInstance(oldReg.path, oldDriver.path, "1.0.0")
	newInst := wantInstance(newReg.path, newDriver.path, "v1.5.0")
	checkDrivers(t, hm.h.Drivers(), csi.Driver{Name: driverName, Active: newInst, Instances: []csi.Instance{oldInst, newInst}})
	if b, _ := json.Marshal(hm.h.Details(oldReg.plugin())); !strings.Contains(string(b), `"active":false,"instances":2`) {
		t.Errorf("details of the old instance = %s, want it inactive, one of two", b)
	}

	// The old pod goes: the driver stays registered, with the new instance.
	oldReg.stop()
	hm.WaitGone(oldReg.path)
	checkDrivers(t, hm.h.Drivers(), csi.Driver{Name: driverName, Active: newInst, Instances: []csi.Instance{newInst}})
	hm.WaitSocket(newReg.path, pluginmanager.StateRegistered)
	if hm.h.Details(oldReg.plugin()) != nil {
		t.Error("details of the old instance are still there")
	}
}

func TestDeregister(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	hm := start(t, csi.New(csi.Options{Registerer: reg}))
	d := serveDriver(t, testenv.ShortDir(t, "csi"), driverName)
	r := startRegistrar(t, hm.Dir, "", driverName, d.path, "1.0.0")
	r.told(t, true)
	hm.WaitSocket(r.path, pluginmanager.StateRegistered)
	if len(hm.h.Drivers()) != 1 {
		t.Fatalf("drivers = %+v", hm.h.Drivers())
	}

	r.stop()
	hm.WaitGone(r.path)
	checkDrivers(t, hm.h.Drivers())
	if got := hm.h.Details(r.plugin()); got != nil {
		t.Errorf("details = %+v after deregistration, want nil", got)
	}
	err := testutil.CollectAndCompare(reg, strings.NewReader(`
# HELP plugd_csi_drivers CSI drivers registered (with at least one instance).
# TYPE plugd_csi_drivers gauge
plugd_csi_drivers 0
`), "plugd_csi_drivers", "plugd_csi_driver_instances")
	if err != nil {
		t.Error(err)
	}
}

func TestHangingDriverFailsAtDeadline(t *testing.T) {
	const timeout = 300 * time.Millisecond
	hm := start(t, csi.New(csi.Options{CallTimeout: timeout}))
	d := serveDriver(t, testenv.ShortDir(t, "csi"), driverName)
	d.set(func(d *driver) { d.hang = true })
	r := startRegistrar(t, hm.Dir, "", driverName, d.path, "1.0.0")

	ev := hm.event(r.path, pluginmanager.EventFailed, pluginmanager.ReasonRegister)
	t.Log(ev.Error)
	// The manager's own deadline for the handler is testenv.Timeout and
	// would be named otherwise: the error text shows that ours fired.
	if !strings.Contains(ev.Error, "NodeGetInfo") || !strings.Contains(ev.Error, "no answer within "+timeout.String()) {
		t.Errorf("failure %q, want NodeGetInfo's deadline", ev.Error)
	}
	checkDrivers(t, hm.h.Drivers())

	// Once the driver answers, a retry registers it.
	d.set(func(d *driver) { d.hang = false })
	r.told(t, true)
	if ds := hm.h.Drivers(); len(ds) != 1 || ds[0].Active.NodeID != "node-1" {
		t.Errorf("drivers = %+v", ds)
	}
}

// The handler on its own, without a manager: what Validate accepts.
func TestValidate(t *testing.T) {
	h := csi.New(csi.Options{})
	long := strings.Repeat("a", 63)
	for _, tc := range []struct {
		name, endpoint string
		versions       []string
		wantErr        string // substring; empty means accepted
	}{
		{name: "csi.example.com", versions: []string{"1.0.0"}},
		{name: "a", versions: []string{"1.2"}},
		{name: "A_b-c.9", versions: []string{"v1.5.0"}},
		{name: long, versions: []string{"0.3.0", "1.0.0-rc1"}},
		// As the kubelet reads versions: four numbers, or a suffix after the
		// second, are accepted (test/kube compares every case with the
		// kubelet's own handler).
		{name: "csi.example.com", versions: []string{"1.0.0.0"}},
		{name: "csi.example.com", versions: []string{"2.0.0", "junk", "1.0-"}},
		{name: "csi.example.com", endpoint: "unix:///run/csi/csi.sock", versions: []string{"1.0.0"}},
		{name: "", versions: []string{"1.0.0"}, wantErr: "empty CSI driver name"},
		{name: long + "a", versions: []string{"1.0.0"}, wantErr: "64 characters long"},
		{name: "-csi.example.com", versions: []string{"1.0.0"}, wantErr: "begin and end with a letter or digit"},
		{name: "csi.example.com.", versions: []string{"1.0.0"}, wantErr: "begin and end with a letter or digit"},
		{name: "csi/example", versions: []string{"1.0.0"}, wantErr: `character '/' is not allowed`},
		{name: "csi.exämple.com", versions: []string{"1.0.0"}, wantErr: `character 'ä' is not allowed`},
		{name: "csi.example.com", versions: []string{"0.3.0", "0.2.0"}, wantErr: `offers versions ["0.3.0" "0.2.0"], none of which plugd supports: it supports CSI 1.x`},
		{name: "csi.example.com", versions: nil, wantErr: "offers versions [], none of which plugd supports: it supports CSI 1.x; it offers none"},
		{name: "csi.example.com", versions: []string{"2.0.0", "1.x", "-1.0", "v", "1..0", "01.0"}, wantErr: "none of which"},
		{name: "csi.example.com", versions: []string{"1"}, wantErr: `it supports CSI 1.x; none is a version as the kubelet reads them, two or more numbers such as "1.0.0", "1.2" or "v1.5.0" (illegal version string "1")`},
		{name: "csi.example.com", versions: []string{"junk", "01.0"}, wantErr: `(could not parse "junk" as version)`},
		{name: "csi.example.com", versions: []string{"2.0.0", "x"}, wantErr: `offers versions ["2.0.0" "x"], none of which plugd supports: it supports CSI 1.x; none of them is a 1.x`},
		{name: "csi.example.com", endpoint: "csi.sock", versions: []string{"1.0.0"}, wantErr: "not an absolute path"},
		{name: "csi.example.com", endpoint: "unix://run/csi.sock", versions: []string{"1.0.0"}, wantErr: "not an absolute"},
		{name: "csi.example.com", endpoint: "/" + strings.Repeat("x", 107), versions: []string{"1.0.0"}, wantErr: "must be shorter than 108 bytes"},
	} {
		endpoint := tc.endpoint
		if endpoint == "" {
			endpoint = "/run/csi/csi.sock"
		}
		p := pluginmanager.Plugin{Type: csi.Type, Name: tc.name, Endpoint: endpoint, Versions: tc.versions, Socket: "/reg/x.sock"}
		err := h.Validate(context.Background(), p)
		switch {
		case tc.wantErr == "" && err != nil:
			t.Errorf("Validate(%q, %q, %q) = %v, want accepted", tc.name, endpoint, tc.versions, err)
		case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
			t.Errorf("Validate(%q, %q, %q) = %v, want an error saying %s", tc.name, endpoint, tc.versions, err, tc.wantErr)
		}
	}
}

// The rule for a second instance of a driver, and which instance is active,
// with the handler called directly.
func TestSecondInstance(t *testing.T) {
	ctx := context.Background()
	h := csi.New(csi.Options{})
	defer h.Close()
	regDir := testenv.ShortDir(t, "reg")
	d := serveDriver(t, testenv.ShortDir(t, "csi"), driverName)
	other := serveDriver(t, testenv.ShortDir(t, "csi"), driverName)

	// The first instance's registrar is alive: its socket accepts connections.
	a := pluginmanager.Plugin{Type: csi.Type, Name: driverName, Endpoint: d.path, Versions: []string{"1.0.0"}, Socket: filepath.Join(regDir, "a.sock")}
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: a.Socket, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if err := h.Register(ctx, a); err != nil {
		t.Fatal(err)
	}

	b := a
	b.Socket = filepath.Join(regDir, "b.sock")
	check := func(what string, p pluginmanager.Plugin, wantErr string) {
		t.Helper()
		err := h.Validate(ctx, p)
		t.Logf("%s: %v", what, err)
		switch {
		case wantErr == "" && err != nil:
			t.Errorf("%s: refused: %v", what, err)
		case wantErr != "" && (err == nil || !strings.Contains(err.Error(), wantErr)):
			t.Errorf("%s: Validate = %v, want an error saying %s", what, err, wantErr)
		}
	}
	check("same endpoint and version, live registrar", b, "already registered from "+a.Socket+" with the same endpoint")
	b.Versions = []string{"0.3.0", "1.0.0-rc1"}
	check("the same version with a suffix, equal as the kubelet reads it", b, `at version "1.0.0", not lower than "1.0.0-rc1"`)
	b.Versions = []string{"v1.1"}
	check("higher version", b, "")
	b.Versions = []string{"1.0.0"}
	b.Endpoint = other.path
	check("other endpoint", b, "")
	check("its own socket again", a, "")

	// The first registrar dies, leaving its socket file behind.
	l.SetUnlinkOnClose(false)
	l.Close()
	b.Endpoint = d.path
	check("same endpoint, stale registration socket", b, "")
	os.Remove(a.Socket)
	check("same endpoint, registration socket gone", b, "")

	// Accepted, b is registered and active; a stays until it is deregistered,
	// and becomes active again if b goes first.
	b.Versions = []string{"1.0.0", "v1.1"}
	if err := h.Register(ctx, b); err != nil {
		t.Fatal(err)
	}
	ia, ib := wantInstance(a.Socket, d.path, "1.0.0"), wantInstance(b.Socket, d.path, "v1.1")
	checkDrivers(t, h.Drivers(), csi.Driver{Name: driverName, Active: ib, Instances: []csi.Instance{ia, ib}})
	h.Deregister(ctx, b)
	checkDrivers(t, h.Drivers(), csi.Driver{Name: driverName, Active: ia, Instances: []csi.Instance{ia}})
	h.Deregister(ctx, b) // again: nothing to do
	h.Deregister(ctx, a)
	checkDrivers(t, h.Drivers())
}

// Answers that break the CSI spec are refused with a reason; a caller's
// deadline shorter than CallTimeout bounds the calls.
func TestRegisterBadAnswers(t *testing.T) {
	ctx := context.Background()
	segments := make(map[string]string)
	for i := range 65 {
		segments["topology.example.com/k"+strings.Repeat("x", i)] = "v"
	}
	for _, tc := range []struct {
		name    string
		set     func(d *driver)
		wantErr string
	}{
		{"other name", func(d *driver) { d.name = "other.example.com" }, `registered as "csi.example.com", but its endpoint`},
		{"empty node id", func(d *driver) { d.nodeInfo = &csipb.NodeGetInfoResponse{} }, "node_id is empty"},
		{"long node id", func(d *driver) { d.nodeInfo = &csipb.NodeGetInfoResponse{NodeId: strings.Repeat("n", 257)} }, "node_id is 257 bytes long"},
		{"negative max volumes", func(d *driver) { d.nodeInfo = &csipb.NodeGetInfoResponse{NodeId: "n", MaxVolumesPerNode: -1} }, "max_volumes_per_node is -1"},
		{"too many segments", func(d *driver) {
			d.nodeInfo = &csipb.NodeGetInfoResponse{NodeId: "n", AccessibleTopology: &csipb.Topology{Segments: segments}}
		}, "65 segments"},
		{"long segment value", func(d *driver) {
			d.nodeInfo = &csipb.NodeGetInfoResponse{NodeId: "n", AccessibleTopology: &csipb.Topology{Segments: map[string]string{"zone": strings.Repeat("z", 64)}}}
		}, "longer than 63 bytes"},
		{"not implemented", func(d *driver) { d.infoErr = status.Error(codes.Unimplemented, "no") }, "every CSI node plugin must implement it"},
		{"not ready", func(d *driver) { d.ready = false }, "driver not ready"},
		{"hangs", func(d *driver) { d.hang = true }, "context deadline exceeded"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := serveDriver(t, testenv.ShortDir(t, "csi"), driverName)
			d.set(tc.set)
			h := csi.New(csi.Options{}) // 10s per call: the hang is cut by ctx below
			// Only the hang waits for the deadline: the others get
			// testenv.Timeout, a failure bound, since a loaded machine may
			// take longer than 200ms to answer.
			cut := testenv.Timeout
			if tc.name == "hangs" {
				cut = 200 * time.Millisecond
			}
			ctx, cancel := context.WithTimeout(ctx, cut)
			defer cancel()
			p := pluginmanager.Plugin{Type: csi.Type, Name: driverName, Endpoint: d.path, Versions: []string{"1.0.0"}, Socket: "/reg/x.sock"}
			err := h.Register(ctx, p)
			t.Log(err)
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("Register = %v, want an error saying %s", err, tc.wantErr)
			}
			checkDrivers(t, h.Drivers())
		})
	}
}

// A CSI driver that dies while its node-driver-registrar stays up is
// Unhealthy, reason endpoint, at once, in manage mode as when observing:
// the handler watches the driver's endpoint. Back, on another node ID, it is
// Registered again with what it says now.
func TestDeadDriverIsUnhealthy(t *testing.T) {
	hm := start(t, csi.New(csi.Options{}))
	dir := testenv.ShortDir(t, "csi")
	d := serveDriver(t, dir, driverName)
	r := startRegistrar(t, hm.Dir, "", driverName, d.path, "1.0.0")
	hm.WaitSocket(r.path, pluginmanager.StateRegistered)

	d.stop()
	ev := hm.event(r.path, pluginmanager.EventUnhealthy, pluginmanager.ReasonEndpoint)
	if !strings.Contains(ev.Error, d.path) {
		t.Errorf("event %+v does not name the endpoint", ev)
	}
	if s := hm.WaitSocket(r.path, pluginmanager.StateUnhealthy); s.Reason != pluginmanager.ReasonEndpoint {
		t.Errorf("status %+v, want Unhealthy for the endpoint", s)
	}

	again := serveDriver(t, dir, driverName)
	again.set(func(d *driver) { d.nodeInfo.NodeId = "node-2" })
	hm.WaitEvent(r.path, pluginmanager.EventHealthy)
	if ds := hm.h.Drivers(); len(ds) != 1 || ds[0].Active.NodeID != "node-2" {
		t.Errorf("drivers = %+v, want the driver's new node ID", ds)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.statuses) != 1 {
		t.Errorf("the registrar was told %v, want registered once", r.statuses)
	}
}

// Issue 25, item 1: a driver that dies while its registrar lives is
// deregistered at the end of its grace period, and its registrar is never
// told registered=false for it (node-driver-registrar exits when told so,
// and nothing would register the driver again): the manager waits for the
// endpoint to serve, then registers the driver again and says so.
func TestDeadDriverPastGraceIsNeverToldFalse(t *testing.T) {
	hm := newHarness(t, csi.New(csi.Options{}), pluginmanager.Options{UnhealthyGrace: 50 * time.Millisecond})
	dir := testenv.ShortDir(t, "csi")
	d := serveDriver(t, dir, driverName)
	r := startRegistrar(t, hm.Dir, "", driverName, d.path, "1.0.0")
	r.exitWhenRefused.Store(true)
	hm.WaitSocket(r.path, pluginmanager.StateRegistered)

	d.stop()
	hm.event(r.path, pluginmanager.EventUnhealthy, pluginmanager.ReasonEndpoint)
	hm.WaitEvent(r.path, pluginmanager.EventDeregistered)
	if ds := hm.h.Drivers(); len(ds) != 0 {
		t.Errorf("drivers = %+v after the grace period, want none", ds)
	}
	s := hm.WaitSocket(r.path, pluginmanager.StateFailed)
	if s.Reason != pluginmanager.ReasonEndpoint || !strings.Contains(s.LastError, "waiting for its endpoint") {
		t.Errorf("status %+v, want Failed for the endpoint, waiting for it", s)
	}

	// A driver starting again that accepts connections and closes them:
	// its endpoint takes a connection, so the manager tries the
	// registration again, whose NodeGetInfo fails. Three connections
	// are a look, an attempt, and the look after it.
	l, err := net.Listen("unix", d.path)
	if err != nil {
		t.Fatal(err)
	}
	accepted := make(chan struct{}, 1)
	closed := make(chan struct{})
	go func() {
		defer close(closed)
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			c.Close()
			select {
			case accepted <- struct{}{}:
			default:
			}
		}
	}()
	for range 3 {
		select {
		case <-accepted:
		case <-time.After(testenv.Timeout):
			t.Fatalf("the manager did not connect to the endpoint again; the registrar was told %v", r.all())
		}
	}
	l.Close() // removes the socket
	<-closed
	for _, s := range r.all() {
		if !s.PluginRegistered {
			t.Fatalf("the registrar was told %v: a registrar that was told it is registered must never be told otherwise", s)
		}
	}

	serveDriver(t, dir, driverName)
	hm.WaitSocket(r.path, pluginmanager.StateRegistered)
	if ds := hm.h.Drivers(); len(ds) != 1 {
		t.Errorf("drivers = %+v, want the driver again", ds)
	}
	got := r.all()
	if len(got) != 2 || !got[0].PluginRegistered || !got[1].PluginRegistered {
		t.Errorf("the registrar was told %v, want registered twice, never not registered", got)
	}
}

// Issue 13, item 3: the handler checks the endpoint roots itself at every
// connection to a driver: an endpoint inside them that became a symlink to a
// socket outside them after the manager's check is refused, not connected
// to; one that stays inside is fine.
func TestEndpointRootsCheckedAtConnection(t *testing.T) {
	base := testenv.ShortDir(t, "csr")
	root, outside, good := filepath.Join(base, "root"), filepath.Join(base, "out"), filepath.Join(base, "root", "good")
	for _, d := range []string{good, outside} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	evil := testenv.CountAccepts(t, filepath.Join(outside, "evil.sock"))
	if err := os.Symlink(filepath.Join(outside, "evil.sock"), filepath.Join(root, "csi.sock")); err != nil {
		t.Fatal(err)
	}
	serveDriver(t, good, "good.example.com")
	h := csi.New(csi.Options{EndpointRoots: []string{root}})
	ctx, cancel := context.WithTimeout(context.Background(), testenv.Timeout)
	defer cancel()
	plugin := func(name, endpoint string) pluginmanager.Plugin {
		return pluginmanager.Plugin{Type: "CSIPlugin", Name: name, Endpoint: endpoint, Socket: filepath.Join(base, name+"-reg.sock"), Versions: []string{"1.0.0"}}
	}
	err := h.Register(ctx, plugin("evil.example.com", filepath.Join(root, "csi.sock")))
	if err == nil || !strings.Contains(err.Error(), "outside the directories endpoints must be in") {
		t.Errorf("Register through a symlink out of the roots: %v, want a refusal that says so", err)
	}
	if n := evil.Count(); n != 0 {
		t.Errorf("the handler connected %d times to the socket outside the roots", n)
	}
	if err := h.Register(ctx, plugin("good.example.com", filepath.Join(good, "csi.sock"))); err != nil {
		t.Errorf("Register inside the roots: %v", err)
	}
}
