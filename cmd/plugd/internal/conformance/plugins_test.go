package conformance

// The plugins the kit is tested against, run as processes of this test
// binary (TestMain hands them "conformance-test-plugin KIND [BREAK]"), as
// the kit runs any plugin: told its directories by the environment, stopped
// by SIGTERM.
//
// KIND is a plugin built on another's library (dra-kubeletplugin: a DRA
// driver on k8s.io/dynamic-resource-allocation/kubeletplugin), or one of
// this file's hand-written plugins (csi: a CSI driver behind a
// registrar-like peer that, as node-driver-registrar does, asks the driver
// its name and exits when refused; dra; device), which BREAK breaks in one
// way each, so that each check is seen to fail.

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/fsnotify/fsnotify"
	"github.com/go-logr/logr"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2"
	deviceapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	drahealthv1 "k8s.io/kubelet/pkg/apis/dra-health/v1"
	drav1 "k8s.io/kubelet/pkg/apis/dra/v1"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
)

const pluginArg = "conformance-test-plugin"

// pluginMain runs the plugin args name until SIGTERM, and returns its exit
// status.
func pluginMain(args []string) int {
	kind, brk := args[0], ""
	if len(args) > 1 {
		brk = args[1]
	}
	regDir, epDir := os.Getenv(envRegistryDir), os.Getenv(envEndpointDir)
	term := make(chan os.Signal, 1)
	if brk == "ignore-sigterm" {
		signal.Ignore(syscall.SIGTERM)
	} else {
		signal.Notify(term, syscall.SIGTERM)
	}
	if brk != "dp-health-ignored" {
		go watchUnhealthy(epDir)
	}
	var err error
	switch kind {
	case "dra-kubeletplugin":
		err = runKubeletPlugin(regDir, epDir, term)
	case "dpsock":
		err = runKubeletSockPlugin(epDir, brk, term)
	default:
		err = (&mutant{kind: kind, brk: brk, regDir: regDir, epDir: epDir}).run(term)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "test plugin %s %s: %v\n", kind, brk, err)
		return 1
	}
	return 0
}

// healthCommand is the --health-command the test device plugins follow:
// it makes the file unhealthyFile in the endpoint directory, on which the
// plugin's gpu-1 turns Unhealthy.
const (
	healthCommand = `test -n "$` + envPluginPID + `" && touch "$` + envEndpointDir + `/` + unhealthyFile + `"`
	unhealthyFile = "unhealthy"
)

// unhealthy is closed when the test plugin's gpu-1 has turned Unhealthy.
var unhealthy = make(chan struct{})

// watchUnhealthy closes unhealthy once unhealthyFile is made in dir.
func watchUnhealthy(dir string) {
	w, err := fsnotify.NewWatcher()
	if err != nil {
		fmt.Fprintf(os.Stderr, "watching %s: %v\n", dir, err)
		return
	}
	defer w.Close()
	if err := w.Add(dir); err != nil {
		fmt.Fprintf(os.Stderr, "watching %s: %v\n", dir, err)
		return
	}
	for ev := range w.Events {
		if filepath.Base(ev.Name) == unhealthyFile {
			close(unhealthy)
			return
		}
	}
}

// runKubeletSockPlugin runs a device plugin that registers by calling
// Register on kubelet.sock in dir, and again whenever kubelet.sock is made
// anew (unless brk is "no-reregister"), until SIGTERM.
func runKubeletSockPlugin(dir, brk string, term <-chan os.Signal) error {
	m := &mutant{kind: "device", brk: brk, epDir: dir}
	m.refused, m.impatient = make(chan struct{}, 1), make(chan struct{})
	sock := filepath.Join(dir, "dpsock.sock")
	os.Remove(sock)
	l, err := net.Listen("unix", sock)
	if err != nil {
		return err
	}
	s := grpc.NewServer()
	deviceapi.RegisterDevicePluginServer(s, devicePlugin{m: m})
	if brk != "serve-after-register" {
		go s.Serve(l)
	}
	defer func() { s.Stop(); os.Remove(sock) }()
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return err
	}
	defer w.Close()
	if err := w.Add(dir); err != nil {
		return err
	}
	version := deviceapi.Version
	if brk == "bad-versions" {
		version = "v1alpha"
	}
	register := func() error {
		conn, err := grpc.NewClient("unix://"+filepath.Join(dir, "kubelet.sock"), grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			return err
		}
		defer conn.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, err = deviceapi.NewRegistrationClient(conn).Register(ctx, &deviceapi.RegisterRequest{Version: version, Endpoint: "dpsock.sock", ResourceName: "example.com/gpu"}, grpc.WaitForReady(true))
		return err
	}
	if err := register(); err != nil {
		fmt.Fprintf(os.Stderr, "Register: %v\n", err)
	}
	if brk == "serve-after-register" {
		go s.Serve(l)
	}
	for {
		select {
		case <-term:
			return nil
		case ev := <-w.Events:
			if filepath.Base(ev.Name) == "kubelet.sock" && ev.Has(fsnotify.Create) && brk != "no-reregister" {
				if err := register(); err != nil {
					fmt.Fprintf(os.Stderr, "Register again: %v\n", err)
				}
			}
		case err := <-w.Errors:
			return err
		}
	}
}

