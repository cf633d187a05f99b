package kubenode

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	eventsv1client "k8s.io/client-go/kubernetes/typed/events/v1"
	resourcev1client "k8s.io/client-go/kubernetes/typed/resource/v1"
	storagev1client "k8s.io/client-go/kubernetes/typed/storage/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/utils/clock"

	"github.com/plugd/plugd/api"
	"github.com/plugd/plugd/cmd/plugd/internal/kubenode/kubeletstate"
	"github.com/plugd/plugd/internal/kubeconfig"
)

// Config is what a Node needs. NodeName and Sockets are required.
type Config struct {
	// Kubeconfig is the kubeconfig file to reach the API server with;
	// empty means the pod's in-cluster configuration.
	Kubeconfig string
	// NodeName is the name of this node's Node object.
	NodeName string
	// UserAgent is sent with every request, so that the API server's logs
	// tell plugd's requests from others'. Empty means "plugd".
	UserAgent string
	// Expect are the plugins this node must have; each gets a Node condition.
	Expect []Expectation
	// RemoveTaint, as KEY:EFFECT, is a taint removed from the Node once
	// every expected plugin is ready. Empty: none. Each expectation may
	// name a taint of its own (Expectation.Taint).
	RemoveTaint string
	// StartupWindow is how long after the kubelet's start a startup taint
	// another writer puts back is removed again (taints.go). Zero means 10
	// minutes.
	StartupWindow time.Duration
	// DisagreementGrace is how long the kubelet view and the socket may
	// disagree (a socket that answers and a kubelet without it, or the
	// reverse) before an event says so. Zero means a minute.
	DisagreementGrace time.Duration
	// RegistryDir is where the sockets are.
	RegistryDir string
	// Kubelet says where the running kubelet's own state is read: what
	// its plugin manager holds, its devices. Without it, plugd infers
	// what the kubelet registered from API objects (reason Inferred).
	Kubelet KubeletConfig
	// HeartbeatInterval is how often plugd rewrites its conditions, with a
	// new lastHeartbeatTime, when nothing changes: a reader can tell a
	// condition nobody maintains (its heartbeat older than twice this and a
	// minute) from one that holds. Zero means 5 minutes; negative, never.
	HeartbeatInterval time.Duration
	// Clock is the time plugd's pacing, heartbeats and backoff follow. Nil
	// means the wall clock.
	Clock clock.WithTicker
	// Sockets returns the node's registration sockets as plugd sees them
	// now (the node agent's input). It is called from Run's goroutine,
	// after each Changed and every few seconds, and must not block.
	Sockets func() []Socket
	// Scanned, if not nil, is closed once Sockets lists every socket that
	// was in the registry directory when plugd started. Until then no
	// expected plugin is called missing: a restarted plugd that has not
	// walked the directory yet would otherwise write False for plugins the
	// kubelet holds, and True a moment later.
	Scanned <-chan struct{}

	Logger     *slog.Logger
	Registerer prometheus.Registerer
}

// Node is plugd's link with its Node in the Kubernetes API: it reads the
// kubelet's side of the node's plugins (the Node, its CSINode, its
// ResourceSlices), tells what the kubelet made of each plugin, keeps a
// Node condition per expected plugin, removes a startup taint, and records
// events. Everything it reads comes from informers scoped to this node;
// nothing local waits on the API server.
type Node struct {
	cfg       Config
	log       *slog.Logger
	core      corev1client.CoreV1Interface
	storage   storagev1client.StorageV1Interface
	resource  resourcev1client.ResourceV1Interface
	events    eventsv1client.EventsV1Interface
	scheme    *runtime.Scheme // for event references to the Node
	taints    []taintRule
	window    time.Duration // the startup window of the taints
	grace     time.Duration
	heartbeat time.Duration // 0: none
	clock     clock.WithTicker

	node, csiNode, slices *source
	// taintRules watches the DeviceTaintRules where they are served (rules
	// says: taintrules.go); discoverRules asks (a test's, or the API's).
	taintRules    *source
	rules         atomic.Int32
	discoverRules func(context.Context) (bool, error)
	// classes reads the DeviceClasses, only when an expectation names
	// some (expect[].deviceClasses); nil otherwise.
	classes *source
	// fakeAPI is the clientset behind the clients when it is a fake one
	// (tests): the informers then list rather than stream.
	fakeAPI any
	kubelet *kubeletstate.Watch
	// kubeletEvidence is what the reads of the kubelet have shown now:
	// kubelet.Evidence, or what a test sets.
	kubeletEvidence func() kubeletstate.Evidence
	nodeEvents      atomic.Uint64 // Node updates the informer delivered
	csiEvents       atomic.Uint64 // CSINode changes the informer delivered
	sliceEvents     atomic.Uint64 // ResourceSlice changes the informer delivered
	localChanges    atomic.Uint64 // Changed calls: the plugins changed
	kick            chan struct{}
	m               *metrics

	statusWrite, eventWrite writeOp

	mu       sync.Mutex
	views    map[key]api.KubeletView // by plugin, with Since; guarded by mu
	pools    map[string][]poolState  // of each DRA driver, by name; guarded by mu
	problems map[string]*Problem     // of writes, by operation; guarded by mu
	ready    map[string]bool         // by condition type; guarded by mu
	conds    []ConditionState        // by expectation; guarded by mu
	stale    []StaleEntry            // guarded by mu
	// metricMissing is, at the last evaluation, the trouble of a kubelet
	// read whose /metrics lacks the plugin manager's gauge; guarded by mu.
	metricMissing *Problem
	// confinement is the last probe of the admission policies; guarded by
	// mu. probeMu makes one probe at a time.
	confinement Confinement
	probeMu     sync.Mutex
	staleMore   int // stale entries beyond stale; guarded by mu
	// taintStates are the taints' states for the status API and the
	// doctor (taintview.go); guarded by mu.
	taintStates []taintState
}

