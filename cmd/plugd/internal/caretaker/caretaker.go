// Package caretaker marks the Node conditions that plugd wrote and no
// longer maintains Unknown, as the node lifecycle controller marks the
// kubelet's Ready: node-readiness-controller and other readers act on a
// condition's status only, and a dead plugd's last True would go on
// telling them its plugin is ready.
//
// Three signs, each costing no write while plugd runs (look, in
// decide.go): plugd's pod on the node not Ready, or gone, for longer than
// a grace that outlasts a rolling update's gap (reason PlugdNotRunning);
// a CSI driver's condition True while the kubelet has dropped the driver
// from the node's CSINode, for longer than a few seconds in which a live
// plugd writes False (PlugdNotRunning); and, the last resort where plugd
// runs outside a pod, a heartbeat the caretaker has not seen change for
// nodecond.MaxHeartbeatAge on its own clock (NotMaintained: plugd
// rewrites its conditions at least every 5 minutes).
//
// One caretaker serves a cluster: it watches every Node (keeping only
// plugd's conditions of each), plugd's pods (by namespace and label
// selector) and every CSINode (keeping only its drivers' names), and looks
// at a Node again when the first of plugd's conditions on it can be due
// a mark, with a timer, not by polling. It writes only a condition that is
// unmaintained, with a JSON patch that tests the heartbeat it read is
// still there, so a plugd that wrote meanwhile wins, and two caretakers
// are safe, only redundant: no leader election.
package caretaker

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"reflect"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	storagev1client "k8s.io/client-go/kubernetes/typed/storage/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/clock"

	"github.com/plugd/plugd/internal/kubeconfig"
	"github.com/plugd/plugd/internal/nodecond"
)

// Config is how a caretaker reaches the API server and what it takes as
// stale.
type Config struct {
	// Kubeconfig is the kubeconfig file; empty: the pod's in-cluster
	// configuration.
	Kubeconfig string
	// StaleAfter is how old a condition's heartbeat may be and the
	// condition still be maintained (zero: nodecond.MaxHeartbeatAge).
	// Shorter than plugd's heartbeat interval, it marks conditions plugd
	// maintains: for tests only.
	StaleAfter time.Duration
	// PlugdNamespace and PlugdSelector (a label selector) are plugd's
	// DaemonSet pods; an empty selector: the caretaker watches no pods,
	// and the pod sign is not used.
	PlugdNamespace string
	PlugdSelector  string
	// PodGrace is how long plugd's pod on a node may be not Ready, or
	// gone, before its conditions are marked (zero: DefaultPodGrace).
	PodGrace time.Duration
	// CSINodeGrace is how long a CSI driver's condition may say True
	// while the kubelet has dropped the driver from CSINode (zero:
	// DefaultCSINodeGrace; negative: the caretaker watches no CSINodes).
	CSINodeGrace time.Duration
	// Logger gets what the caretaker does and its trouble (nil: discarded).
	Logger *slog.Logger
	// SummaryNamespace is the namespace of the ConfigMap
	// nodecond.SummaryName where the caretaker keeps the cluster view for
	// kubectl plugd cluster (empty: it writes none).
	SummaryNamespace string
}

// The shipped graces. DefaultPodGrace outlasts a rolling update's gap
// (the old pod stopped, the new one scheduled, started and Ready: its
// readiness probe runs every 5 s), image pull included when the image is
// cached; with the kubelet's report of a dead container (a second or two)
// and the caretaker's write, a dead plugd's conditions say True for less
// than a minute. DefaultCSINodeGrace outlasts the moment the kubelet drops
// a driver from CSINode while it registers the driver again, and a live
// plugd's False (149 ms beside a real kubelet).
const (
	DefaultPodGrace     = 40 * time.Second
	DefaultCSINodeGrace = 10 * time.Second
)

// Bounds of the caretaker's requests: a list of every Node of a large
// cluster takes a while; a read or write of one Node does not.
const (
	listTimeout    = 2 * time.Minute
	requestTimeout = 30 * time.Second
	// markTries bounds the read-and-patch rounds for one Node, each
	// started again only when a write came between the read and the
	// patch.
	markTries = 3
)

