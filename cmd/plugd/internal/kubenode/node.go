package kubenode

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	resourcev1 "k8s.io/api/resource/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	eventsv1client "k8s.io/client-go/kubernetes/typed/events/v1"
	resourcev1client "k8s.io/client-go/kubernetes/typed/resource/v1"
	storagev1client "k8s.io/client-go/kubernetes/typed/storage/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/events"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/plugd/plugd/api"
	"github.com/plugd/plugd/internal/kubeconfig"
)

// Config is what a Node needs. NodeName and Plugins are required.
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
	// every expected plugin is ready. Empty: none.
	RemoveTaint string
	// DisagreementGrace is how long the kubelet view and the socket may
	// disagree (a socket that answers and a kubelet without it, or the
	// reverse) before an event says so. Zero means a minute.
	DisagreementGrace time.Duration
	// RegistryDir is where the sockets are, for messages.
	RegistryDir string
	// Plugins returns the node's plugins as plugd sees them now. It is
	// called from Run's goroutine, after each Changed and every few
	// seconds, and must not block.
	Plugins func() []Plugin

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
	cfg         Config
	log         *slog.Logger
	core        corev1client.CoreV1Interface
	storage     storagev1client.StorageV1Interface
	resource    resourcev1client.ResourceV1Interface
	events      eventsv1client.EventsV1Interface
	scheme      *runtime.Scheme // for event references to the Node
	taintKey    string
	taintEffect corev1.TaintEffect
	grace       time.Duration

	node, csiNode, slices *source
	nodeEvents            atomic.Uint64 // Node updates the informer delivered
	kick                  chan struct{}
	m                     *metrics

	statusWrite, taintWrite, eventWrite writeOp

	mu       sync.Mutex
	views    map[key]api.KubeletView // by plugin, with Since; guarded by mu
	problems map[string]*Problem     // of writes, by operation; guarded by mu
	ready    map[string]bool         // by condition type; guarded by mu
}

// How often the plugins are compared with the API's view when nothing
// tells of a change (device health in a handler's details changes without
// an event): local work only, no request.
const localResync = 5 * time.Second

// Each write to the API server is bounded by writeTimeout; failed writes are
// retried after a backoff from writeBackoffMin, doubling to writeBackoffMax.
const (
	writeTimeout = 10 * time.Second
	// listTimeout bounds each list of the informers (watches are bounded
	// by client-go); a list of one node's objects is small.
	listTimeout     = 30 * time.Second
	writeBackoffMin = time.Second
	writeBackoffMax = 2 * time.Minute
	// minEvalGap spaces out evaluations during a burst of changes.
	minEvalGap = 100 * time.Millisecond
)