// runKubeletPlugin runs a DRA driver built on kubeletplugin, with health
// reporting, until SIGTERM.
func runKubeletPlugin(regDir, epDir string, term <-chan os.Signal) error {
	ctx := klog.NewContext(context.Background(), logr.Discard())
	helper, err := kubeletplugin.Start(ctx, healthyDriver{},
		kubeletplugin.DriverName("dra.conformance.example.com"),
		kubeletplugin.KubeClient(fake.NewClientset()),
		kubeletplugin.NodeName("node-1"),
		kubeletplugin.RegistrarDirectoryPath(regDir),
		kubeletplugin.PluginDataDirectoryPath(epDir))
	if err != nil {
		return err
	}
	<-term
	helper.Stop()
	return nil
}

// healthyDriver is a DRA driver that prepares every claim and reports one
// healthy device.
type healthyDriver struct{}

func (healthyDriver) PrepareResourceClaims(_ context.Context, claims []*resourceapi.ResourceClaim) (map[types.UID]kubeletplugin.PrepareResult, error) {
	result := make(map[types.UID]kubeletplugin.PrepareResult, len(claims))
	for _, c := range claims {
		result[c.UID] = kubeletplugin.PrepareResult{}
	}
	return result, nil
}

func (healthyDriver) UnprepareResourceClaims(_ context.Context, claims []kubeletplugin.NamespacedObject) (map[types.UID]error, error) {
	result := make(map[types.UID]error, len(claims))
	for _, c := range claims {
		result[c.UID] = nil
	}
	return result, nil
}

func (healthyDriver) HandleError(context.Context, error, string) {}

func (healthyDriver) WatchHealthStatus(ctx context.Context, reports chan<- kubeletplugin.DeviceHealthReport) error {
	report := kubeletplugin.DeviceHealthReport{Devices: []kubeletplugin.DeviceHealth{{
		PoolName: "pool", DeviceName: "dev-0", Health: kubeletplugin.HealthStatusHealthy}}}
	select {
	case reports <- report:
	case <-ctx.Done():
		return nil
	}
	<-ctx.Done()
	return nil
}

// mutant is a hand-written plugin of one kind, broken as brk says.
type mutant struct {
	kind, brk     string
	regDir, epDir string
	getInfos      atomic.Int32
	streams       atomic.Int32 // ListAndWatch streams opened
	notifies      atomic.Int32
	refused       chan struct{}
	csiName       string // the CSI driver's name, as its registrar read it
	// impatient is closed when the plugin gives up waiting to be told (the
	// "impatient" break: 1.5 s after a GetInfo not followed by a notification).
	impatient chan struct{}
	giveUp    sync.Once
	waiting   atomic.Pointer[time.Timer]
}

func (m *mutant) socket() string   { return filepath.Join(m.regDir, m.kind+".sock") }
func (m *mutant) endpoint() string { return filepath.Join(m.epDir, m.kind+"-plugin.sock") }

func (m *mutant) run(term <-chan os.Signal) error {
	m.refused = make(chan struct{}, 1)
	m.impatient = make(chan struct{})
	if m.brk == "no-socket" {
		<-term
		return nil
	}
	var ep *grpc.Server
	var err error
	if m.brk != "late-endpoint" {
		if ep, err = m.serveEndpoint(); err != nil {
			return err
		}
	}
	if m.kind == "csi" {
		if m.csiName, err = m.driverName(); err != nil {
			return err
		}
	}
	reg, err := m.serveRegistration()
	if err != nil {
		return err
	}
	if m.brk == "late-endpoint" {
		// The endpoint comes up after the registration socket, as a driver
		// whose registrar is a separate container often does.
		time.Sleep(300 * time.Millisecond)
		if ep, err = m.serveEndpoint(); err != nil {
			return err
		}
	}
	select {
	case <-term:
	case <-m.refused:
		return errors.New("registration refused: exiting, as node-driver-registrar does")
	case <-m.impatient:
		reg.Stop()
		ep.Stop()
		os.Remove(m.socket())
		return errors.New("not told within 1.5 s of GetInfo: giving up")
	}
	if m.brk == "leave-socket" {
		return nil
	}
	reg.Stop()
	ep.Stop()
	os.Remove(m.socket())
	return nil
}