// Caretaker watches the cluster's Nodes and marks plugd's conditions that
// nobody maintains. Build it with New; Run it once.
type Caretaker struct {
	nodes    corev1client.NodeInterface
	bounds   bounds
	clock    clock.WithTicker
	log      *slog.Logger
	inf      cache.SharedIndexInformer
	pods     cache.SharedIndexInformer // nil: no pod sign
	csiNodes cache.SharedIndexInformer // nil: no CSINode sign
	queue    workqueue.TypedRateLimitingInterface[string]

	// trouble is, by Node name, the last failure to mark one of its
	// conditions, so each is logged once; only the worker touches it.
	trouble map[string]string
	// seen is, by Node name, look's record of when the caretaker saw each
	// of plugd's heartbeats there change; podSeen what it saw of plugd's
	// pods there, drivers of the CSI drivers in its CSINode
	// (updateDrivers). Only the worker touches them.
	seen    map[string]map[string]sighting
	podSeen map[string]podSighting
	drivers map[string]map[string]time.Time
	// readTrouble is the informers', by what they read, logged on change.
	readMu      sync.Mutex
	readTrouble map[string]string // guarded by readMu
	// looked, if set (tests), is told each Node looked at, when it is due
	// a look again, and what the caretaker has seen of its pods and
	// CSINode drivers (a copy).
	looked func(name string, next time.Time, pods podSighting, drivers map[string]time.Time)

	// summaries are the ConfigMaps of summaryNamespace, where the fleet
	// summary is written (nil: none is).
	summaries        corev1client.ConfigMapInterface
	summaryNamespace string
	// dirty says a Node changed since the summary was last counted.
	dirty atomic.Bool
}

// New builds a caretaker for the cluster cfg names. Nothing talks to the
// API server until Run.
func New(cfg Config) (*Caretaker, error) {
	rc, err := restConfig(cfg.Kubeconfig)
	if err != nil {
		return nil, err
	}
	rc.UserAgent = "plugd-caretaker"
	// Protobuf: a list of every Node is the largest read.
	rc.AcceptContentTypes = "application/vnd.kubernetes.protobuf,application/json"
	rc.ContentType = "application/vnd.kubernetes.protobuf"
	core, err := corev1client.NewForConfig(rc)
	if err != nil {
		return nil, fmt.Errorf("kubernetes: %w", err)
	}
	storage, err := storagev1client.NewForConfig(rc)
	if err != nil {
		return nil, fmt.Errorf("kubernetes: %w", err)
	}
	c := newCaretaker(core, storage, nil, cfg, clock.RealClock{})
	if cfg.SummaryNamespace != "" {
		c.summaries, c.summaryNamespace = core.ConfigMaps(cfg.SummaryNamespace), cfg.SummaryNamespace
	}
	return c, nil
}

// restConfig reads the kubeconfig at path (bounded: package kubeconfig),
// or the pod's in-cluster configuration.
func restConfig(path string) (*rest.Config, error) {
	if path == "" {
		rc, err := rest.InClusterConfig()
		if err != nil {
			return nil, fmt.Errorf("kubernetes: no --kubeconfig is set and the caretaker is not in a pod (%w): set --kubeconfig", err)
		}
		kubeconfig.Bound(rc) // as kubeconfig.RESTConfig bounds the others
		return rc, nil
	}
	rc, err := kubeconfig.RESTConfig(kubeconfig.ClientConfig(path, ""))
	if err != nil {
		return nil, fmt.Errorf("--kubeconfig %s: %w", path, err)
	}
	return rc, nil
}

