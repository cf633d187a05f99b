//go:build linux

package kube

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	authv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/scheme"
	dpapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	"sigs.k8s.io/yaml"

	"github.com/plugd/plugd/api"
	"github.com/plugd/plugd/internal/testenv"
	"github.com/plugd/plugd/plugin"
)

// wait bounds every wait of these tests: a failure bound, never a pace.
// plugd's reads recover with client-go's backoff, which reaches 30s.
const wait = 90 * time.Second

// eventually polls check until it says done, failing the test with its
// last word after wait. The poll is the pace of looking at a state that
// has no event of its own (the API's objects, plugd's kubelet view).
func eventually(t *testing.T, what string, check func() (bool, string)) {
	t.Helper()
	eventuallyWithin(t, wait, what, check)
}

// eventuallyWithin is eventually with another bound, for a wait whose
// bound is someone else's pace (say the kubelet's longest backoff).
func eventuallyWithin(t *testing.T, bound time.Duration, what string, check func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(bound)
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		ok, last := check()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s; last: %s", what, bound, last)
		}
		<-tick.C
	}
}

// applyManifest creates every object of a deploy/ manifest as the admin,
// decoded with client-go's own scheme as kubectl would.
func applyManifest(t *testing.T, rel string) []runtime.Object {
	t.Helper()
	if rel == "deploy/kubernetes/daemonset.yaml" {
		// Its namespace is a file of its own (the chart's namespace.create).
		applyManifest(t, "deploy/kubernetes/namespace.yaml")
	}
	ctx := context.Background()
	var objs []runtime.Object
	for _, obj := range manifestObjects(t, rel) {
		var err error
		switch o := obj.(type) {
		case *corev1.Namespace:
			_, err = admin.CoreV1().Namespaces().Create(ctx, o, metav1.CreateOptions{})
		case *corev1.ServiceAccount:
			_, err = admin.CoreV1().ServiceAccounts(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
		case *corev1.ConfigMap:
			_, err = admin.CoreV1().ConfigMaps(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
		case *rbacv1.ClusterRole:
			_, err = admin.RbacV1().ClusterRoles().Create(ctx, o, metav1.CreateOptions{})
		case *rbacv1.ClusterRoleBinding:
			_, err = admin.RbacV1().ClusterRoleBindings().Create(ctx, o, metav1.CreateOptions{})
		case *rbacv1.Role:
			_, err = admin.RbacV1().Roles(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
		case *rbacv1.RoleBinding:
			_, err = admin.RbacV1().RoleBindings(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
		default:
			continue // the DaemonSet: no kubelet here runs pods
		}
		if err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatalf("%s: creating %T: %v", rel, obj, err)
		}
		objs = append(objs, obj)
	}
	return objs
}

// manifestObjects decodes every object of a deploy/ manifest with
// client-go's own scheme, as kubectl would; kinds it does not know (the
// Prometheus Operator's) are left out.
func manifestObjects(t *testing.T, rel string) []runtime.Object {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dirs.Repo, rel))
	if err != nil {
		t.Fatal(err)
	}
	var objs []runtime.Object
	for _, doc := range bytes.Split(b, []byte("\n---\n")) {
		j, err := yaml.YAMLToJSON(doc)
		if err != nil {
			t.Fatalf("%s: %v", rel, err)
		}
		if string(j) == "null" {
			continue
		}
		obj, _, err := scheme.Codecs.UniversalDeserializer().Decode(j, nil, nil)
		if runtime.IsNotRegisteredError(err) {
			continue
		}
		if err != nil {
			t.Fatalf("%s: %v", rel, err)
		}
		objs = append(objs, obj)
	}
	return objs
}

// plugdToken is a token of plugd's ServiceAccount, as the pod would mount.
func plugdToken(t *testing.T) string {
	t.Helper()
	exp := int64(3600)
	tr, err := admin.CoreV1().ServiceAccounts("plugd").CreateToken(context.Background(), "plugd",
		&authv1.TokenRequest{Spec: authv1.TokenRequestSpec{ExpirationSeconds: &exp}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return tr.Status.Token
}

// createNode creates a Node as the kubelet would register it, with its
// hostname label, taints and a condition of someone else's, and its (empty)
// CSINode. The label matters: the API server records managedFields of an
// object only if its creator set a field of it, and plugd tells its
// conditions by them.
func createNode(t *testing.T, name string, taints ...corev1.Taint) {
	t.Helper()
	ctx := context.Background()
	n, err := admin.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"kubernetes.io/hostname": name}},
		Spec: corev1.NodeSpec{Taints: taints}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	now := metav1.Now()
	n.Status.Conditions = []corev1.NodeCondition{
		{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady", Message: "kubelet is posting ready status", LastHeartbeatTime: now, LastTransitionTime: now},
		{Type: "example.com/KernelDeadlock", Status: corev1.ConditionFalse, Reason: "KernelHasNoDeadlock", Message: "node-problem-detector's", LastHeartbeatTime: now, LastTransitionTime: now},
	}
	if _, err := admin.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.StorageV1().CSINodes().Create(ctx, &storagev1.CSINode{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// apiKubelet plays the kubelet's API side for one node, where no kubelet runs.
type apiKubelet struct {
	t    *testing.T
	node string
}

// setCSIDriver adds (nodeID != "") or removes a driver in the CSINode, as
// the kubelet's CSI handler does on registration and deregistration. A
// driver's entry is immutable: a new node id replaces it in two steps, as
// the kubelet's re-registration does.
func (k apiKubelet) setCSIDriver(name, nodeID string) {
	k.t.Helper()
	ctx := context.Background()
	c, err := admin.StorageV1().CSINodes().Get(ctx, k.node, metav1.GetOptions{})
	if err != nil {
		k.t.Fatal(err)
	}
	var drivers []storagev1.CSINodeDriver
	had := false
	for _, d := range c.Spec.Drivers {
		if d.Name != name {
			drivers = append(drivers, d)
		} else {
			had = true
		}
	}
	if had {
		c.Spec.Drivers = drivers
		if c, err = admin.StorageV1().CSINodes().Update(ctx, c, metav1.UpdateOptions{}); err != nil {
			k.t.Fatal(err)
		}
	}
	if nodeID != "" {
		c.Spec.Drivers = append(drivers, storagev1.CSINodeDriver{Name: name, NodeID: nodeID})
		if _, err := admin.StorageV1().CSINodes().Update(ctx, c, metav1.UpdateOptions{}); err != nil {
			k.t.Fatal(err)
		}
	}
}

// setDevices sets a device plugin's capacity and allocatable in the Node's
// status, as the device manager's node status update does.
func (k apiKubelet) setDevices(resource string, capacity, allocatable int) {
	k.t.Helper()
	patch := fmt.Sprintf(`{"status":{"capacity":{%q:"%d"},"allocatable":{%q:"%d"}}}`, resource, capacity, resource, allocatable)
	if _, err := admin.CoreV1().Nodes().Patch(context.Background(), k.node, "application/strategic-merge-patch+json", []byte(patch), metav1.PatchOptions{}, "status"); err != nil {
		k.t.Fatal(err)
	}
}

func getNode(t *testing.T, name string) *corev1.Node {
	t.Helper()
	n, err := admin.CoreV1().Nodes().Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func condition(n *corev1.Node, typ string) *corev1.NodeCondition {
	for i := range n.Status.Conditions {
		if string(n.Status.Conditions[i].Type) == typ {
			return &n.Status.Conditions[i]
		}
	}
	return nil
}

// waitCondition waits until node's condition typ has status and reason.
func waitCondition(t *testing.T, node, typ string, status corev1.ConditionStatus, reason string) *corev1.NodeCondition {
	t.Helper()
	var got *corev1.NodeCondition
	eventually(t, fmt.Sprintf("%s's %s to be %s (%s)", node, typ, status, reason), func() (bool, string) {
		got = condition(getNode(t, node), typ)
		if got == nil {
			return false, "no such condition"
		}
		return got.Status == status && got.Reason == reason, fmt.Sprintf("%s %s: %s", got.Status, got.Reason, got.Message)
	})
	return got
}

// nodeEvents are the events.k8s.io events about node.
func nodeEvents(t *testing.T, node string) []eventsv1.Event {
	t.Helper()
	l, err := admin.EventsV1().Events("default").List(context.Background(), metav1.ListOptions{FieldSelector: "regarding.name=" + node})
	if err != nil {
		t.Fatal(err)
	}
	return l.Items
}

// waitEvent waits for an event about node with reason whose action names
// the plugin (and maybe the cause, after a colon), and returns it.
func waitEvent(t *testing.T, node, reason, plugin string) eventsv1.Event {
	t.Helper()
	var ev eventsv1.Event
	eventually(t, fmt.Sprintf("a %s event about %s for %s", reason, node, plugin), func() (bool, string) {
		var seen []string
		for _, e := range nodeEvents(t, node) {
			seen = append(seen, e.Reason+"/"+e.Action)
			if e.Reason == reason && (e.Action == "Check "+plugin || strings.HasPrefix(e.Action, "Check "+plugin+": ")) {
				ev = e
				return true, ""
			}
		}
		return false, strings.Join(seen, ", ")
	})
	return ev
}

// plugd is plugd running as a process.
type plugd struct {
	cmd    *exec.Cmd
	out    *testenv.Buffer
	done   chan struct{}
	socket string
	client *api.Client
	// started is when it was started, for counting its requests in the
	// audit log.
	started time.Time
}

// startPlugd runs plugd with config (YAML) and waits until it is ready.
func startPlugd(t *testing.T, dir, config string) *plugd {
	t.Helper()
	path := filepath.Join(dir, "plugd.yaml")
	if err := os.WriteFile(path, []byte(config), 0o600); err != nil {
		t.Fatal(err)
	}
	p := &plugd{out: &testenv.Buffer{}, done: make(chan struct{}), socket: filepath.Join(dir, "run", "plugd.sock")}
	p.cmd = exec.Command(filepath.Join(dirs.Bin, "plugd"), "--config", path, "--status-socket", p.socket)
	p.cmd.Stdout, p.cmd.Stderr = p.out, p.out
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL} // never outlive the test
	p.started = time.Now()
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		p.cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		p.stop(t)
		if t.Failed() {
			t.Logf("plugd's log:\n%s", p.out)
		}
	})
	p.client = &api.Client{Socket: p.socket}
	eventually(t, "plugd ready", func() (bool, string) {
		select {
		case <-p.done:
			t.Fatalf("plugd exited: %s", p.out)
		default:
		}
		err := p.client.Ready(context.Background())
		return err == nil, fmt.Sprint(err)
	})
	return p
}

func (p *plugd) stop(t *testing.T) {
	select {
	case <-p.done:
		return
	default:
	}
	p.cmd.Process.Signal(os.Interrupt)
	select {
	case <-p.done:
	case <-time.After(wait):
		p.cmd.Process.Kill()
		<-p.done
		t.Errorf("plugd did not stop on SIGINT")
	}
}

// plugin is the plugd status of the one plugin named name.
func (p *plugd) plugin(t *testing.T, name string) api.Plugin {
	t.Helper()
	ps, err := p.client.Plugins(context.Background(), api.Filter{Name: name})
	if err != nil {
		t.Fatal(err)
	}
	if len(ps) != 1 {
		return api.Plugin{}
	}
	return ps[0]
}

// waitKubelet waits until the plugin's kubelet view has state and reason.
func (p *plugd) waitKubelet(t *testing.T, name, state, reason string) api.KubeletView {
	t.Helper()
	var v api.KubeletView
	eventually(t, fmt.Sprintf("%s's kubelet view to be %s (%s)", name, state, reason), func() (bool, string) {
		pl := p.plugin(t, name)
		if pl.Kubelet == nil {
			return false, fmt.Sprintf("no kubelet view; plugin %+v", pl)
		}
		v = *pl.Kubelet
		return v.State == state && v.Reason == reason, fmt.Sprintf("%+v", v)
	})
	return v
}

// plugctl runs plugctl and returns its output and exit code.
func plugctl(t *testing.T, args ...string) (string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	out, err := exec.CommandContext(ctx, filepath.Join(dirs.Bin, "plugctl"), args...).CombinedOutput()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return string(out), ee.ExitCode()
	}
	if err != nil {
		t.Fatal(err)
	}
	return string(out), 0
}

// metric is the value of the first sample of name whose labels contain
// every one of labels, in Prometheus text.
func metric(text, name string, labels ...string) (string, bool) {
	sc := bufio.NewScanner(strings.NewReader(text))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, name+"{") && !strings.HasPrefix(line, name+" ") {
			continue
		}
		ok := true
		for _, l := range labels {
			ok = ok && strings.Contains(line, l)
		}
		if ok {
			return line[strings.LastIndex(line, " ")+1:], true
		}
	}
	return "", false
}

