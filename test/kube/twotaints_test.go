//go:build linux

package kube

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/plugd/plugd/internal/testenv"
	"github.com/plugd/plugd/plugin"
	"github.com/plugd/plugd/test/kube/kubelet"
)

// Issue 32's first acceptance scenario, beside the real kubelet: two CSI
// drivers and a device plugin, each with a startup taint of its own,
// registered 5 s apart. Each taint goes within 100 ms of its own
// condition's True, never before the kubelet holds that plugin, never
// before CSINode carries the attach limit of the driver that reports one;
// the others stay until their own plugin is ready. The Node's and the
// CSINode's writes are ordered by their resourceVersions (one etcd
// revision for both), the gaps timed by the watches that bring them.
const (
	csiA, csiB        = "a.csi.example.com", "b.csi.example.com"
	taintA, taintB    = "example.com/a-not-ready", "example.com/b-not-ready"
	taintGPU          = "example.com/gpu-not-ready"
	condA, condB      = csiA + "/CSIPluginReady", csiB + "/CSIPluginReady"
	removalBound      = 100 * time.Millisecond
	maxVolumesOfA     = 16 // what a's NodeGetInfo reports (testplugin's); b reports none
	twoTaintsNodeName = "k-two-taints"
)

// nodeWrite is a write of the Node as its watch brought it.
type nodeWrite struct {
	at     time.Time
	rv     int64
	taints []string // the keys present
	ready  []string // plugd's conditions that say True
}

// csiNodeWrite is a write of the CSINode: each driver it lists, with its
// allocatable count (-1: none).
type csiNodeWrite struct {
	at      time.Time
	rv      int64
	drivers map[string]int32
}

// removalProbe is what the kubelet said of a plugin when the watch brought
// the removal of its taint: whether its plugin manager held the plugin's
// registration socket, and (a device plugin) its allocatable devices.
type removalProbe struct {
	held    bool
	devices int
	err     error
}

// writeLog records the Node's and the CSINode's writes, and probes the
// kubelet whenever a taint goes.
type writeLog struct {
	mu       sync.Mutex
	nodes    []nodeWrite
	csinodes []csiNodeWrite
	probes   map[string]removalProbe
}

// watchWrites records node's writes and its CSINode's until the test ends.
// probe is asked, on a goroutine of its own, about each taint seen to go.
func watchWrites(t *testing.T, node string, probe func(taint string) removalProbe) *writeLog {
	wl := &writeLog{probes: map[string]removalProbe{}}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() })
	sel := metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("metadata.name", node).String()}
	wg.Add(2)
	go func() {
		defer wg.Done()
		watchLoop(ctx, func() (watch.Interface, error) { return admin.CoreV1().Nodes().Watch(ctx, sel) }, func(at time.Time, o any) {
			n, ok := o.(*corev1.Node)
			if !ok {
				return
			}
			w := nodeWrite{at: at, rv: resourceVersion(n.ResourceVersion)}
			for _, tt := range n.Spec.Taints {
				w.taints = append(w.taints, tt.Key)
			}
			for _, c := range n.Status.Conditions {
				if c.Status == corev1.ConditionTrue {
					w.ready = append(w.ready, string(c.Type))
				}
			}
			wl.mu.Lock()
			defer wl.mu.Unlock()
			if len(wl.nodes) > 0 {
				for _, k := range wl.nodes[len(wl.nodes)-1].taints {
					if !slices.Contains(w.taints, k) {
						wg.Add(1)
						go func() {
							defer wg.Done()
							p := probe(k)
							wl.mu.Lock()
							wl.probes[k] = p
							wl.mu.Unlock()
						}()
					}
				}
			}
			wl.nodes = append(wl.nodes, w)
		})
	}()
	go func() {
		defer wg.Done()
		watchLoop(ctx, func() (watch.Interface, error) { return admin.StorageV1().CSINodes().Watch(ctx, sel) }, func(at time.Time, o any) {
			c, ok := o.(*storagev1.CSINode)
			if !ok {
				return
			}
			w := csiNodeWrite{at: at, rv: resourceVersion(c.ResourceVersion), drivers: map[string]int32{}}
			for _, d := range c.Spec.Drivers {
				w.drivers[d.Name] = -1
				if d.Allocatable != nil && d.Allocatable.Count != nil {
					w.drivers[d.Name] = *d.Allocatable.Count
				}
			}
			wl.mu.Lock()
			wl.csinodes = append(wl.csinodes, w)
			wl.mu.Unlock()
		})
	}()
	return wl
}