// newNode checks cfg and builds a Node without its clients.
func newNode(cfg Config) (*Node, error) {
	if cfg.NodeName == "" {
		return nil, fmt.Errorf("kubernetes: the node name is empty: set kubernetes.nodeName, --node-name or NODE_NAME")
	}
	if cfg.Sockets == nil {
		return nil, fmt.Errorf("kubernetes: Config.Sockets is nil")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.UserAgent == "" {
		cfg.UserAgent = "plugd"
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	n := &Node{cfg: cfg, log: cfg.Logger, kick: make(chan struct{}, 1), grace: cmp.Or(cfg.DisagreementGrace, defaultGrace),
		heartbeat: cmp.Or(cfg.HeartbeatInterval, defaultHeartbeat), clock: cfg.Clock,
		views: map[key]api.KubeletView{}, problems: map[string]*Problem{}, ready: map[string]bool{}}
	if n.heartbeat < 0 {
		n.heartbeat = 0
	}
	n.cfg.Expect = slices.Clone(cfg.Expect) // defaults go into plugd's copy, not the caller's
	for i, e := range n.cfg.Expect {
		e, err := e.WithDefaults()
		if err != nil {
			return nil, fmt.Errorf("expect[%d]: %w", i, err)
		}
		n.cfg.Expect[i] = e
	}
	var err error
	if n.taints, err = taintRules(n.cfg.Expect, cfg.RemoveTaint); err != nil {
		return nil, err
	}
	n.window = cmp.Or(cfg.StartupWindow, defaultStartupWindow)
	n.statusWrite = writeOp{"patch nodes/status of " + cfg.NodeName, "patch nodes/status", "patch_node_status"}
	n.eventWrite = writeOp{"record events about Node " + cfg.NodeName, "create, patch events.events.k8s.io", "event"}
	return n, nil
}

// New checks cfg and builds the client and informers. Nothing talks to the
// API server or the kubelet until Run.
func New(cfg Config) (*Node, error) {
	n, err := newNode(cfg)
	if err != nil {
		return nil, err
	}
	rc, err := restConfig(cfg.Kubeconfig)
	if err != nil {
		return nil, err
	}
	rc.UserAgent = cfg.UserAgent
	// Protobuf: the Node is the largest object plugd reads.
	rc.AcceptContentTypes = "application/vnd.kubernetes.protobuf,application/json"
	rc.ContentType = "application/vnd.kubernetes.protobuf"
	// The typed clients of the groups plugd reads, rather than the whole
	// clientset: a third of the size in plugd's binary.
	if n.core, err = corev1client.NewForConfig(rc); err == nil {
		if n.storage, err = storagev1client.NewForConfig(rc); err == nil {
			if n.resource, err = resourcev1client.NewForConfig(rc); err == nil {
				n.events, err = eventsv1client.NewForConfig(rc)
			}
		}
	}
	if err != nil {
		return nil, fmt.Errorf("kubernetes: %w", err)
	}
	var kc *kubeletstate.Client
	if cfg.Kubelet.Address != "" {
		if kc, err = kubeletstate.NewClient(cfg.Kubelet, rc, cfg.NodeName, cfg.RegistryDir); err != nil {
			return nil, err
		}
	}
	n.build(kc)
	return n, nil
}

// build makes the informers, metrics and the kubelet's watch (kc nil: the
// kubelet is not read), once the clients are set.
func (n *Node) build(kc *kubeletstate.Client) {
	n.scheme = runtime.NewScheme()
	_ = corev1.AddToScheme(n.scheme) // adds known types; it cannot fail
	n.buildSources()
	n.m = newMetrics(n, n.cfg.Registerer)
	n.kubelet = kubeletstate.NewWatch(kc, n.cfg.Kubelet, n.clock, n.log, kubeletstate.Metrics{Reads: n.m.kubeletReads, Bytes: n.m.kubeletBytes}, n.changed)
	n.kubeletEvidence = n.kubelet.Evidence
}

// restConfig reads the kubeconfig at path (bounded: package kubeconfig), or
// the pod's in-cluster configuration.
func restConfig(path string) (*rest.Config, error) {
	if path == "" {
		rc, err := rest.InClusterConfig()
		if err != nil {
			return nil, fmt.Errorf("kubernetes: no kubeconfig is set and plugd is not in a pod (%w): set kubernetes.kubeconfig", err)
		}
		kubeconfig.Bound(rc) // as kubeconfig.RESTConfig bounds the others
		return rc, nil
	}
	rc, err := kubeconfig.RESTConfig(kubeconfig.ClientConfig(path, ""))
	if err != nil {
		return nil, fmt.Errorf("kubernetes.kubeconfig %s: %w", path, err)
	}
	return rc, nil
}

func (n *Node) buildSources() {
	name := n.cfg.NodeName
	byName := fields.OneTermEqualSelector("metadata.name", name).String()
	nodes, csi, rs := n.core.Nodes(), n.storage.CSINodes(), n.resource.ResourceSlices()
	n.node = newSource("Node "+name, "list, watch nodes", byName, &corev1.Node{}, slimNode, n.fakeAPI, n.log,
		func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) { return nodes.List(ctx, o) },
		func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) { return nodes.Watch(ctx, o) })
	n.csiNode = newSource("CSINode "+name, "list, watch csinodes.storage.k8s.io", byName, &storagev1.CSINode{}, slimCSINode, n.fakeAPI, n.log,
		func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) { return csi.List(ctx, o) },
		func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) { return csi.Watch(ctx, o) })
	n.slices = newSource("ResourceSlices of node "+name, "list, watch resourceslices.resource.k8s.io",
		fields.OneTermEqualSelector("spec.nodeName", name).String(), &resourcev1.ResourceSlice{}, slimSlice(classesMatched(n.cfg.Expect)), n.fakeAPI, n.log,
		func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) { return rs.List(ctx, o) },
		func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) { return rs.Watch(ctx, o) })
	n.classes = n.classSource()
	for _, s := range n.sources() {
		s.onChange = n.changed
	}
	n.buildTaintRules()
	// The kubelet reports its devices in the Node: a change of capacity or
	// allocatable asks pod-resources (cheap, local) for them. It updates
	// the Node for much else too; that asks for no read of the kubelet.
	_, _ = n.node.inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: func(any) { n.nodeEvents.Add(1); n.kubelet.RequestDevices(); n.changed() },
		UpdateFunc: func(old, cur any) {
			n.nodeEvents.Add(1)
			o, ok1 := old.(*corev1.Node)
			c, ok2 := cur.(*corev1.Node)
			if !ok1 || !ok2 || !equality.Semantic.DeepEqual(o.Status.Allocatable, c.Status.Allocatable) || !equality.Semantic.DeepEqual(o.Status.Capacity, c.Status.Capacity) {
				n.kubelet.RequestDevices()
			}
			n.changed()
		},
		DeleteFunc: func(any) { n.nodeEvents.Add(1); n.changed() },
	})
	// The kubelet writes CSINode as it registers a driver: read it.
	_, _ = n.csiNode.inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { n.csiEvents.Add(1); n.kubelet.Request(); n.changed() },
		UpdateFunc: func(any, any) { n.csiEvents.Add(1); n.kubelet.Request(); n.changed() },
		DeleteFunc: func(any) { n.csiEvents.Add(1); n.kubelet.Request(); n.changed() },
	})
	_, _ = n.slices.inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { n.sliceEvents.Add(1); n.changed() },
		UpdateFunc: func(any, any) { n.sliceEvents.Add(1); n.changed() },
		DeleteFunc: func(any) { n.sliceEvents.Add(1); n.changed() },
	})
}