// --- Plugins ---

// csiDriver is a CSI node plugin's own service: identity and NodeGetInfo.
type csiDriver struct {
	csi.UnimplementedIdentityServer
	csi.UnimplementedNodeServer
	name, nodeID string
}

func (d *csiDriver) GetPluginInfo(context.Context, *csi.GetPluginInfoRequest) (*csi.GetPluginInfoResponse, error) {
	return &csi.GetPluginInfoResponse{Name: d.name, VendorVersion: "1.0.0"}, nil
}

func (d *csiDriver) GetPluginCapabilities(context.Context, *csi.GetPluginCapabilitiesRequest) (*csi.GetPluginCapabilitiesResponse, error) {
	return &csi.GetPluginCapabilitiesResponse{}, nil
}

func (d *csiDriver) Probe(context.Context, *csi.ProbeRequest) (*csi.ProbeResponse, error) {
	return &csi.ProbeResponse{}, nil
}

func (d *csiDriver) NodeGetCapabilities(context.Context, *csi.NodeGetCapabilitiesRequest) (*csi.NodeGetCapabilitiesResponse, error) {
	return &csi.NodeGetCapabilitiesResponse{}, nil
}

func (d *csiDriver) NodeGetInfo(context.Context, *csi.NodeGetInfoRequest) (*csi.NodeGetInfoResponse, error) {
	return &csi.NodeGetInfoResponse{NodeId: d.nodeID, MaxVolumesPerNode: 16}, nil
}