// New checks cfg and builds the client and informers. Nothing talks to the
// API server until Run.
func New(cfg Config) (*Node, error) {
	if cfg.NodeName == "" {
		return nil, fmt.Errorf("kubernetes: the node name is empty: set kubernetes.nodeName, --node-name or NODE_NAME")
	}
	if cfg.Plugins == nil {
		return nil, fmt.Errorf("kubernetes: Config.Plugins is nil")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.UserAgent == "" {
		cfg.UserAgent = "plugd"
	}
	n := &Node{cfg: cfg, log: cfg.Logger, kick: make(chan struct{}, 1), grace: cmp.Or(cfg.DisagreementGrace, time.Minute),
		views: map[key]api.KubeletView{}, problems: map[string]*Problem{}, ready: map[string]bool{}}
	n.cfg.Expect = slices.Clone(cfg.Expect) // defaults go into plugd's copy, not the caller's
	for i, e := range n.cfg.Expect {
		e, err := e.WithDefaults()
		if err != nil {
			return nil, fmt.Errorf("expect[%d]: %w", i, err)
		}
		n.cfg.Expect[i] = e
	}
	if cfg.RemoveTaint != "" {
		var err error
		if n.taintKey, n.taintEffect, err = ParseTaint(cfg.RemoveTaint); err != nil {
			return nil, fmt.Errorf("kubernetes.removeTaintWhenReady: %w", err)
		}
	}
	n.statusWrite = writeOp{"patch nodes/status of " + cfg.NodeName, "patch nodes/status", "patch_node_status"}
	n.taintWrite = writeOp{"remove the taint " + cfg.RemoveTaint + " from Node " + cfg.NodeName, "patch nodes", "remove_taint"}
	n.eventWrite = writeOp{"record events about Node " + cfg.NodeName, "create, patch events.events.k8s.io", "event"}
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
	n.scheme = runtime.NewScheme()
	if err := corev1.AddToScheme(n.scheme); err != nil {
		return nil, err
	}
	n.buildSources()
	n.m = newMetrics(n, cfg.Registerer)
	return n, nil
}

// restConfig reads the kubeconfig at path (bounded: package kubeconfig), or
// the pod's in-cluster configuration.
func restConfig(path string) (*rest.Config, error) {
	if path == "" {
		rc, err := rest.InClusterConfig()
		if err != nil {
			return nil, fmt.Errorf("kubernetes: no kubeconfig is set and plugd is not in a pod (%w): set kubernetes.kubeconfig", err)
		}
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
	n.node = newSource("Node "+name, "get, list, watch nodes", byName, &corev1.Node{}, n.log,
		func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) { return nodes.List(ctx, o) },
		func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) { return nodes.Watch(ctx, o) })
	n.csiNode = newSource("CSINode "+name, "get, list, watch csinodes.storage.k8s.io", byName, &storagev1.CSINode{}, n.log,
		func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) { return csi.List(ctx, o) },
		func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) { return csi.Watch(ctx, o) })
	n.slices = newSource("ResourceSlices of node "+name, "get, list, watch resourceslices.resource.k8s.io",
		fields.OneTermEqualSelector("spec.nodeName", name).String(), &resourcev1.ResourceSlice{}, n.log,
		func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) { return rs.List(ctx, o) },
		func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) { return rs.Watch(ctx, o) })
	for _, s := range []*source{n.node, n.csiNode, n.slices} {
		s.onChange = n.Changed
		count := s == n.node
		onEvent := func() {
			if count {
				n.nodeEvents.Add(1)
			}
			n.Changed()
		}
		_, _ = s.inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
			AddFunc:    func(any) { onEvent() },
			UpdateFunc: func(any, any) { onEvent() },
			DeleteFunc: func(any) { onEvent() },
		})
	}
}

// Changed tells the Node that the plugins may have changed: they are
// compared with the API's view again shortly. It never blocks.
func (n *Node) Changed() {
	select {
	case n.kick <- struct{}{}:
	default:
	}
}