// sources are the informers plugd runs.
func (n *Node) sources() []*source {
	out := []*source{n.node, n.csiNode, n.slices}
	if n.classes != nil {
		out = append(out, n.classes)
	}
	return out
}

// classSource is the informer of the DeviceClasses the expectations name,
// or nil when they name none. DeviceClasses are cluster-scoped and few (an
// administrator's, one or two per kind of device): one class is watched by
// its name, several all together (a field selector cannot say "one of").
func (n *Node) classSource() *source {
	var names []string
	for _, e := range n.cfg.Expect {
		names = append(names, e.deviceClassNames()...)
	}
	slices.Sort(names)
	names = slices.Compact(names)
	if len(names) == 0 {
		return nil
	}
	what, sel := "DeviceClasses", ""
	if len(names) == 1 {
		what, sel = "DeviceClass "+names[0], fields.OneTermEqualSelector("metadata.name", names[0]).String()
	}
	dc := n.resource.DeviceClasses()
	s := newSource(what, "list, watch deviceclasses.resource.k8s.io", sel, &resourcev1.DeviceClass{}, slimDeviceClass, n.fakeAPI, n.log,
		func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) { return dc.List(ctx, o) },
		func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) { return dc.Watch(ctx, o) })
	_, _ = s.inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { n.sliceEvents.Add(1); n.changed() }, // the views are made again
		UpdateFunc: func(any, any) { n.sliceEvents.Add(1); n.changed() },
		DeleteFunc: func(any) { n.sliceEvents.Add(1); n.changed() },
	})
	return s
}