// serveGRPC serves s on a unix socket at path until the test ends.
func serveGRPC(t *testing.T, path string, register func(*grpc.Server)) {
	t.Helper()
	l, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	s := grpc.NewServer()
	register(s)
	go s.Serve(l)
	t.Cleanup(s.Stop)
}

// startCSI starts a CSI driver on dir/NAME.sock and, as node-driver-registrar
// does, a registration socket in reg that points at it.
func startCSI(t *testing.T, reg, dir, name, nodeID string) *plugin.Server {
	t.Helper()
	endpoint := filepath.Join(dir, name+".sock")
	if _, err := os.Stat(endpoint); err != nil {
		d := &csiDriver{name: name, nodeID: nodeID}
		serveGRPC(t, endpoint, func(s *grpc.Server) {
			csi.RegisterIdentityServer(s, d)
			csi.RegisterNodeServer(s, d)
		})
	}
	return testenv.StartPlugin(t, plugin.Config{Dir: reg, Socket: name + "-reg.sock", Type: "CSIPlugin", Name: name, Versions: []string{"1.0.0"}, Endpoint: endpoint})
}

// devicePlugin serves the v1beta1 device plugin API with a fixed list of
// healthy devices.
type devicePlugin struct {
	dpapi.UnimplementedDevicePluginServer
	devices int
}