// newCaretaker builds a caretaker on core and storage; client is the
// clientset behind them when that is a fake one (tests), which cannot
// stream a watch's initial list.
func newCaretaker(core corev1client.CoreV1Interface, storage storagev1client.StorageV1Interface, client any, cfg Config, clk clock.WithTicker) *Caretaker {
	c := &Caretaker{nodes: core.Nodes(), clock: clk, log: cfg.Logger, trouble: map[string]string{}, readTrouble: map[string]string{},
		seen: map[string]map[string]sighting{}, podSeen: map[string]podSighting{}, drivers: map[string]map[string]time.Time{},
		bounds: bounds{staleAfter: cfg.StaleAfter, podGrace: cfg.PodGrace, csiGrace: cfg.CSINodeGrace}}
	if c.bounds.staleAfter <= 0 {
		c.bounds.staleAfter = nodecond.MaxHeartbeatAge
	}
	if c.bounds.podGrace <= 0 {
		c.bounds.podGrace = DefaultPodGrace
	}
	if c.bounds.csiGrace == 0 {
		c.bounds.csiGrace = DefaultCSINodeGrace
	}
	if c.log == nil {
		c.log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	c.queue = workqueue.NewTypedRateLimitingQueueWithConfig(
		workqueue.NewTypedItemExponentialFailureRateLimiter[string](time.Second, 5*time.Minute),
		workqueue.TypedRateLimitingQueueConfig[string]{Clock: clk})
	nodes := core.Nodes()
	c.inf = informer(c, client, "Nodes", "get, list, watch nodes", &corev1.Node{}, nodes.List, nodes.Watch, slim, nil)
	_, _ = c.inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) {
			c.dirty.Store(true)
			c.enqueue(obj)
		},
		UpdateFunc: c.updated,
		DeleteFunc: func(obj any) {
			c.dirty.Store(true)
			c.enqueue(obj)
		},
	})
	if cfg.PlugdSelector != "" {
		pods := core.Pods(cfg.PlugdNamespace)
		selected := func(o metav1.ListOptions) metav1.ListOptions { o.LabelSelector = cfg.PlugdSelector; return o }
		c.pods = informer(c, client, "plugd's pods", "list, watch pods in namespace "+cfg.PlugdNamespace, &corev1.Pod{},
			func(ctx context.Context, o metav1.ListOptions) (*corev1.PodList, error) {
				return pods.List(ctx, selected(o))
			},
			func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
				return pods.Watch(ctx, selected(o))
			},
			slimPod, cache.Indexers{byNode: podNode})
		_, _ = c.pods.AddEventHandler(onAny(func(obj any) {
			if p, ok := podOf(obj); ok && p.Spec.NodeName != "" {
				c.queue.Add(p.Spec.NodeName)
			}
		}))
	}
	if c.bounds.csiGrace > 0 {
		csi := storage.CSINodes()
		c.csiNodes = informer(c, client, "CSINodes", "list, watch csinodes.storage.k8s.io", &storagev1.CSINode{}, csi.List, csi.Watch, slimCSINode, nil)
		_, _ = c.csiNodes.AddEventHandler(onAny(c.enqueue)) // a CSINode is named as its Node
	}
	return c
}

// byNode indexes plugd's pods by the node they run on.
const byNode = "node"

func podNode(obj any) ([]string, error) {
	if p, ok := obj.(*corev1.Pod); ok {
		return []string{p.Spec.NodeName}, nil
	}
	return nil, nil
}

// podOf is the pod obj is, or was (a deletion's last known state).
func podOf(obj any) (*corev1.Pod, bool) {
	if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = t.Obj
	}
	p, ok := obj.(*corev1.Pod)
	return p, ok
}

// onAny calls f with the object of every add, update and delete.
func onAny(f func(obj any)) cache.ResourceEventHandlerFuncs {
	return cache.ResourceEventHandlerFuncs{AddFunc: f, UpdateFunc: func(_, cur any) { f(cur) }, DeleteFunc: f}
}

// informer is c's cache of what list and watch read (what, with the
// permission perm, names it in c's log), each object slimmed by
// transform.
func informer[L runtime.Object](c *Caretaker, client any, what, perm string, obj runtime.Object,
	list func(context.Context, metav1.ListOptions) (L, error), w func(context.Context, metav1.ListOptions) (watch.Interface, error),
	transform cache.TransformFunc, idx cache.Indexers) cache.SharedIndexInformer {
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			// client-go bounds watches, not lists.
			lctx, cancel := context.WithTimeout(ctx, listTimeout)
			defer cancel()
			l, err := list(lctx, o)
			c.noteRead(ctx, what, perm, err)
			return l, err
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			wi, err := w(ctx, o)
			c.noteRead(ctx, what, perm, err)
			return wi, err
		},
	}
	if idx == nil {
		idx = cache.Indexers{}
	}
	inf := cache.NewSharedIndexInformerWithOptions(cache.ToListWatcherWithWatchListSemantics(lw, client), obj,
		cache.SharedIndexInformerOptions{ObjectDescription: what, Indexers: idx})
	_ = inf.SetTransform(transform) // before Run: it cannot fail
	// The reflector retries with backoff; its own handler would log every
	// failure, where the caretaker logs each change of state once.
	_ = inf.SetWatchErrorHandlerWithContext(func(ctx context.Context, _ *cache.Reflector, err error) {
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || apierrors.IsResourceExpired(err) || apierrors.IsGone(err) {
			return // a watch that ended, or must start again from a new list
		}
		c.noteRead(ctx, what, perm, err)
	})
	return inf
}

