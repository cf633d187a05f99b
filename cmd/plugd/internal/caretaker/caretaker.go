// Package caretaker marks the Node conditions that plugd wrote and no
// longer maintains: plugd rewrites its conditions at least every 5 minutes
// (their lastHeartbeatTime), so one whose heartbeat the caretaker has not
// seen change for nodecond.MaxHeartbeatAge, on its own clock, is left from
// a plugd that no longer runs (the heartbeat's value is the node's clock,
// and is only compared). Its
// status says nothing of now, and node-readiness-controller reads the
// status only: the caretaker sets it to Unknown, reason NotMaintained, as
// the node lifecycle controller does for the kubelet's Ready.
//
// One caretaker serves a cluster: it watches every Node (keeping only
// plugd's conditions of each) and looks at a Node again when the first of
// plugd's conditions on it can go stale, with a timer, not by polling. It
// writes only a condition that is stale, with a JSON patch that tests the
// heartbeat it read is still there, so a plugd that wrote meanwhile wins,
// and two caretakers are safe, only redundant: no leader election.
package caretaker

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"reflect"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
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
	// Logger gets what the caretaker does and its trouble (nil: discarded).
	Logger *slog.Logger
	// SummaryNamespace is the namespace of the ConfigMap
	// nodecond.SummaryName where the caretaker keeps the cluster view for
	// kubectl plugd cluster (empty: it writes none).
	SummaryNamespace string
}

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
	nodes      corev1client.NodeInterface
	staleAfter time.Duration
	clock      clock.WithTicker
	log        *slog.Logger
	inf        cache.SharedIndexInformer
	queue      workqueue.TypedRateLimitingInterface[string]

	// trouble is, by Node name, the last failure to mark one of its
	// conditions, so each is logged once; only the worker touches it.
	trouble map[string]string
	// seen is, by Node name, look's record of when the caretaker saw each
	// of plugd's heartbeats there change; only the worker touches it.
	seen map[string]map[string]sighting
	// readTrouble is the informer's, logged on change.
	readMu      sync.Mutex
	readTrouble string // guarded by readMu
	// looked, if set (tests), is told each Node looked at and when it is
	// due a look again.
	looked func(name string, next time.Time)

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
	c := newCaretaker(core.Nodes(), nil, cfg, clock.RealClock{})
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

// newCaretaker builds a caretaker on nodes; client is the clientset behind
// it when that is a fake one (tests), which cannot stream a watch's
// initial list.
func newCaretaker(nodes corev1client.NodeInterface, client any, cfg Config, clk clock.WithTicker) *Caretaker {
	c := &Caretaker{nodes: nodes, staleAfter: cfg.StaleAfter, clock: clk, log: cfg.Logger, trouble: map[string]string{}, seen: map[string]map[string]sighting{}}
	if c.staleAfter <= 0 {
		c.staleAfter = nodecond.MaxHeartbeatAge
	}
	if c.log == nil {
		c.log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	c.queue = workqueue.NewTypedRateLimitingQueueWithConfig(
		workqueue.NewTypedItemExponentialFailureRateLimiter[string](time.Second, 5*time.Minute),
		workqueue.TypedRateLimitingQueueConfig[string]{Clock: clk})
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			// client-go bounds watches, not lists.
			lctx, cancel := context.WithTimeout(ctx, listTimeout)
			defer cancel()
			l, err := nodes.List(lctx, o)
			c.noteRead(ctx, err)
			return l, err
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			w, err := nodes.Watch(ctx, o)
			c.noteRead(ctx, err)
			return w, err
		},
	}
	c.inf = cache.NewSharedIndexInformerWithOptions(cache.ToListWatcherWithWatchListSemantics(lw, client), &corev1.Node{},
		cache.SharedIndexInformerOptions{ObjectDescription: "Nodes"})
	_ = c.inf.SetTransform(slim) // before Run: it cannot fail
	// The reflector retries with backoff; its own handler would log every
	// failure, where the caretaker logs each change of state once.
	_ = c.inf.SetWatchErrorHandlerWithContext(func(ctx context.Context, _ *cache.Reflector, err error) {
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || apierrors.IsResourceExpired(err) || apierrors.IsGone(err) {
			return // a watch that ended, or must start again from a new list
		}
		c.noteRead(ctx, err)
	})
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
	return c
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