// Changed tells the Node that the plugins may have changed: they are
// compared with the kubelet's and the API's view again shortly, and the
// kubelet is read again while it has not caught up. It never blocks.
func (n *Node) Changed() {
	n.localChanges.Add(1)
	n.changed()
}

// changed asks for an evaluation.
func (n *Node) changed() {
	select {
	case n.kick <- struct{}{}:
	default:
	}
}

// KubeletView is what the API shows the kubelet made of the plugin typ
// name, and whether plugd has compared it yet. It is safe to call at any
// time.
func (n *Node) KubeletView(typ, name string) (api.KubeletView, bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	v, ok := n.views[key{typ, name}]
	return v, ok
}

// Problems are the troubles plugd has with the API server now, reads and
// writes, oldest first.
func (n *Node) Problems() []Problem {
	var out []Problem
	for _, s := range n.sources() {
		if p := s.trouble(); p != nil && p.Reason != ReasonNotSynced {
			out = append(out, *p)
		}
	}
	if _, p := n.taintRulesNow(); p != nil && p.Reason != ReasonNotSynced {
		out = append(out, *p)
	}
	n.mu.Lock()
	for _, p := range n.problems {
		out = append(out, *p)
	}
	n.mu.Unlock()
	slices.SortFunc(out, func(a, b Problem) int { return a.Since.Compare(b.Since) })
	return out
}

// snapshot reads the informers' caches.
func (n *Node) snapshot() snapshot {
	s := snapshot{nodeName: n.cfg.NodeName, seq: [3]uint64{n.nodeEvents.Load(), n.csiEvents.Load(), n.sliceEvents.Load()},
		nodeProblem: n.node.trouble(), csiProblem: n.csiNode.trouble(), sliceProblem: n.slices.trouble()}
	if obj, ok, _ := n.node.inf.GetStore().GetByKey(n.cfg.NodeName); ok {
		s.node = obj.(*corev1.Node)
	}
	if obj, ok, _ := n.csiNode.inf.GetStore().GetByKey(n.cfg.NodeName); ok {
		s.csiNode = obj.(*storagev1.CSINode)
	}
	for _, obj := range n.slices.inf.GetStore().List() {
		s.slices = append(s.slices, obj.(*resourcev1.ResourceSlice))
	}
	s.taintRules, s.taintRuleProblem = n.taintRulesNow()
	if n.classes != nil {
		s.classProblem = n.classes.trouble()
		s.classes = map[string]*resourcev1.DeviceClass{}
		for _, obj := range n.classes.inf.GetStore().List() {
			c := obj.(*resourcev1.DeviceClass)
			s.classes[c.Name] = c
		}
	}
	return s
}

// publish keeps the views for KubeletView, with the time each entered its
// state and reason.
func (n *Node) publish(views map[key]view, now time.Time) {
	n.mu.Lock()
	defer n.mu.Unlock()
	for k, v := range views {
		old, ok := n.views[k]
		kv := v.KubeletView
		kv.Since = now
		if ok && old.State == kv.State && old.Reason == kv.Reason {
			kv.Since = old.Since
		} else if ok {
			n.log.Info("kubelet view changed", "plugin", k.String(), "state", kv.State, "reason", kv.Reason, "message", kv.Message, "was", old.State)
		}
		n.views[k] = kv
	}
	for k := range n.views {
		if _, ok := views[k]; !ok {
			delete(n.views, k)
		}
	}
	n.pools = map[string][]poolState{}
	for k, v := range views {
		if k.typ == TypeDRA && v.dra != nil && len(v.dra.pools) > 0 {
			n.pools[k.name] = v.dra.pools[:min(len(v.dra.pools), maxPoolSeries)]
		}
	}
}

func (n *Node) setReady(e Expectation, ready bool) {
	n.mu.Lock()
	n.ready[e.Condition] = ready
	n.mu.Unlock()
}

// latest is the later of two times.
func latest(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// earliest is the earlier of two times, zero meaning none.
func earliest(a, b time.Time) time.Time {
	if a.IsZero() || (!b.IsZero() && b.Before(a)) {
		return b
	}
	return a
}