// watchLoop hands each added or modified object to record with the time
// it came, watching again whenever the watch ends, until ctx is done.
func watchLoop(ctx context.Context, open func() (watch.Interface, error), record func(time.Time, any)) {
	for ctx.Err() == nil {
		w, err := open()
		if err != nil {
			select {
			case <-ctx.Done():
			case <-time.After(100 * time.Millisecond): // the API server restarting: watch again
			}
			continue
		}
		for ev := range w.ResultChan() {
			if ev.Type == watch.Added || ev.Type == watch.Modified {
				record(time.Now(), ev.Object)
			}
		}
		w.Stop()
	}
}

func resourceVersion(s string) int64 {
	n, _ := strconv.ParseInt(s, 10, 64)
	return n
}

// firstReady is the first write of the Node in which cond says True, after
// the write at index from.
func (wl *writeLog) firstReady(cond string, from int) (nodeWrite, int, bool) {
	wl.mu.Lock()
	defer wl.mu.Unlock()
	for i := from; i < len(wl.nodes); i++ {
		if slices.Contains(wl.nodes[i].ready, cond) {
			return wl.nodes[i], i, true
		}
	}
	return nodeWrite{}, 0, false
}

// removal is the first write of the Node, after the write at index from,
// without the taint key that a write before it had.
func (wl *writeLog) removal(key string, from int) (nodeWrite, int, bool) {
	wl.mu.Lock()
	defer wl.mu.Unlock()
	for i := max(from, 1); i < len(wl.nodes); i++ {
		if slices.Contains(wl.nodes[i-1].taints, key) && !slices.Contains(wl.nodes[i].taints, key) {
			return wl.nodes[i], i, true
		}
	}
	return nodeWrite{}, 0, false
}

// listed is the first write of the CSINode, after the write at index from,
// that lists driver, with its allocatable count if count.
func (wl *writeLog) listed(driver string, count bool, from int) (csiNodeWrite, int, bool) {
	wl.mu.Lock()
	defer wl.mu.Unlock()
	for i := from; i < len(wl.csinodes); i++ {
		if n, ok := wl.csinodes[i].drivers[driver]; ok && (!count || n >= 0) {
			return wl.csinodes[i], i, true
		}
	}
	return csiNodeWrite{}, 0, false
}

func (wl *writeLog) probe(key string) (removalProbe, bool) {
	wl.mu.Lock()
	defer wl.mu.Unlock()
	p, ok := wl.probes[key]
	return p, ok
}

// String is the Node's and the CSINode's writes in the order of their
// resourceVersions, for a failure's log.
func (wl *writeLog) String() string {
	wl.mu.Lock()
	defer wl.mu.Unlock()
	type line struct {
		rv   int64
		text string
	}
	var lines []line
	for _, w := range wl.nodes {
		lines = append(lines, line{w.rv, fmt.Sprintf("%s Node rv %d: taints %q, True %q", w.at.Format("15:04:05.000"), w.rv, w.taints, w.ready)})
	}
	for _, w := range wl.csinodes {
		lines = append(lines, line{w.rv, fmt.Sprintf("%s CSINode rv %d: drivers %v", w.at.Format("15:04:05.000"), w.rv, w.drivers)})
	}
	slices.SortFunc(lines, func(a, b line) int { return int(a.rv - b.rv) })
	var b strings.Builder
	for _, l := range lines {
		b.WriteString(l.text + "\n")
	}
	return b.String()
}

// startNamedCSI starts a CSI driver called name and its registrar, as
// processes (testplugin: NodeGetInfo reports 16 volumes at most); it
// returns the registrar and the registration socket it serves.
func startNamedCSI(t *testing.T, dir, registry, node, name string) (registrar *proc, socket string) {
	t.Helper()
	endpoint := startCSIDriverNamed(t, dir, node, name)
	return startRegistrarNamed(t, endpoint, registry, name), filepath.Join(registry, name+"-reg.sock")
}

// unlimitedCSI is a CSI driver whose NodeGetInfo reports no maximum
// volume count: CSINode then carries no attach limit for it.
type unlimitedCSI struct{ csiDriver }

func (d *unlimitedCSI) NodeGetInfo(context.Context, *csi.NodeGetInfoRequest) (*csi.NodeGetInfoResponse, error) {
	return &csi.NodeGetInfoResponse{NodeId: d.nodeID}, nil
}

// startUnlimitedCSI serves an unlimitedCSI driver called name in this
// process, and its registration socket in registry, as
// node-driver-registrar would; it returns the registration socket.
func startUnlimitedCSI(t *testing.T, dir, registry, node, name string) string {
	t.Helper()
	endpoint := filepath.Join(dir, name+".sock")
	d := &unlimitedCSI{csiDriver{name: name, nodeID: node}}
	serveGRPC(t, endpoint, func(s *grpc.Server) {
		csi.RegisterIdentityServer(s, d)
		csi.RegisterNodeServer(s, d)
	})
	testenv.StartPlugin(t, plugin.Config{Dir: registry, Socket: name + "-reg.sock", Type: "CSIPlugin", Name: name, Versions: []string{"1.0.0"}, Endpoint: endpoint})
	return filepath.Join(registry, name+"-reg.sock")
}