func (m *mutant) serveRegistration() (*grpc.Server, error) {
	if m.brk != "no-stale-replace" {
		os.Remove(m.socket())
	}
	l, err := net.Listen("unix", m.socket())
	if err != nil {
		return nil, err
	}
	s := grpc.NewServer()
	registerapi.RegisterRegistrationServer(s, registration{m: m})
	go s.Serve(l)
	return s, nil
}

func (m *mutant) serveEndpoint() (*grpc.Server, error) {
	os.Remove(m.endpoint())
	l, err := net.Listen("unix", m.endpoint())
	if err != nil {
		return nil, err
	}
	s := grpc.NewServer()
	switch m.kind {
	case "csi":
		csi.RegisterIdentityServer(s, csiIdentity{m: m})
		csi.RegisterNodeServer(s, csiNode{m: m})
	case "dra":
		drav1.RegisterDRAPluginServer(s, draPlugin{m: m})
		if m.brk != "dra-health-unserved" {
			drahealthv1.RegisterDRAResourceHealthServer(s, draHealth{m: m})
		}
	case "device":
		deviceapi.RegisterDevicePluginServer(s, devicePlugin{m: m})
	}
	go s.Serve(l)
	return s, nil
}

// registration is the mutant's registration service; for the CSI kind it
// plays the registrar: the name is the driver's own, read from it.
type registration struct {
	registerapi.UnimplementedRegistrationServer
	m *mutant
}

func (r registration) GetInfo(_ context.Context, _ *registerapi.InfoRequest) (*registerapi.PluginInfo, error) {
	m := r.m
	n := m.getInfos.Add(1)
	if m.brk == "slow-getinfo" && n == 1 { // slow to answer while it starts
		time.Sleep(1500 * time.Millisecond)
	}
	if m.brk == "impatient" {
		t := time.AfterFunc(1500*time.Millisecond, func() { m.giveUp.Do(func() { close(m.impatient) }) })
		if old := m.waiting.Swap(t); old != nil {
			old.Stop()
		}
	}
	info := &registerapi.PluginInfo{Endpoint: m.endpoint()}
	switch m.kind {
	case "csi":
		info.Type, info.SupportedVersions = typeCSI, []string{"1.0.0"}
		info.Name = m.csiName
	case "dra":
		info.Type, info.Name = typeDRA, "dra.conformance.example.com"
		info.SupportedVersions = []string{"v1.DRAPlugin", "v1.DRAResourceHealth"}
		if m.brk == "dra-v1beta1-unserved" {
			info.SupportedVersions = append(info.SupportedVersions, "v1beta1.DRAPlugin")
		}
	case "device":
		info.Type, info.Name, info.SupportedVersions = typeDevice, "example.com/gpu", []string{"v1beta1"}
	}
	switch m.brk {
	case "bad-type":
		info.Type = "CSIDriver"
	case "bad-name":
		info.Name = "gpu"
	case "bad-versions":
		info.SupportedVersions = []string{"1"}
	case "bad-endpoint":
		info.Endpoint = "plugin.sock"
	case "answers-change":
		if n > 1 {
			info.SupportedVersions = append(info.SupportedVersions, "v1alpha1")
		}
	}
	return info, nil
}

