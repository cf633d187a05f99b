package kubenode

// The walk from a kubelet fact to the Node PATCH, top down, in three
// files: gather.go (Run, and one evaluation's facts: the plugins, the
// API's snapshot, the kubelet's evidence, the clock), decide.go (decide:
// a pure function from the facts and the loop's memory to a plan) and
// act.go (the plan carried out: the writes, events and metrics, and the
// new memory kept).

import (
	"context"
	"maps"
	"math/rand/v2"
	"reflect"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/events"

	"github.com/plugd/plugd/cmd/plugd/internal/kubenode/deviceclass"
	"github.com/plugd/plugd/cmd/plugd/internal/kubenode/kubeletstate"
	"github.com/plugd/plugd/internal/backoff"
)

// Run reads the API server and the kubelet, and keeps the conditions,
// until ctx is done. It returns nil then, once everything it started has
// stopped. It never fails for the API server's or the kubelet's sake:
// trouble is logged, counted, shown as the plugins' kubelet view and by
// Problems, and retried.
func (n *Node) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	for _, s := range n.sources() {
		wg.Go(func() { s.inf.RunWithContext(ctx) })
	}
	wg.Go(func() { n.kubelet.Run(ctx) })
	wg.Go(func() { n.runTaintRules(ctx) })
	bc := events.NewBroadcaster(eventSink{n, &events.EventSinkImpl{Interface: n.events}})
	defer bc.Shutdown()
	if err := bc.StartRecordingToSinkWithContext(ctx); err != nil {
		n.log.Warn("Kubernetes events will not be recorded", "err", err)
	}
	l := newLoop(n, bc.NewRecorder(n.scheme, "plugd"))
	n.log.Info("Kubernetes: watching this node's objects", "node", n.cfg.NodeName, "expected", len(n.cfg.Expect), "kubelet", n.cfg.Kubelet.Address)

	timer := n.clock.NewTimer(0)
	defer timer.Stop()
	var last time.Time
	for {
		select {
		case <-ctx.Done():
			cancel()
			wg.Wait()
			return nil
		case <-n.kick:
			if gap := n.clock.Since(last); gap < minEvalGap {
				timer.Reset(minEvalGap - gap)
				continue
			}
		case <-timer.C():
		}
		now := n.clock.Now()
		last = now
		next := l.evaluate(ctx, now)
		wait := localResync
		if !next.IsZero() {
			wait = min(wait, max(next.Sub(now), minEvalGap))
		}
		timer.Reset(wait)
	}
}

// loop is Run's state between evaluations; only Run's goroutine uses it.
type loop struct {
	n   *Node
	rec events.EventRecorder
	pol policy
	// mem is what decide keeps from one evaluation to the next (decide.go).
	mem memory
	// said is what each CSI driver last said of itself (gather's: a
	// registrar the kubelet refused exits, and its socket says nothing
	// more); cache the last views and what they were made of.
	said  map[key]remembered
	cache viewCache
	// writeDelay is the backoff of writes after a failure, reset by a
	// success; nextWrite is when the next may be made (act's).
	writeDelay backoff.Backoff
	nextWrite  time.Time
	// wrote is the Node as plugd's last write of its conditions in this
	// act returned it (nil: none yet).
	wrote *corev1.Node
	// taintsWrote are the taints written in this act, by rule: on the
	// Node now (put back) or not (removed).
	taintsWrote map[string]bool
	// classes keeps the DeviceClasses' compiled selectors.
	classes deviceclass.Matcher
}

func newLoop(n *Node, rec events.EventRecorder) *loop {
	return &loop{n: n, rec: rec, pol: policyOf(n), mem: newMemory(), said: map[key]remembered{},
		writeDelay: backoff.New(writeBackoffMin, writeBackoffMax, writeJitter)}
}

// policyOf is the configuration of n that decide reads.
func policyOf(n *Node) policy {
	return policy{expect: n.cfg.Expect, registryDir: n.cfg.RegistryDir, heartbeat: n.heartbeat, grace: n.grace,
		taints: n.taints, window: n.window, nodeName: n.cfg.NodeName, republishGrace: republishGrace}
}

// evaluate compares the plugins with the kubelet's and the API's view,
// publishes the kubelet views, and writes what changed: gather, decide,
// act. It returns when it wants to run again (zero: no need before the
// next change).
func (l *loop) evaluate(ctx context.Context, now time.Time) time.Time {
	f := l.gather(now)
	p := decide(l.pol, f, l.mem)
	return l.act(ctx, f, p)
}