// startCSIDriverNamed starts testplugin's CSI driver called name,
// answering node as its node ID, and returns its socket.
func startCSIDriverNamed(t *testing.T, dir, node, name string) (endpoint string) {
	t.Helper()
	endpoint = filepath.Join(dir, name+".sock")
	startProc(t, name+" driver", "csi", "--endpoint", endpoint, "--name", name, "--node-id", node)
	return endpoint
}

// startRegistrarNamed starts the registrar of the driver called name at
// endpoint, and waits until it serves its registration socket.
func startRegistrarNamed(t *testing.T, endpoint, registry, name string) *proc {
	t.Helper()
	registrar := startProc(t, name+" registrar", "registrar", "--csi-address", endpoint, "--plugin-registration-path", registry,
		"--kubelet-registration-path", endpoint)
	eventually(t, name+"'s registrar serving", func() (bool, string) {
		return strings.Contains(registrar.out.String(), "serving "), registrar.out.String()
	})
	return registrar
}

// kubeletProbe asks the kubelet k, for the plugin whose registration
// socket is socket (and, with resource, its allocatable devices).
func kubeletProbe(t *testing.T, k *kubelet.Kubelet, socket, resource string) removalProbe {
	body, code, err := k.Get(context.Background(), "/metrics", cp.AdminToken)
	if err != nil || code != 200 {
		return removalProbe{err: fmt.Errorf("GET /metrics: %d, %v", code, err)}
	}
	p := removalProbe{held: strings.Contains(body, fmt.Sprintf("plugin_manager_total_plugins{socket_path=%q,state=%q} 1", socket, "actual_state_of_world"))}
	if resource != "" {
		p.devices, p.err = allocatable(t, k.PodResources, resource)
	}
	return p
}

// twoTaintsConfig is plugd's configuration beside kubelet k: three
// expected plugins, each with its own taint.
func twoTaintsConfig(k *kubelet.Kubelet, kubeconfig, node string, retaint bool) string {
	return fmt.Sprintf(`mode: observe
registryDir: %s
handlers: [{type: CSIPlugin, handler: csi}, {type: DevicePlugin, handler: deviceplugin}]
kubernetes:
  kubeconfig: %s
  nodeName: %s
  kubelet: {address: %q, caFile: %s, podResourcesSocket: %s}
expect:
  - {type: CSIPlugin, name: %s, taint: "%s:NoSchedule", retaint: %t}
  - {type: CSIPlugin, name: %s, taint: "%s:NoSchedule"}
  - {type: DevicePlugin, name: %s, taint: "%s:NoSchedule"}
doctor: {procDir: none}
`, k.RegistryDir, kubeconfig, node, k.Addr, k.CertFile, k.PodResources, csiA, taintA, retaint, csiB, taintB, gpuName, taintGPU)
}

// twoTaintsNode starts a kubelet registering node with the three taints,
// and gives plugd's kubeconfig and a directory for the peers.
func twoTaintsNode(t *testing.T, node string) (k *kubelet.Kubelet, dir, kubeconfig string) {
	k = startKubelet(t, node, taintA+":NoSchedule", taintB+":NoSchedule", taintGPU+":NoSchedule")
	applyManifest(t, "deploy/kubernetes/daemonset.yaml")
	applyManifest(t, "deploy/kubernetes/remove-taint-rbac.yaml")
	dir = testenv.ShortDir(t, "k2")
	kubeconfig = filepath.Join(dir, "kubeconfig")
	if err := cp.WriteKubeconfig(kubeconfig, plugdToken(t)); err != nil {
		t.Fatal(err)
	}
	return k, dir, kubeconfig
}