func (d *devicePlugin) GetDevicePluginOptions(context.Context, *dpapi.Empty) (*dpapi.DevicePluginOptions, error) {
	return &dpapi.DevicePluginOptions{}, nil
}

func (d *devicePlugin) ListAndWatch(_ *dpapi.Empty, s grpc.ServerStreamingServer[dpapi.ListAndWatchResponse]) error {
	var devs []*dpapi.Device
	for i := range d.devices {
		devs = append(devs, &dpapi.Device{ID: fmt.Sprintf("gpu-%d", i), Health: dpapi.Healthy})
	}
	if err := s.Send(&dpapi.ListAndWatchResponse{Devices: devs}); err != nil {
		return err
	}
	<-s.Context().Done()
	return nil
}

// startDevicePlugin registers a device plugin of resource with devices
// healthy devices, serving its API on its registration socket.
func startDevicePlugin(t *testing.T, reg, resource string, devices int) *plugin.Server {
	t.Helper()
	return testenv.StartPlugin(t, plugin.Config{Dir: reg, Socket: "gpu.sock", Type: "DevicePlugin", Name: resource, Versions: []string{"v1beta1"},
		Services: func(s grpc.ServiceRegistrar) { dpapi.RegisterDevicePluginServer(s, &devicePlugin{devices: devices}) }})
}

// decode reads the JSON text starts with (plugctl's stderr may follow) into
// v, failing the test with the text.
func decode(t *testing.T, text string, v any) {
	t.Helper()
	if err := json.NewDecoder(strings.NewReader(text)).Decode(v); err != nil {
		t.Fatalf("%v:\n%s", err, text)
	}
}

func regexpMatch(re, s string) bool { return regexp.MustCompile(re).MatchString(s) }

// getUnix GETs path from the HTTP server on a unix socket.
func getUnix(ctx context.Context, socket, path string) (string, error) {
	hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", socket)
	}}}
	defer hc.CloseIdleConnections()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://plugd"+path, nil)
	if err != nil {
		return "", err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}

// auditCount counts the requests user made that the API server received
// between from and to, by verb, from its audit log.
func auditCount(user string, from, to time.Time) (map[string]int, error) {
	return auditCountOf(user, "", from, to)
}

// auditCountOf is auditCount of the requests about resource alone (all
// of them if empty).
func auditCountOf(user, resource string, from, to time.Time) (map[string]int, error) {
	f, err := os.Open(cp.AuditLog)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	seen := map[string]bool{}
	out := map[string]int{}
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var ev struct {
			AuditID  string                    `json:"auditID"`
			Verb     string                    `json:"verb"`
			User     struct{ Username string } `json:"user"`
			Received time.Time                 `json:"requestReceivedTimestamp"`
			Object   struct{ Resource string } `json:"objectRef"`
			URI      string                    `json:"requestURI"`
		}
		// A dry run (the doctor's probe of the admission policies) changes
		// nothing, and is not counted.
		if json.Unmarshal(sc.Bytes(), &ev) != nil || ev.User.Username != user || seen[ev.AuditID] || ev.Received.Before(from) || ev.Received.After(to) ||
			resource != "" && ev.Object.Resource != resource || strings.Contains(ev.URI, "dryRun=") {
			continue
		}
		seen[ev.AuditID] = true
		out[ev.Verb]++
	}
	return out, sc.Err()
}