// updated looks at a Node again when plugd's conditions on it or their
// owner changed (the slim copies differ only then: anything else is no
// news here), and marks the summary dirty when more than heartbeats did:
// a live fleet's heartbeats change every Node every few minutes, and a
// census of 65,000 Nodes takes a second of CPU; the summary's refresh
// every minute counts again anyway, for the conditions that age out.
func (c *Caretaker) updated(old, cur any) {
	o, ok1 := old.(*corev1.Node)
	n, ok2 := cur.(*corev1.Node)
	if !ok1 || !ok2 {
		c.dirty.Store(true)
		c.enqueue(cur)
		return
	}
	if reflect.DeepEqual(o.Status.Conditions, n.Status.Conditions) && reflect.DeepEqual(o.ManagedFields, n.ManagedFields) {
		return
	}
	if !beatsOnly(o, n) {
		c.dirty.Store(true)
	}
	c.enqueue(cur)
}

// beatsOnly says whether the slim Nodes o and n differ only in the times of
// plugd's writes: the conditions' heartbeats and the managedFields' times.
func beatsOnly(o, n *corev1.Node) bool {
	if len(o.Status.Conditions) != len(n.Status.Conditions) || len(o.ManagedFields) != len(n.ManagedFields) {
		return false
	}
	for i, c := range o.Status.Conditions {
		c.LastHeartbeatTime = n.Status.Conditions[i].LastHeartbeatTime
		if !reflect.DeepEqual(c, n.Status.Conditions[i]) {
			return false
		}
	}
	for i, mf := range o.ManagedFields {
		mf.Time = n.ManagedFields[i].Time
		if !reflect.DeepEqual(mf, n.ManagedFields[i]) {
			return false
		}
	}
	return true
}

func (c *Caretaker) enqueue(obj any) {
	if name, err := cache.DeletionHandlingMetaNamespaceKeyFunc(obj); err == nil {
		c.queue.Add(name)
	}
}

// noteRead logs a change in whether the caretaker can read what (with
// the permission perm).
func (c *Caretaker) noteRead(ctx context.Context, what, perm string, err error) {
	if ctx.Err() != nil {
		return
	}
	now := ""
	if err != nil {
		now = explain("list and watch "+what, perm, err)
	}
	c.readMu.Lock()
	was := c.readTrouble[what]
	c.readTrouble[what] = now
	c.readMu.Unlock()
	switch {
	case now == was:
	case now == "":
		c.log.Info("caretaker: reading " + what + " again")
	case what == "Nodes":
		c.log.Warn("caretaker: cannot read Nodes; it retries with backoff, and marks nothing meanwhile", "err", now)
	default:
		c.log.Warn("caretaker: cannot read "+what+"; it retries with backoff, and judges by the other signs meanwhile", "err", now)
	}
}

// explain says what failed and what to do, in words that stay the same
// while the cause does (so a repeat is not logged again).
func explain(op, perm string, err error) string {
	switch {
	case apierrors.IsForbidden(err):
		return fmt.Sprintf("cannot %s: the caretaker lacks the permission %q (the ClusterRole plugd-caretaker, and for pods the Role plugd-caretaker in plugd's namespace, in deploy/kubernetes grant it; are they bound to the caretaker's ServiceAccount?)", op, perm)
	case apierrors.IsUnauthorized(err):
		return fmt.Sprintf("cannot %s: the API server does not accept the caretaker's credentials (an expired or revoked token, a wrong kubeconfig?)", op)
	default:
		return fmt.Sprintf("cannot %s: %s", op, err)
	}
}