// Run reads the API server and keeps the conditions until ctx is done. It
// returns nil then, once its informers have stopped. It never fails for the
// API server's sake: trouble is logged, counted, shown as the plugins'
// kubelet view and by Problems, and retried.
func (n *Node) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	for _, s := range []*source{n.node, n.csiNode, n.slices} {
		wg.Go(func() { s.inf.RunWithContext(ctx) })
	}
	bc := events.NewBroadcaster(eventSink{n, &events.EventSinkImpl{Interface: n.events}})
	defer bc.Shutdown()
	if err := bc.StartRecordingToSinkWithContext(ctx); err != nil {
		n.log.Warn("Kubernetes events will not be recorded", "err", err)
	}
	l := &loop{n: n, rec: bc.NewRecorder(n.scheme, "plugd"), written: map[string]written{}, disagree: map[key]*disagreement{}}
	n.log.Info("Kubernetes: watching this node's objects", "node", n.cfg.NodeName, "expected", len(n.cfg.Expect))

	timer := time.NewTimer(0)
	defer timer.Stop()
	var last time.Time
	for {
		select {
		case <-ctx.Done():
			cancel()
			wg.Wait()
			return nil
		case <-n.kick:
			if gap := time.Since(last); gap < minEvalGap {
				timer.Reset(minEvalGap - gap)
				continue
			}
		case <-timer.C:
		}
		now := time.Now()
		last = now
		next := l.evaluate(ctx, now)
		wait := localResync
		if !next.IsZero() {
			wait = min(wait, max(next.Sub(now), minEvalGap))
		}
		timer.Reset(wait)
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
	for _, s := range []*source{n.node, n.csiNode, n.slices} {
		if p := s.trouble(); p != nil && p.Reason != ReasonNotSynced {
			out = append(out, *p)
		}
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
	s := snapshot{nodeName: n.cfg.NodeName,
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
	return s
}

// loop is Run's state between evaluations; only Run's goroutine uses it.
type loop struct {
	n        *Node
	rec      events.EventRecorder
	written  map[string]written // conditions written, not yet seen back, by type
	disagree map[key]*disagreement

	failures  int       // writes failed in a row
	nextWrite time.Time // no write before this, after a failure
}

// written is a condition plugd wrote, and how many Node updates had arrived
// then: until another arrives, the cache does not show it yet.
type written struct {
	v   verdict
	seq uint64
}

// disagreement is a plugin whose socket and kubelet view disagree.
type disagreement struct {
	since    time.Time
	reported bool
}

// evaluate compares the plugins with the API's view, publishes the kubelet
// views, and writes what changed. It returns when it wants to run again
// (zero: no need before the next change).
func (l *loop) evaluate(ctx context.Context, now time.Time) time.Time {
	n := l.n
	socks := map[key][]Plugin{}
	for _, p := range n.cfg.Plugins() {
		if p.Type != "" && p.Name != "" {
			k := key{p.Type, p.Name}
			socks[k] = append(socks[k], p)
		}
	}
	for _, e := range n.cfg.Expect {
		if k := (key{e.Type, e.Name}); socks[k] == nil {
			socks[k] = nil
		}
	}
	snap := n.snapshot()
	views := make(map[key]view, len(socks))
	for k, ps := range socks {
		views[k] = kubeletView(k, ps, snap)
	}
	n.publish(views, now)

	next := l.disagreements(now, socks, views, snap.node)
	if snap.nodeProblem != nil || snap.node == nil {
		return next
	}
	var drop []string
	for _, typ := range unexpected(snap.node, n.cfg.Expect) {
		if w, ok := l.written[typ]; !ok || w.seq != n.nodeEvents.Load() {
			drop = append(drop, typ) // not already deleted and not yet seen so
		}
	}
	allReady := true
	var set []corev1.NodeCondition
	var notes []event
	for _, e := range n.cfg.Expect {
		k := key{e.Type, e.Name}
		v, ok := judge(e, socks[k], views[k], n.cfg.RegistryDir)
		if !ok {
			allReady = false
			continue
		}
		n.setReady(e, v.status == corev1.ConditionTrue)
		allReady = allReady && v.status == corev1.ConditionTrue
		cur := findCondition(snap.node, e.Condition)
		if sameVerdict(cur, v) {
			delete(l.written, e.Condition)
			continue
		}
		if w, ok := l.written[e.Condition]; ok && w.v == v && w.seq == n.nodeEvents.Load() {
			continue // written; the informer has not brought it back yet
		}
		set = append(set, nodeCondition(e.Condition, v, cur, now))
		switch {
		case v.status == corev1.ConditionTrue && (cur == nil || cur.Status != corev1.ConditionTrue):
			notes = append(notes, event{corev1.EventTypeNormal, "PluginReady", k, v.message})
		case v.status != corev1.ConditionTrue && cur != nil && cur.Status == corev1.ConditionTrue:
			notes = append(notes, event{corev1.EventTypeWarning, "PluginNotReady", k, v.message + " (" + v.reason + ")"})
		}
	}
	allReady = allReady && len(n.cfg.Expect) > 0
	var taint []byte // the patch that removes the startup taint, when it is due
	if allReady && n.taintKey != "" {
		if p, has, err := taintPatch(snap.node, n.taintKey, n.taintEffect); has && err == nil {
			taint = p
		}
	}
	// A write that failed and is no longer needed (the plugin went back to
	// what the Node shows, the taint is gone) is no trouble any more.
	if len(set) == 0 && len(drop) == 0 {
		n.setWriteProblem(n.statusWrite.op, nil, "the failed write is no longer needed")
	}
	if taint == nil {
		n.setWriteProblem(n.taintWrite.op, nil, "the failed write is no longer needed")
	}
	if len(set) == 0 && len(drop) == 0 && taint == nil {
		return next
	}
	if now.Before(l.nextWrite) {
		return earliest(next, l.nextWrite)
	}
	if (len(set) > 0 || len(drop) > 0) && !l.writeConditions(ctx, now, snap.node, set, drop, notes) {
		return earliest(next, l.nextWrite)
	}
	if taint != nil {
		if !l.write(ctx, now, n.taintWrite, func(ctx context.Context) error {
			_, err := n.core.Nodes().Patch(ctx, n.cfg.NodeName, types.JSONPatchType, taint, metav1.PatchOptions{FieldManager: fieldManager})
			return err
		}) {
			return earliest(next, l.nextWrite)
		}
		n.log.Info("every expected plugin is ready: taint removed", "node", n.cfg.NodeName, "taint", n.cfg.RemoveTaint)
	}
	return next
}

// writeConditions patches the Node's status: the conditions in set, and
// those of the types in drop deleted. Once that is written, it sends the
// events of the changes, about node.
func (l *loop) writeConditions(ctx context.Context, now time.Time, node *corev1.Node, set []corev1.NodeCondition, drop []string, notes []event) bool {
	n := l.n
	seq := n.nodeEvents.Load()
	if !l.write(ctx, now, n.statusWrite, func(ctx context.Context) error {
		patch, err := conditionsPatch(set, drop)
		if err == nil {
			_, err = n.core.Nodes().Patch(ctx, n.cfg.NodeName, types.StrategicMergePatchType, patch, metav1.PatchOptions{FieldManager: fieldManager}, "status")
		}
		return err
	}) {
		return false
	}
	for _, c := range set {
		l.written[string(c.Type)] = written{verdict{c.Status, c.Reason, c.Message}, seq}
		n.log.Info("Node condition set", "node", n.cfg.NodeName, "condition", c.Type, "status", c.Status, "reason", c.Reason, "message", c.Message)
	}
	for _, typ := range drop {
		l.written[typ] = written{seq: seq}
		n.log.Info("Node condition removed: plugd no longer expects its plugin", "node", n.cfg.NodeName, "condition", typ)
	}
	for _, e := range notes {
		l.record(node, e)
	}
	return true
}

// writeOp is one kind of write plugd makes: what its Problem calls it, the
// permission it needs (as RBAC writes it), and its metrics' label.
type writeOp struct{ op, perm, metric string }

// fieldManager is who plugd's writes are from, in the objects' managedFields.
const fieldManager = "plugd"

// write runs one write with a deadline, and keeps its outcome (noteWrite);
// a failure puts off every write by a backoff.
func (l *loop) write(ctx context.Context, now time.Time, w writeOp, do func(context.Context) error) bool {
	ctx, cancel := context.WithTimeoutCause(ctx, writeTimeout, fmt.Errorf("the API server did not answer within %s", writeTimeout))
	err := do(ctx)
	if ctx.Err() != nil && err != nil {
		err = fmt.Errorf("%w (%w)", err, context.Cause(ctx))
	}
	cancel()
	l.n.noteWrite(w, err, now)
	if err == nil {
		l.failures, l.nextWrite = 0, time.Time{}
		return true
	}
	d := min(writeBackoffMin<<min(l.failures, 10), writeBackoffMax)
	d = d/2 + rand.N(d/2+1) // jitter: a cluster's nodes do not retry in step
	l.failures++
	l.nextWrite = now.Add(d)
	return false
}

// noteWrite counts a write, and keeps its failure as the Problem of its
// operation until one succeeds (or is no longer needed).
func (n *Node) noteWrite(w writeOp, err error, now time.Time) {
	n.m.writes.WithLabelValues(w.metric).Inc()
	var p *Problem
	if err != nil {
		p = classify(w.op, w.perm, err, now)
		n.m.apiErrors.WithLabelValues(w.metric, p.Reason).Inc()
	}
	n.setWriteProblem(w.op, p, "writing again")
}

// setWriteProblem makes p the trouble of the write op (nil: none, for the
// reason ended), and logs each change of it once.
func (n *Node) setWriteProblem(op string, p *Problem, ended string) {
	n.mu.Lock()
	was := n.problems[op]
	switch {
	case p == nil && was == nil:
		n.mu.Unlock()
		return
	case p == nil:
		delete(n.problems, op)
	default:
		if was != nil && was.Reason == p.Reason {
			p.Since = was.Since
		}
		n.problems[op] = p
	}
	n.mu.Unlock()
	switch {
	case p == nil:
		n.log.Info("Kubernetes API: "+ended, "operation", op, "troubleSince", was.Since)
	case was == nil || was.Reason != p.Reason:
		n.log.Warn("Kubernetes API: cannot write; retrying with backoff", "operation", op, "reason", p.Reason, "err", p.Message)
	}
}

// event is one Kubernetes event about the Node.
type event struct {
	typ, reason string
	plugin      key
	note        string
}

// record sends e, about node. Events about different plugins differ in
// their action, which names the plugin, so that the event machinery's
// series (its rate limit: repeats within minutes are counted in one event)
// never folds two plugins into one.
func (l *loop) record(node *corev1.Node, e event) {
	if node == nil {
		return
	}
	action := "Check " + e.plugin.String()
	if len(action) > 128 {
		action = action[:128]
	}
	note := e.note
	if len(note) > 1000 {
		note = note[:1000]
	}
	// A reference without the Node's resourceVersion, which changes with
	// every status update: with it no two events would be alike, and none
	// would fold into a series.
	ref := &corev1.ObjectReference{APIVersion: "v1", Kind: "Node", Name: node.Name, UID: node.UID}
	l.rec.Eventf(ref, nil, e.typ, e.reason, action, "%s", note)
}

// eventSink is where client-go's event machinery writes plugd's events:
// each write has a deadline, and its outcome is kept as that of plugd's
// other writes, so that a refused event names the permission.
type eventSink struct {
	n    *Node
	sink events.EventSink
}

func (s eventSink) Create(ctx context.Context, e *eventsv1.Event) (*eventsv1.Event, error) {
	return s.write(ctx, false, func(ctx context.Context) (*eventsv1.Event, error) { return s.sink.Create(ctx, e) })
}

func (s eventSink) Update(ctx context.Context, e *eventsv1.Event) (*eventsv1.Event, error) {
	return s.write(ctx, false, func(ctx context.Context) (*eventsv1.Event, error) { return s.sink.Update(ctx, e) })
}

// Patch updates a series; when its event is gone the machinery creates it
// anew, so that a patch that finds none is no trouble.
func (s eventSink) Patch(ctx context.Context, old *eventsv1.Event, data []byte) (*eventsv1.Event, error) {
	return s.write(ctx, true, func(ctx context.Context) (*eventsv1.Event, error) { return s.sink.Patch(ctx, old, data) })
}

// write makes one write; it returns the error as it came, which the
// machinery tells retries by.
func (s eventSink) write(ctx context.Context, patch bool, do func(context.Context) (*eventsv1.Event, error)) (*eventsv1.Event, error) {
	wctx, cancel := context.WithTimeoutCause(ctx, writeTimeout, fmt.Errorf("the API server did not answer within %s", writeTimeout))
	defer cancel()
	e, err := do(wctx)
	switch {
	case ctx.Err() != nil: // plugd is stopping
	case patch && apierrors.IsNotFound(err):
		s.n.m.writes.WithLabelValues(s.n.eventWrite.metric).Inc()
	case err != nil && wctx.Err() != nil:
		s.n.noteWrite(s.n.eventWrite, fmt.Errorf("%w (%w)", err, context.Cause(wctx)), time.Now())
	default:
		s.n.noteWrite(s.n.eventWrite, err, time.Now())
	}
	return e, err
}

// disagreements records an event for each plugin whose socket and kubelet
// view have disagreed for the grace period, once per disagreement, and
// returns when the next one is due.
func (l *loop) disagreements(now time.Time, socks map[key][]Plugin, views map[key]view, node *corev1.Node) time.Time {
	var next time.Time
	for k, v := range views {
		if k.typ != TypeCSI && k.typ != TypeDevice && k.typ != TypeDRA {
			continue
		}
		answering := slices.ContainsFunc(socks[k], func(p Plugin) bool { return p.Answering })
		var text string
		switch {
		case answering && v.State == api.KubeletNotRegistered:
			text = "its socket answers, but the kubelet has not registered it: " + v.Message
		case !answering && v.State == api.KubeletRegistered && !(k.typ == TypeDevice && v.allocatable == 0):
			// A device plugin that went keeps its capacity for the kubelet's
			// grace period, with nothing allocatable: the kubelet has let it
			// go, and agrees.
			text = "the kubelet has it (" + v.Message + "), but no socket of it answers"
		default:
			delete(l.disagree, k)
			continue
		}
		d := l.disagree[k]
		if d == nil {
			d = &disagreement{since: now}
			l.disagree[k] = d
		}
		switch due := d.since.Add(l.n.grace); {
		case d.reported:
		case !now.Before(due):
			d.reported = true
			l.record(node, event{corev1.EventTypeWarning, "KubeletDisagrees", k,
				fmt.Sprintf("%s: for %s, %s", k, now.Sub(d.since).Round(time.Second), text)})
		default:
			next = earliest(next, due)
		}
	}
	for k := range l.disagree {
		if _, ok := views[k]; !ok {
			delete(l.disagree, k)
		}
	}
	return next
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
}

func (n *Node) setReady(e Expectation, ready bool) {
	n.mu.Lock()
	n.ready[e.Condition] = ready
	n.mu.Unlock()
}

// earliest is the earlier of two times, zero meaning none.
func earliest(a, b time.Time) time.Time {
	if a.IsZero() || (!b.IsZero() && b.Before(a)) {
		return b
	}
	return a
}