// noteRead logs a change in whether the caretaker can read the Nodes.
func (c *Caretaker) noteRead(ctx context.Context, err error) {
	if ctx.Err() != nil {
		return
	}
	now := ""
	if err != nil {
		now = explain("list and watch nodes", "get, list, watch nodes", err)
	}
	c.readMu.Lock()
	was := c.readTrouble
	c.readTrouble = now
	c.readMu.Unlock()
	switch {
	case now == was:
	case now == "":
		c.log.Info("caretaker: reading Nodes again")
	default:
		c.log.Warn("caretaker: cannot read Nodes; it retries with backoff, and marks nothing meanwhile", "err", now)
	}
}

// explain says what failed and what to do, in words that stay the same
// while the cause does (so a repeat is not logged again).
func explain(op, perm string, err error) string {
	switch {
	case apierrors.IsForbidden(err):
		return fmt.Sprintf("cannot %s: the caretaker lacks the permission %q (the ClusterRole plugd-caretaker in deploy/kubernetes grants it; is it bound to the caretaker's ServiceAccount?)", op, perm)
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
	go c.inf.RunWithContext(ctx)
	if !cache.WaitForCacheSync(ctx.Done(), c.inf.HasSynced) {
		return nil // stopped before the first list
	}
	if c.summaries != nil {
		var wg sync.WaitGroup
		defer wg.Wait()
		wg.Go(func() { c.summarize(ctx) })
	}
	c.log.Info("caretaker: watching Nodes", "staleAfter", c.staleAfter)
	if c.staleAfter < nodecond.MaxHeartbeatAge {
		c.log.Warn("caretaker: --stale-after is shorter than plugd's bound; conditions that plugd maintains will be marked between its heartbeats", "staleAfter", c.staleAfter, "bound", nodecond.MaxHeartbeatAge)
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

// sync looks at one Node: marks its stale conditions, and sets the timer
// for the next of plugd's to go stale.
func (c *Caretaker) sync(ctx context.Context, name string) {
	obj, ok, _ := c.inf.GetStore().GetByKey(name)
	n, isNode := obj.(*corev1.Node)
	if !ok || !isNode {
		c.queue.Forget(name)
		delete(c.trouble, name)
		delete(c.seen, name)
		return
	}
	now := c.clock.Now()
	stale, next := look(n, now, c.staleAfter, c.sightings(name))
	c.log.Debug("caretaker: looked at a Node", "node", name, "conditions", len(n.Status.Conditions), "stale", len(stale), "next", next)
	if len(stale) > 0 {
		if err := c.mark(ctx, name, now); err != nil {
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
		c.looked(name, next)
	}
}

// mark reads the Node afresh and marks what is still stale in it, one
// condition a patch, so that one refused leaves the others marked. A
// patch refused because the Node changed between the read and the write
// (its tests failed) is tried again from a new read, at most markTries
// times; the error returned is the last refusal, naming its condition.
func (c *Caretaker) mark(ctx context.Context, name string, now time.Time) error {
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
		seen := c.sightings(name)
		stale, _ := look(n, now, c.staleAfter, seen)
		if len(stale) == 0 {
			return nil // plugd wrote meanwhile, or every mark is made
		}
		err = nil
		again := false
		for _, i := range stale {
			perr := c.markOne(ctx, n, i, now, seen)
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

// markOne patches the condition at index i of n (the Node as read) to
// unmaintained, and logs it marked.
func (c *Caretaker) markOne(ctx context.Context, n *corev1.Node, i int, now time.Time, seen map[string]sighting) error {
	was := n.Status.Conditions[i]
	patch, err := markPatch(n, i, now, seen)
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
	c.log.Info("Node condition marked Unknown: plugd has not maintained it", "node", n.Name, "condition", was.Type,
		"was", was.Status, "reason", was.Reason, "unchangedSince", seen[string(was.Type)].at.UTC().Format(time.RFC3339),
		"lastHeartbeat", was.LastHeartbeatTime.UTC().Format(time.RFC3339))
	return nil
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