// Run watches the Nodes and marks plugd's unmaintained conditions, and
// keeps the fleet summary if it has a namespace, until ctx ends.
func (c *Caretaker) Run(ctx context.Context) error {
	defer c.queue.ShutDown()
	// The pods and CSINodes are signs besides the heartbeat: until their
	// first list, or while they cannot be read, they show nothing, and the
	// Nodes are looked at all the same.
	for _, inf := range []cache.SharedIndexInformer{c.inf, c.pods, c.csiNodes} {
		if inf != nil {
			go inf.RunWithContext(ctx)
		}
	}
	if !cache.WaitForCacheSync(ctx.Done(), c.inf.HasSynced) {
		return nil // stopped before the first list
	}
	if c.summaries != nil {
		var wg sync.WaitGroup
		defer wg.Wait()
		wg.Go(func() { c.summarize(ctx) })
	}
	c.log.Info("caretaker: watching Nodes", "staleAfter", c.bounds.staleAfter, "plugdPods", c.pods != nil, "podGrace", c.bounds.podGrace,
		"csiNodes", c.csiNodes != nil, "csiNodeGrace", c.bounds.csiGrace)
	if c.bounds.staleAfter < nodecond.MaxHeartbeatAge {
		c.log.Warn("caretaker: --stale-after is shorter than plugd's bound; conditions that plugd maintains will be marked between its heartbeats", "staleAfter", c.bounds.staleAfter, "bound", nodecond.MaxHeartbeatAge)
	}
	go func() {
		<-ctx.Done()
		c.queue.ShutDown()
	}()
	for {
		name, shutdown := c.queue.Get()
		if shutdown {
			return nil
		}
		c.sync(ctx, name)
		c.queue.Done(name)
	}
}

// sync looks at one Node: marks its unmaintained conditions, and sets the
// timer for the next of plugd's that can be.
func (c *Caretaker) sync(ctx context.Context, name string) {
	obj, ok, _ := c.inf.GetStore().GetByKey(name)
	n, isNode := obj.(*corev1.Node)
	if !ok || !isNode {
		c.queue.Forget(name)
		delete(c.trouble, name)
		delete(c.seen, name)
		delete(c.podSeen, name)
		delete(c.drivers, name)
		return
	}
	now := c.clock.Now()
	ev := c.evidence(name, now)
	marks, next := look(n, now, c.bounds, c.sightings(name), ev)
	c.log.Debug("caretaker: looked at a Node", "node", name, "conditions", len(n.Status.Conditions), "marks", len(marks), "next", next,
		"podDown", ev.podDown)
	if len(marks) > 0 {
		if err := c.mark(ctx, name, now, ev); err != nil {
			if ctx.Err() != nil {
				return
			}
			msg := explain("patch nodes/status of "+name, "patch nodes/status", err)
			if c.trouble[name] != msg {
				c.log.Warn("caretaker: cannot mark a condition plugd no longer maintains; retrying with backoff", "node", name, "err", msg)
				c.trouble[name] = msg
			}
			c.queue.AddRateLimited(name)
			return
		}
		if _, had := c.trouble[name]; had {
			c.log.Info("caretaker: marking works again", "node", name)
			delete(c.trouble, name)
		}
		// What was written comes back through the watch, and is looked
		// at then.
	}
	c.queue.Forget(name)
	if !next.IsZero() {
		c.queue.AddAfter(name, next.Sub(now))
	}
	if c.looked != nil {
		c.looked(name, next, c.podSeen[name], maps.Clone(c.drivers[name]))
	}
}