func TestTwoPluginTaints(t *testing.T) {
	const node = twoTaintsNodeName
	k, dir, kubeconfig := twoTaintsNode(t, node)
	sockA, sockB := filepath.Join(k.RegistryDir, csiA+"-reg.sock"), filepath.Join(k.RegistryDir, csiB+"-reg.sock")
	sockGPU := filepath.Join(k.RegistryDir, "gpu.sock")
	wl := watchWrites(t, node, func(taint string) removalProbe {
		switch taint {
		case taintA:
			return kubeletProbe(t, k, sockA, "")
		case taintB:
			return kubeletProbe(t, k, sockB, "")
		default:
			return kubeletProbe(t, k, sockGPU, gpuName)
		}
	})
	startPlugd(t, dir, twoTaintsConfig(k, kubeconfig, node, false))

	// Registered 5 s apart: a (with an attach limit), b (without), then
	// the device plugin.
	startNamedCSI(t, dir, k.RegistryDir, node, csiA)
	waitCondition(t, node, condA, corev1.ConditionTrue, "PluginReady")
	time.Sleep(5 * time.Second) // the scenario's spacing, not a synchronisation
	startUnlimitedCSI(t, dir, k.RegistryDir, node, csiB)
	waitCondition(t, node, condB, corev1.ConditionTrue, "PluginReady")
	time.Sleep(5 * time.Second) // likewise
	startHealthPlugin(t, k.RegistryDir, gpuName, 2)
	waitCondition(t, node, gpuCond, corev1.ConditionTrue, "PluginReady")
	eventually(t, "every taint removed and its kubelet probed", func() (bool, string) {
		_, a := wl.probe(taintA)
		_, b := wl.probe(taintB)
		_, g := wl.probe(taintGPU)
		return a && b && g, wl.String()
	})

	for _, p := range []taintedPlugin{
		{taintA, condA, csiA, true, []string{taintB, taintGPU}},
		{taintB, condB, csiB, false, []string{taintGPU}},
		{taintGPU, gpuCond, "", false, nil},
	} {
		checkRemoval(t, wl, p)
	}
	// Never a taint gone before its own plugin's True, in any write.
	wl.mu.Lock()
	for i, w := range wl.nodes {
		for key, cond := range map[string]string{taintA: condA, taintB: condB, taintGPU: gpuCond} {
			if !slices.Contains(w.taints, key) && !slices.ContainsFunc(wl.nodes[:i+1], func(x nodeWrite) bool { return slices.Contains(x.ready, cond) }) {
				t.Errorf("the Node's write rv %d has no %s before %s said True", w.rv, key, cond)
			}
		}
	}
	wl.mu.Unlock()
	if t.Failed() {
		t.Logf("the writes:\n%s", wl)
	}
}

// taintedPlugin is an expected plugin of the scenario: its taint, its
// condition, its CSI driver ("": a device plugin) and whether that reports
// an attach limit, and the taints that must still be there when its goes.
type taintedPlugin struct {
	taint, cond, driver string
	count               bool
	others              []string
}

// checkRemoval holds the removal of p's taint against the writes: after
// its condition's True and within removalBound of it, the others still
// there, the kubelet holding the plugin (and the device plugin's devices)
// then, and after CSINode listed the driver (with its attach limit).
func checkRemoval(t *testing.T, wl *writeLog, p taintedPlugin) {
	t.Helper()
	ready, _, ok := wl.firstReady(p.cond, 0)
	gone, _, ok2 := wl.removal(p.taint, 0)
	if !ok || !ok2 {
		t.Fatalf("%s: True %t, its taint removed %t", p.cond, ok, ok2)
	}
	gap := gone.at.Sub(ready.at)
	t.Logf("%s: its taint removed %s after its condition's True (rv %d, then %d)", p.cond, gap.Round(time.Millisecond), ready.rv, gone.rv)
	if gone.rv <= ready.rv || gap > removalBound {
		t.Errorf("%s: taint removed at rv %d, %s after the condition's True at rv %d; want after it, within %s", p.taint, gone.rv, gap, ready.rv, removalBound)
	}
	for _, o := range p.others {
		if !slices.Contains(gone.taints, o) {
			t.Errorf("%s was gone when %s went: its plugin was not ready yet", o, p.taint)
		}
	}
	if pr, _ := wl.probe(p.taint); !pr.held || pr.err != nil || (p.driver == "" && pr.devices != 2) {
		t.Errorf("%s removed; the kubelet then: %+v (want it to hold the plugin's socket, and the device plugin's 2 devices)", p.taint, pr)
	}
	if p.driver == "" {
		return
	}
	entry, _, ok := wl.listed(p.driver, p.count, 0)
	if !ok || entry.rv >= gone.rv {
		t.Errorf("%s removed at rv %d; CSINode listed %s (with its attach limit: %t) at rv %d (%t); want before", p.taint, gone.rv, p.driver, p.count, entry.rv, ok)
	}
	if p.count && entry.drivers[p.driver] != maxVolumesOfA {
		t.Errorf("CSINode's attach limit of %s: %d, want %d", p.driver, entry.drivers[p.driver], maxVolumesOfA)
	}
	t.Logf("%s: the kubelet's CSINode write (rv %d) to the taint's removal: %s", p.driver, entry.rv, gone.at.Sub(entry.at).Round(time.Millisecond))
}