// gather reads what one evaluation is made of: the manager's plugins, the
// informers' snapshot, the kubelet's evidence, and the views of each
// plugin that they make.
func (l *loop) gather(now time.Time) facts {
	n := l.n
	socks, unasked := l.sockets()
	l.remember(socks)
	// seq is the Node updates delivered before the snapshot: one delivered
	// while it is read may be in it or not, and counts as not yet seen.
	snap := n.snapshot()
	ev := n.kubeletEvidence()
	kf := kubeletFactsOf(ev, n.cfg.Kubelet.Address, socks)
	views, stale, more := l.views(socks, snap, kf, ev)
	return facts{now: now, socks: socks, unasked: unasked, node: snap.node, readable: snap.nodeProblem == nil && snap.node != nil,
		seq: snap.seq[0], kubelet: kf, evidence: ev, views: views, stale: stale, more: more,
		localChanges: n.localChanges.Load(), jitter: rand.Float64()}
}

// sockets are the manager's plugins by their (type, name), each expected
// one there (nil without a socket). unasked: the directory not walked yet,
// or a socket found whose plugin has not said who it is. Any expected
// plugin without a socket may be behind it, so none is called missing
// until it has answered (or failed to, within the manager's deadlines).
func (l *loop) sockets() (map[key][]Socket, bool) {
	n := l.n
	socks := map[key][]Socket{}
	unasked := !closed(n.cfg.Scanned)
	for _, p := range n.cfg.Sockets() {
		if p.Type != "" && p.Name != "" {
			k := key{p.Type, p.Name}
			socks[k] = append(socks[k], p)
		} else if p.Unsettled {
			unasked = true
		}
	}
	for _, e := range expectedPlugins(n.cfg.Expect) {
		if k := (key{e.Type, e.Name}); socks[k] == nil {
			socks[k] = nil
		}
	}
	return socks, unasked
}

// remember keeps what each CSI driver last said of itself.
func (l *loop) remember(socks map[key][]Socket) {
	for k, ps := range socks {
		if k.typ != TypeCSI {
			continue
		}
		for _, p := range ps {
			if id, topology := p.nodeInfo(); id != "" || len(topology) > 0 {
				l.said[k] = remembered{nodeID: id, topology: topology}
			}
		}
	}
}

// viewCache is the views of an evaluation and what they were made of.
type viewCache struct {
	in    viewInputs
	socks map[key][]Socket
	said  map[key]remembered
	views map[key]view
	stale []staleEntry
	more  int
}

// viewInputs counts the informers' deliveries and the kubelet's reads
// before a snapshot: the same counts, the same objects. (A delivery while
// the snapshot is read counts at the next evaluation, which then builds
// the views again.)
type viewInputs struct {
	node, csiNode, slices uint64
	problems              [5]string // the Node's, CSINode's, slices', DeviceTaintRules', DeviceClasses' reads
	kubelet               uint64
}

// views are the kubelet views of the plugins and CSINode's stale entries.
// When the sockets, the API objects and the kubelet's reads are those of
// the last evaluation, they are its views: the texts of a quiet node are
// not built again at every resync (with thousands of CSINode entries,
// hundreds of kilobytes every 5 seconds).
func (l *loop) views(socks map[key][]Socket, snap snapshot, kf kubeletFacts, ev kubeletstate.Evidence) (map[key]view, []staleEntry, int) {
	in := viewInputs{node: snap.seq[0], csiNode: snap.seq[1], slices: snap.seq[2], kubelet: ev.Reads}
	for i, p := range []*Problem{snap.nodeProblem, snap.csiProblem, snap.sliceProblem, snap.taintRuleProblem, snap.classProblem} {
		if p != nil {
			in.problems[i] = p.Reason + ": " + p.Message
		}
	}
	c := &l.cache
	if c.views != nil && c.in == in && reflect.DeepEqual(c.socks, socks) && reflect.DeepEqual(c.said, l.said) {
		return c.views, c.stale, c.more
	}
	views := make(map[key]view, len(socks))
	for k, ps := range socks {
		views[k] = kubeletView(k, ps, snap, kf, l.said[k])
	}
	for driver, names := range classNames(l.pol.expect) {
		k := key{TypeDRA, driver}
		if v, ok := views[k]; ok {
			views[k] = matchClasses(&l.classes, driver, names, v, snap.classes, snap.classProblem)
		}
	}
	stale, more := staleEntries(snap, socks, kf, ev)
	*c = viewCache{in: in, socks: socks, said: maps.Clone(l.said), views: views, stale: stale, more: more}
	return views, stale, more
}

// closed says c is closed; a nil c counts as closed.
func closed(c <-chan struct{}) bool {
	if c == nil {
		return true
	}
	select {
	case <-c:
		return true
	default:
		return false
	}
}