// mark reads the Node afresh and marks what is still stale in it, one
// condition a patch, so that one refused leaves the others marked. A
// patch refused because the Node changed between the read and the write
// (its tests failed) is tried again from a new read, at most markTries
// times; the error returned is the last refusal, naming its condition.
func (c *Caretaker) mark(ctx context.Context, name string, now time.Time, ev evidence) error {
	var err error
	for range markTries {
		var n *corev1.Node
		n, err = c.get(ctx, name)
		if apierrors.IsNotFound(err) {
			return nil
		}
		if err != nil {
			return err
		}
		marks, _ := look(n, now, c.bounds, c.sightings(name), ev)
		if len(marks) == 0 {
			return nil // plugd wrote meanwhile, or every mark is made
		}
		err = nil
		again := false
		for _, m := range marks {
			perr := c.markOne(ctx, n, m, now)
			if perr == nil {
				continue
			}
			if ctx.Err() != nil {
				return perr
			}
			err = perr
			// A failed test is 422 Invalid; a conflict the API server
			// could not resolve itself, 409. Both may say the Node moved
			// on: read again. (A policy's refusal is 422 too: it is
			// refused again, markTries times.)
			again = again || apierrors.IsInvalid(perr) || apierrors.IsConflict(perr)
		}
		if err == nil || !again {
			return err
		}
	}
	return err
}

// markOne patches the condition m is about in n (the Node as read) to
// unmaintained, and logs it marked.
func (c *Caretaker) markOne(ctx context.Context, n *corev1.Node, m mark, now time.Time) error {
	was := n.Status.Conditions[m.i]
	patch, err := markPatch(n, m, now)
	if err != nil {
		return err
	}
	pctx, cancel := context.WithTimeoutCause(ctx, requestTimeout, fmt.Errorf("the API server did not answer within %s", requestTimeout))
	defer cancel()
	_, err = c.nodes.Patch(pctx, n.Name, types.JSONPatchType, patch, metav1.PatchOptions{FieldManager: fieldManager}, "status")
	if pctx.Err() != nil && err != nil {
		err = fmt.Errorf("%w (%w)", err, context.Cause(pctx))
	}
	if err != nil {
		return fmt.Errorf("condition %s: %w", was.Type, err)
	}
	c.log.Info("Node condition marked Unknown: plugd has not maintained it", "node", n.Name, "condition", was.Type, "as", m.reason,
		"sign", m.sign, "since", m.since.UTC().Format(time.RFC3339),
		"was", was.Status, "reason", was.Reason,
		"lastHeartbeat", was.LastHeartbeatTime.UTC().Format(time.RFC3339))
	return nil
}

// evidence is what the caretaker has seen, up to now, of the plugd on the
// Node name besides its heartbeats: its pods, the drivers the kubelet
// dropped from its CSINode. A cache not yet filled shows nothing new.
func (c *Caretaker) evidence(name string, now time.Time) evidence {
	if c.pods != nil && c.pods.HasSynced() {
		objs, _ := c.pods.GetIndexer().ByIndex(byNode, name)
		pods := make([]*corev1.Pod, 0, len(objs))
		for _, o := range objs {
			if p, ok := o.(*corev1.Pod); ok {
				pods = append(pods, p)
			}
		}
		c.podSeen[name] = c.podSeen[name].update(pods, now)
	}
	if c.csiNodes != nil && c.csiNodes.HasSynced() {
		var listed []string
		if obj, ok, _ := c.csiNodes.GetStore().GetByKey(name); ok {
			if cn, isCSINode := obj.(*storagev1.CSINode); isCSINode {
				for _, d := range cn.Spec.Drivers {
					listed = append(listed, d.Name)
				}
			}
		}
		if c.drivers[name] == nil {
			c.drivers[name] = map[string]time.Time{}
		}
		updateDrivers(c.drivers[name], listed, now)
	}
	return evidence{podDown: c.podSeen[name].down, driverGone: c.drivers[name]}
}

// sightings is look's record for the Node name.
func (c *Caretaker) sightings(name string) map[string]sighting {
	s := c.seen[name]
	if s == nil {
		s = map[string]sighting{}
		c.seen[name] = s
	}
	return s
}

// get reads the Node whole, with a deadline.
func (c *Caretaker) get(ctx context.Context, name string) (*corev1.Node, error) {
	ctx, cancel := context.WithTimeoutCause(ctx, requestTimeout, fmt.Errorf("the API server did not answer within %s", requestTimeout))
	defer cancel()
	n, err := c.nodes.Get(ctx, name, metav1.GetOptions{})
	if ctx.Err() != nil && err != nil {
		err = fmt.Errorf("%w (%w)", err, context.Cause(ctx))
	}
	return n, err
}