// driverName asks the CSI driver its name, as node-driver-registrar does
// before it makes its registration socket.
func (m *mutant) driverName() (string, error) {
	conn, err := grpc.NewClient("unix://"+m.endpoint(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return "", err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	info, err := csi.NewIdentityClient(conn).GetPluginInfo(ctx, &csi.GetPluginInfoRequest{}, grpc.WaitForReady(true))
	if err != nil {
		return "", fmt.Errorf("asking the CSI driver its name: %w", err)
	}
	if m.brk == "csi-wrong-name" {
		return "csi.conformance.example.com", nil // what the registrar was told, not what the driver says
	}
	return info.GetName(), nil
}

func (r registration) NotifyRegistrationStatus(_ context.Context, st *registerapi.RegistrationStatus) (*registerapi.RegistrationStatusResponse, error) {
	m := r.m
	if t := m.waiting.Swap(nil); t != nil {
		t.Stop()
	}
	if m.notifies.Add(1) == 1 && m.brk == "notify-error-first" {
		return nil, status.Error(codes.Unavailable, "not ready to be told yet")
	}
	exitsWhenRefused := (m.kind == "csi") != (m.brk == "refused-wrong")
	if !st.GetPluginRegistered() && exitsWhenRefused {
		select {
		case m.refused <- struct{}{}:
		default:
		}
	}
	return &registerapi.RegistrationStatusResponse{}, nil
}

type csiIdentity struct {
	csi.UnimplementedIdentityServer
	m *mutant
}

func (c csiIdentity) GetPluginInfo(context.Context, *csi.GetPluginInfoRequest) (*csi.GetPluginInfoResponse, error) {
	name := "csi.conformance.example.com"
	if c.m.brk == "csi-wrong-name" {
		name = "other.conformance.example.com"
	}
	return &csi.GetPluginInfoResponse{Name: name, VendorVersion: "0.1.0"}, nil
}

func (c csiIdentity) Probe(context.Context, *csi.ProbeRequest) (*csi.ProbeResponse, error) {
	if c.m.brk == "csi-probe-fails" {
		return nil, status.Error(codes.FailedPrecondition, "the backend is not reachable")
	}
	return &csi.ProbeResponse{Ready: wrapperspb.Bool(true)}, nil
}

type csiNode struct {
	csi.UnimplementedNodeServer
	m *mutant
}

func (c csiNode) NodeGetInfo(context.Context, *csi.NodeGetInfoRequest) (*csi.NodeGetInfoResponse, error) {
	id := "node-1"
	if c.m.brk == "csi-no-node-id" {
		id = ""
	}
	return &csi.NodeGetInfoResponse{NodeId: id, MaxVolumesPerNode: 16,
		AccessibleTopology: &csi.Topology{Segments: map[string]string{"topology.conformance.example.com/zone": "a"}}}, nil
}

type draPlugin struct {
	drav1.UnimplementedDRAPluginServer
	m *mutant
}

func (d draPlugin) NodePrepareResources(context.Context, *drav1.NodePrepareResourcesRequest) (*drav1.NodePrepareResourcesResponse, error) {
	if d.m.brk == "dra-prepare-fails" {
		return nil, status.Error(codes.Internal, "no claims: nothing to do, and it fails")
	}
	return &drav1.NodePrepareResourcesResponse{}, nil
}

func (d draPlugin) NodeUnprepareResources(context.Context, *drav1.NodeUnprepareResourcesRequest) (*drav1.NodeUnprepareResourcesResponse, error) {
	return &drav1.NodeUnprepareResourcesResponse{}, nil
}

type draHealth struct {
	drahealthv1.UnimplementedDRAResourceHealthServer
	m *mutant
}

func (h draHealth) NodeWatchResources(_ *drahealthv1.NodeWatchResourcesRequest, s grpc.ServerStreamingServer[drahealthv1.NodeWatchResourcesResponse]) error {
	if h.m.brk == "health-ends" {
		return nil // served, and ended at once: the kubelet opens it again
	}
	if err := s.Send(&drahealthv1.NodeWatchResourcesResponse{}); err != nil {
		return err
	}
	<-s.Context().Done()
	return nil
}

type devicePlugin struct {
	deviceapi.UnimplementedDevicePluginServer
	m *mutant
}

func (d devicePlugin) GetDevicePluginOptions(context.Context, *deviceapi.Empty) (*deviceapi.DevicePluginOptions, error) {
	if d.m.brk == "dp-options-fail" {
		return nil, status.Error(codes.Internal, "options are not ready")
	}
	return &deviceapi.DevicePluginOptions{}, nil
}

func (d devicePlugin) ListAndWatch(_ *deviceapi.Empty, s grpc.ServerStreamingServer[deviceapi.ListAndWatchResponse]) error {
	silent := d.m.brk == "dp-silent-list" || (d.m.brk == "dp-one-stream" && d.m.streams.Add(1) > 1)
	if silent {
		<-s.Context().Done()
		return nil
	}
	if err := s.Send(inventory()); err != nil {
		return err
	}
	if d.m.brk == "dp-stream-ends" {
		return nil
	}
	select {
	case <-unhealthy:
		if err := s.Send(inventory()); err != nil {
			return err
		}
	case <-s.Context().Done():
		return nil
	}
	<-s.Context().Done()
	return nil
}

// inventory is the test device plugin's devices, gpu-1 Unhealthy once
// unhealthy is closed.
func inventory() *deviceapi.ListAndWatchResponse {
	gpu1 := deviceapi.Healthy
	select {
	case <-unhealthy:
		gpu1 = deviceapi.Unhealthy
	default:
	}
	return &deviceapi.ListAndWatchResponse{Devices: []*deviceapi.Device{{ID: "gpu-0", Health: deviceapi.Healthy}, {ID: "gpu-1", Health: gpu1}}}
}
