package kubenode

import (
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/plugd/plugd/api"
	"github.com/plugd/plugd/cmd/plugd/internal/kubenode/kubeletstate"
	"github.com/plugd/plugd/internal/nodecond"
)

// The cases of decide's table, taken from test/kube's truth scenarios
// (truth_test.go, kubelet_test.go, seen_test.go), with the facts as the
// real kubelet and API server show them at one moment.
var (
	t0      = time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	started = t0.Add(-time.Hour) // the kubelet's start
	csiExp  = Expectation{Type: TypeCSI, Name: "csi.example.com", Condition: csiCond}
	gpuExp  = Expectation{Type: TypeDevice, Name: "vendor.example/gpu", Condition: "vendor.example/gpu-DevicePluginReady", MinHealthyDevices: 2}
	draExp  = Expectation{Type: TypeDRA, Name: "gpu.example.com", Condition: "gpu.example.com/DRAPluginReady"}
	csiSock = Socket{Path: "/r/csi.sock", Type: TypeCSI, Name: "csi.example.com", State: "Answering", Answering: true, Created: started, Details: csiSaid("node-a")}
	gpuSock = Socket{Path: "/r/gpu.sock", Type: TypeDevice, Name: "vendor.example/gpu", State: "Answering", Answering: true, Created: started}
	draSock = Socket{Path: "/r/dra.sock", Type: TypeDRA, Name: "gpu.example.com", State: "Answering", Answering: true, Created: started}
)

// world is what one case's facts are made of: the expectations, the
// sockets, the Node (its conditions, labels, taints), CSINode and
// ResourceSlices, and the kubelet's reads (reads, in order, each a
// reading or a failure).
type world struct {
	expect  []Expectation
	socks   []Socket
	conds   []corev1.NodeCondition
	labels  map[string]string
	taints  []corev1.Taint
	csi     []storagev1.CSINodeDriver
	slices  []string // the drivers of the ResourceSlices, each a complete pool of one device
	pools   []*resourcev1.ResourceSlice
	reads   []kubeletRead
	outage  bool     // the Node cannot be read (the API server away)
	unasked bool     // a socket may be an expected plugin's, not asked yet
	managed []string // the condition types plugd's managedFields hold
	changes uint64
}

// kubeletRead is one read of the kubelet: at, a reading of a kubelet
// started at started holding registered (and seen: the same, unless
// seen says more), or problem.
type kubeletRead struct {
	at           time.Time
	started      time.Time
	registered   []string
	seen         []string
	devices      map[string]int
	problem      string
	renamedGauge bool
}

// facts are what gather would make of w at now.
func (w world) facts(now time.Time) facts {
	socks := map[key][]Socket{}
	for _, e := range expectedPlugins(w.expect) {
		socks[key{e.Type, e.Name}] = nil
	}
	said := map[key]remembered{}
	for _, p := range w.socks {
		k := key{p.Type, p.Name}
		socks[k] = append(socks[k], p)
		if id, topo := p.nodeInfo(); id != "" {
			said[k] = remembered{nodeID: id, topology: topo}
		}
	}
	nd := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-a", Labels: w.labels}, Spec: corev1.NodeSpec{Taints: w.taints},
		Status: corev1.NodeStatus{Conditions: w.conds}}
	if len(w.managed) > 0 {
		var fs []string
		for _, typ := range w.managed {
			fs = append(fs, fmt.Sprintf(`"k:{\"type\":\"%s\"}":{}`, typ))
		}
		nd.ManagedFields = []metav1.ManagedFieldsEntry{{Manager: fieldManager, Operation: metav1.ManagedFieldsOperationUpdate, Subresource: "status", FieldsType: "FieldsV1",
			FieldsV1: &metav1.FieldsV1{Raw: []byte(`{"f:status":{"f:conditions":{` + strings.Join(fs, ",") + `}}}`)}}}
	}
	snap := snapshot{nodeName: "node-a", node: nd, csiNode: csiNode(w.csi...), seq: [3]uint64{1, 1, 1}}
	for i, d := range w.slices {
		snap.slices = append(snap.slices, resourceSlice(d, fmt.Sprintf("pool-%d", i), 1, 1, "dev"))
	}
	snap.slices = append(snap.slices, w.pools...)
	if w.outage {
		snap.nodeProblem = &Problem{Reason: ReasonAPIUnavailable, Message: "connection refused"}
	}
	ev := w.evidence()
	kf := kubeletFactsOf(ev, "10.0.0.1:10250", socks)
	views := map[key]view{}
	for k, ps := range socks {
		views[k] = kubeletView(k, ps, snap, kf, said[k])
	}
	stale, more := staleEntries(snap, socks, kf, ev)
	return facts{now: now, socks: socks, unasked: w.unasked, node: nd, readable: !w.outage, seq: 1, kubelet: kf, evidence: ev,
		views: views, stale: stale, more: more, localChanges: w.changes, jitter: 0.5}
}

// evidence is what the kubelet's reads of w showed.
func (w world) evidence() kubeletstate.Evidence {
	var rec kubeletstate.Record
	var devicesAt time.Time
	for _, r := range w.reads {
		if r.problem != "" {
			rec.Failed(&kubeletstate.Problem{Reason: r.problem, Message: "the kubelet: " + r.problem, Since: r.at}, "")
			continue
		}
		rd := kubeletstate.Reading{At: r.at, Started: r.started, Registered: map[string]bool{}, Seen: map[string]bool{}, PluginMetric: !r.renamedGauge, Devices: r.devices}
		for _, p := range r.registered {
			rd.Registered[p], rd.Seen[p] = true, true
		}
		for _, p := range r.seen {
			rd.Seen[p] = true
		}
		if r.devices != nil {
			devicesAt = r.at
		}
		rec.Read(rd)
	}
	ev := rec.Evidence()
	ev.DevicesAt = devicesAt
	return ev
}

// resourceSlice is a slice of driver's pool at generation gen, one of
// count, with devices of the names given.
func resourceSlice(driver, pool string, gen, count int64, devices ...string) *resourcev1.ResourceSlice {
	s := &resourcev1.ResourceSlice{Spec: resourcev1.ResourceSliceSpec{Driver: driver, NodeName: new("node-a"),
		Pool: resourcev1.ResourcePool{Name: pool, Generation: gen, ResourceSliceCount: count}}}
	for _, d := range devices {
		s.Spec.Devices = append(s.Spec.Devices, resourcev1.Device{Name: d})
	}
	return s
}

// tainted is sl with a taint key:effect on each of its devices.
func tainted(sl *resourcev1.ResourceSlice, key string, effect resourcev1.DeviceTaintEffect) *resourcev1.ResourceSlice {
	sl = sl.DeepCopy()
	for i := range sl.Spec.Devices {
		sl.Spec.Devices[i].Taints = append(sl.Spec.Devices[i].Taints, resourcev1.DeviceTaint{Key: key, Effect: effect})
	}
	return sl
}

// cond is plugd's condition of e on the Node: status/reason, written
// (heartbeat) at beat, turned to its status at since.
func cond(e Expectation, status corev1.ConditionStatus, reason, message string, beat, since time.Time) corev1.NodeCondition {
	return corev1.NodeCondition{Type: corev1.NodeConditionType(e.Condition), Status: status, Reason: reason, Message: message,
		LastHeartbeatTime: metav1.NewTime(beat), LastTransitionTime: metav1.NewTime(since)}
}

// verdictOf is the condition decide wants for e in w at now, as plugd
// writes it (so that a case can put it on the Node).
func verdictOf(w world, e Expectation, at time.Time) corev1.NodeCondition {
	p := decide(testPolicy(w), w.facts(at), newMemory())
	for _, s := range p.states {
		if s.Expectation.Condition == e.Condition && s.Want != nil {
			return *s.Want
		}
	}
	panic("no verdict for " + e.Condition)
}

func testPolicy(w world) policy {
	rules, err := taintRules(w.expect, "example.com/plugins-not-ready:NoSchedule")
	if err != nil {
		panic(err)
	}
	return policy{expect: w.expect, registryDir: "/r", heartbeat: 5 * time.Minute, grace: time.Minute,
		taints: rules, window: defaultStartupWindow, nodeName: "node-a", republishGrace: republishGrace}
}

// decideCase is one row: the world, the memory before (from decide on the
// same world before, at prior, when set; and mem's changes), and the plan
// wanted.
type decideCase struct {
	name  string
	w     world
	prior []time.Duration // decide on w at now-d, in order, each plan's memory kept
	mem   func(*memory)
	// want is each expectation's wanted condition, "Status/Reason" ("" for
	// none: plugd cannot tell); set and drop what is written; notes and
	// tell the events' reasons (once written, now).
	want  []string
	set   []string
	notes []string
	tell  []string
	taint bool
	// next, wantMetrics and wantDevices are after now (-1: zero).
	next, wantMetrics, wantDevices time.Duration
	check                          func(t *testing.T, p plan)
}

func TestDecide(t *testing.T) {
	now := t0
	held := world{expect: []Expectation{csiExp}, socks: []Socket{csiSock}, csi: []storagev1.CSINodeDriver{{Name: "csi.example.com", NodeID: "node-a"}},
		reads: []kubeletRead{{at: now.Add(-time.Second), started: started, registered: []string{"/r/csi.sock"}}}}
	trueCond := verdictOf(held, csiExp, now)
	onNode := func(w world, c corev1.NodeCondition, beat time.Time) world {
		c.LastHeartbeatTime, c.LastTransitionTime = metav1.NewTime(beat), metav1.NewTime(beat)
		w.conds = []corev1.NodeCondition{c}
		return w
	}
	ready := onNode(held, trueCond, now.Add(-time.Minute))
	with := func(w world, f func(*world)) world {
		w.socks, w.reads, w.conds = slices.Clone(w.socks), slices.Clone(w.reads), slices.Clone(w.conds)
		w.pools, w.expect = slices.Clone(w.pools), slices.Clone(w.expect)
		f(&w)
		return w
	}
	draHeld := world{expect: []Expectation{draExp}, socks: []Socket{draSock},
		reads: []kubeletRead{{at: now.Add(-time.Second), started: started, registered: []string{"/r/dra.sock"}}}}
	draReady := with(draHeld, func(w *world) { w.pools = draPool(1, 3) })
	draReady = onNode(draReady, verdictOf(draReady, draExp, now), now.Add(-time.Minute))
	cases := []decideCase{
		{name: "start: the kubelet holds the plugin", w: held,
			want: []string{"True/PluginReady"}, set: []string{"True/PluginReady"}, notes: []string{"PluginReady"}, next: -1, wantMetrics: -1, wantDevices: -1},
		{name: "start: the socket answers, the kubelet has not taken it up yet",
			w:    with(held, func(w *world) { w.reads[0].registered = nil }),
			want: []string{"False/KubeletNotRegistered"}, set: []string{"False/KubeletNotRegistered"},
			next: fastFor, wantMetrics: unsettledFast - time.Second, wantDevices: -1},
		{name: "a rolling restart of plugd: the directory not walked yet leaves True alone",
			w:    with(ready, func(w *world) { w.socks, w.unasked = nil, true }),
			want: []string{""}, next: 4 * time.Minute, wantMetrics: -1, wantDevices: -1},
		{name: "nothing changed: nothing written, the heartbeat next",
			w: ready, want: []string{"True/PluginReady"}, next: 4 * time.Minute, wantMetrics: -1, wantDevices: -1},
		{name: "heartbeat due: the condition written again",
			w: onNode(held, trueCond, now.Add(-5*time.Minute)), want: []string{"True/PluginReady"}, set: []string{"True/PluginReady"},
			next: 0, wantMetrics: -1, wantDevices: -1,
			check: func(t *testing.T, p plan) {
				if !p.beat || !p.set[0].LastTransitionTime.Time.Equal(now.Add(-5*time.Minute)) {
					t.Errorf("a heartbeat moves the transition time: beat %v, %+v", p.beat, p.set[0])
				}
			}},
		{name: "the kubelet stopped: False at once",
			w:    with(ready, func(w *world) { w.reads = append(w.reads, kubeletRead{at: now, problem: ReasonKubeletNotRunning}) }),
			want: []string{"False/KubeletNotRegistered"}, set: []string{"False/KubeletNotRegistered"}, notes: []string{"PluginNotReady"},
			next: time.Minute, wantMetrics: -1, wantDevices: -1}, // the disagreement's grace
		{name: "the kubelet restarted, not registered yet: the reason held, fast reads",
			w: with(ready, func(w *world) {
				w.reads = append(w.reads, kubeletRead{at: now.Add(-5 * time.Second), problem: ReasonKubeletNotRunning},
					kubeletRead{at: now, started: now.Add(-time.Second)})
				w.conds = []corev1.NodeCondition{cond(csiExp, corev1.ConditionFalse, ReasonKubeletNotRegistered, "not running", now.Add(-5*time.Second), now.Add(-5*time.Second))}
			}),
			want: []string{"False/KubeletNotRegistered"}, next: coalesce, wantMetrics: unsettledFast, wantDevices: -1,
			check: func(t *testing.T, p plan) {
				if !strings.Contains(p.states[0].Want.Message, "restarted") || p.mem.held[csiCond] == nil {
					t.Errorf("the new reason not held: %+v", p.mem.held)
				}
			}},
		{name: "the kubelet restarted and holds the plugin again: True",
			w: with(ready, func(w *world) {
				w.reads = append(w.reads, kubeletRead{at: now.Add(-5 * time.Second), problem: ReasonKubeletNotRunning},
					kubeletRead{at: now, started: now.Add(-time.Second), registered: []string{"/r/csi.sock"}})
				w.conds = []corev1.NodeCondition{cond(csiExp, corev1.ConditionFalse, ReasonKubeletNotRegistered, "not running", now.Add(-5*time.Second), now.Add(-5*time.Second))}
			}),
			want: []string{"True/PluginReady"}, set: []string{"True/PluginReady"}, notes: []string{"PluginReady"}, next: 5*time.Minute - 5*time.Second, wantMetrics: -1, wantDevices: -1,
			check: func(t *testing.T, p plan) {
				if len(p.observed) != 2 || p.observed[0].kind != observedAfterStart || p.observed[0].seconds != 1 || p.observed[1].kind != observedNotReady {
					t.Errorf("observed %+v", p.observed)
				}
			}},
		{name: "registrar SIGKILL: its socket left, dead",
			w:    with(ready, func(w *world) { w.socks[0].Answering, w.socks[0].State = false, "NotAnswering" }),
			want: []string{"False/NotAnswering"}, set: []string{"False/NotAnswering"}, notes: []string{"PluginNotReady"},
			next: fastFor, wantMetrics: unsettledFast - time.Second, wantDevices: -1},
		{name: "registrar started again: the kubelet's registration is the old socket's",
			w: with(ready, func(w *world) {
				w.socks[0].Created = now.Add(-500 * time.Millisecond)
				w.conds = []corev1.NodeCondition{cond(csiExp, corev1.ConditionFalse, ReasonNotAnswering, "dead", now.Add(-time.Second), now.Add(-time.Second))}
			}),
			want: []string{"False/KubeletNotRegistered"}, next: coalesce, wantMetrics: unsettledFast - time.Second, wantDevices: -1},
		{name: "a new reason held for coalesce is written",
			w: with(ready, func(w *world) {
				w.socks[0].Created = now.Add(-500 * time.Millisecond)
				w.conds = []corev1.NodeCondition{cond(csiExp, corev1.ConditionFalse, ReasonNotAnswering, "dead", now.Add(-time.Second), now.Add(-time.Second))}
			}),
			prior: []time.Duration{coalesce}, want: []string{"False/KubeletNotRegistered"}, set: []string{"False/KubeletNotRegistered"},
			next: fastFor - coalesce, wantMetrics: unsettledFast - time.Second, wantDevices: -1},
		{name: "the kubelet dropped and registered the path again: True",
			w: with(ready, func(w *world) {
				w.socks[0].Created = now.Add(-time.Second)
				w.reads = []kubeletRead{{at: now.Add(-2 * time.Second), started: started, seen: []string{"/r/csi.sock"}}, // refused, retrying
					{at: now.Add(-750 * time.Millisecond), started: started, registered: []string{"/r/csi.sock"}}, // the old retry, against the new socket
					{at: now.Add(-500 * time.Millisecond), started: started, seen: []string{"/r/csi.sock"}},       // dropped...
					{at: now, started: started, registered: []string{"/r/csi.sock"}}}                              // ...and registered again
				w.conds = []corev1.NodeCondition{cond(csiExp, corev1.ConditionFalse, ReasonKubeletNotRegistered, "refused", now.Add(-time.Minute), now.Add(-time.Minute))}
			}),
			want: []string{"True/PluginReady"}, set: []string{"True/PluginReady"}, notes: []string{"PluginReady"}, next: 4 * time.Minute, wantMetrics: -1, wantDevices: -1},
		{name: "the kubelet drops the path it registered, to register it again: True held for its pass",
			w:    with(ready, reregister(now.Add(-500*time.Millisecond))),
			want: []string{"True/PluginReady"}, next: 4 * time.Minute, wantMetrics: unsettledFast, wantDevices: -1},
		{name: "the kubelet drops the path it registered, and not back within its pass: False",
			w:    with(ready, reregister(now.Add(-kubeletstate.Settle))),
			want: []string{"False/KubeletNotRegistered"}, set: []string{"False/KubeletNotRegistered"}, notes: []string{"PluginNotReady"},
			next: fastFor, wantMetrics: unsettledFast, wantDevices: -1},
		{name: "the kubelet has seen the socket and refuses it: SeenNotRegistered, told after the grace",
			w: with(held, func(w *world) {
				w.csi = nil
				w.reads = []kubeletRead{{at: now, started: started, seen: []string{"/r/csi.sock"}}}
				w.conds = []corev1.NodeCondition{cond(csiExp, corev1.ConditionFalse, ReasonKubeletNotRegistered, "refused", now.Add(-time.Minute), now.Add(-time.Minute))}
			}),
			prior: []time.Duration{time.Minute}, want: []string{"False/KubeletNotRegistered"}, set: []string{"False/KubeletNotRegistered"},
			tell: []string{"KubeletDisagrees"}, next: 4 * time.Minute, wantMetrics: -1, wantDevices: -1,
			check: func(t *testing.T, p plan) {
				if v := p.states[0].Want; !strings.Contains(v.Message, "has seen /r/csi.sock and not registered it") {
					t.Errorf("message %q", v.Message)
				}
			}},
		{name: "device plugin health: too few healthy devices, pod-resources every second",
			w: world{expect: []Expectation{gpuExp}, socks: []Socket{gpuSock},
				reads: []kubeletRead{{at: now.Add(-time.Minute), started: started, registered: []string{"/r/gpu.sock"}, devices: map[string]int{"vendor.example/gpu": 1}}}},
			want: []string{"False/NoHealthyDevices"}, set: []string{"False/NoHealthyDevices"},
			next: -1, wantMetrics: -1, wantDevices: -time.Minute + devicesPoll},
		{name: "device plugin health regained: True",
			w: world{expect: []Expectation{gpuExp}, socks: []Socket{gpuSock},
				conds: []corev1.NodeCondition{cond(gpuExp, corev1.ConditionFalse, ReasonNoHealthyDevices, "1 healthy", now.Add(-time.Minute), now.Add(-time.Minute))},
				reads: []kubeletRead{{at: now, started: started, registered: []string{"/r/gpu.sock"}, devices: map[string]int{"vendor.example/gpu": 2}}}},
			want: []string{"True/PluginReady"}, set: []string{"True/PluginReady"}, notes: []string{"PluginReady"}, next: 4 * time.Minute, wantMetrics: -1, wantDevices: -1},
		{name: "DRA registration: the kubelet holds the driver",
			w: world{expect: []Expectation{draExp}, socks: []Socket{draSock}, slices: []string{"gpu.example.com"},
				reads: []kubeletRead{{at: now, started: started, registered: []string{"/r/dra.sock"}}}},
			want: []string{"True/PluginReady"}, set: []string{"True/PluginReady"}, notes: []string{"PluginReady"}, next: -1, wantMetrics: -1, wantDevices: -1},
		{name: "DRA registration: its slices are no registration",
			w: world{expect: []Expectation{draExp}, socks: []Socket{draSock}, slices: []string{"gpu.example.com"},
				reads: []kubeletRead{{at: now, started: started}}},
			want: []string{"False/KubeletNotRegistered"}, set: []string{"False/KubeletNotRegistered"}, next: fastFor, wantMetrics: unsettledFast, wantDevices: -1},
		{name: "DRA registration inferred: the kubelet forbids, the driver's slices exist",
			w: world{expect: []Expectation{draExp}, socks: []Socket{draSock}, slices: []string{"gpu.example.com"},
				reads: []kubeletRead{{at: now, problem: ReasonKubeletForbidden}}},
			want: []string{"True/Inferred"}, set: []string{"True/Inferred"}, notes: []string{"PluginReady"}, next: -1, wantMetrics: -1, wantDevices: -1},
		{name: "DRA published: a pool lacks a slice: PoolIncomplete, naming it",
			w: with(draHeld, func(w *world) {
				w.pools = []*resourcev1.ResourceSlice{resourceSlice(draExp.Name, "gpus", 1, 3, "gpu-0"), resourceSlice(draExp.Name, "gpus", 1, 3, "gpu-1")}
			}),
			want: []string{"False/PoolIncomplete"}, set: []string{"False/PoolIncomplete"}, next: -1, wantMetrics: -1, wantDevices: -1,
			check: wantMessage("pool gpus generation 1 has 2 of 3 ResourceSlices")},
		{name: "DRA published: none: NoResourceSlices",
			w:    draHeld,
			want: []string{"False/NoResourceSlices"}, set: []string{"False/NoResourceSlices"}, next: -1, wantMetrics: -1, wantDevices: -1},
		{name: "DRA published and usable: True, counting the usable devices",
			w:    with(draHeld, func(w *world) { w.pools = draPool(1, 3) }),
			want: []string{"True/PluginReady"}, set: []string{"True/PluginReady"}, notes: []string{"PluginReady"}, next: -1, wantMetrics: -1, wantDevices: -1,
			check: wantMessage("3 usable devices in pool gpus")},
		{name: "DRA republish: generation 2 half written, True kept within the grace",
			w:     with(draReady, func(w *world) { w.pools = append(draPool(1, 3)[1:], resourceSlice(draExp.Name, "gpus", 2, 3, "gpu-0")) }),
			prior: []time.Duration{10 * time.Second},
			want:  []string{"True/PluginReady"}, next: republishGrace - 10*time.Second, wantMetrics: -1, wantDevices: -1},
		{name: "DRA republish: generation 2 complete, fewer devices: True, no flap",
			w:     with(draReady, func(w *world) { w.pools = draPool(2, 2) }),
			prior: []time.Duration{10 * time.Second},
			want:  []string{"True/PluginReady"}, set: []string{"True/PluginReady"}, next: 4 * time.Minute, wantMetrics: -1, wantDevices: -1,
			check: func(t *testing.T, p plan) {
				if len(p.mem.republish) != 0 {
					t.Errorf("the republish is remembered after it completed: %v", p.mem.republish)
				}
			}},
		{name: "DRA republish that never completes: PoolIncomplete once the grace is over",
			w:     with(draReady, func(w *world) { w.pools = append(draPool(1, 3)[1:], resourceSlice(draExp.Name, "gpus", 2, 3, "gpu-0")) }),
			prior: []time.Duration{republishGrace},
			want:  []string{"False/PoolIncomplete"}, set: []string{"False/PoolIncomplete"}, notes: []string{"PluginNotReady"}, next: 4 * time.Minute, wantMetrics: -1, wantDevices: -1,
			check: wantMessage("pool gpus generation 2 has 1 of 3 ResourceSlices")},
		{name: "DRA usable: every device tainted NoSchedule: DevicesTainted, naming the key",
			w: with(draReady, func(w *world) {
				w.pools = nil
				for _, sl := range draPool(1, 3) {
					w.pools = append(w.pools, tainted(sl, "example.com/xid-79", resourcev1.DeviceTaintEffectNoSchedule))
				}
			}),
			want: []string{"False/DevicesTainted"}, set: []string{"False/DevicesTainted"}, notes: []string{"PluginNotReady"}, next: 4 * time.Minute, wantMetrics: -1, wantDevices: -1,
			check: wantMessage("3 tainted NoSchedule or NoExecute (example.com/xid-79)")},
		{name: "DRA usable: a taint of effect None keeps the device usable",
			w: with(draReady, func(w *world) {
				w.pools = nil
				for _, sl := range draPool(1, 3) {
					w.pools = append(w.pools, tainted(sl, "example.com/note", resourcev1.DeviceTaintEffectNone))
				}
			}),
			want: []string{"True/PluginReady"}, next: 4 * time.Minute, wantMetrics: -1, wantDevices: -1},
		{name: "DRA usable: its health stream says every device is Unhealthy: DevicesUnhealthy",
			w: with(draReady, func(w *world) {
				w.socks[0].Details = api.DRADetails{Driver: draExp.Name, Devices: []api.DRADeviceHealth{
					{Pool: "gpus", Device: "gpu-0", Health: api.DeviceUnhealthy}, {Pool: "gpus", Device: "gpu-1", Health: api.DeviceUnhealthy},
					{Pool: "gpus", Device: "gpu-2", Health: api.DeviceUnhealthy}}}
			}),
			want: []string{"False/DevicesUnhealthy"}, set: []string{"False/DevicesUnhealthy"}, notes: []string{"PluginNotReady"}, next: 4 * time.Minute, wantMetrics: -1, wantDevices: -1,
			check: wantMessage("3 Unhealthy by its DRAResourceHealth stream (gpus/gpu-0, gpus/gpu-1, gpus/gpu-2)")},
		{name: "DRA usable: Unknown health is not Unhealthy",
			w: with(draReady, func(w *world) {
				w.socks[0].Details = api.DRAObserved{Driver: draExp.Name, Devices: []api.DRADeviceHealth{{Pool: "gpus", Device: "gpu-0", Health: "Unknown"}}}
			}),
			want: []string{"True/PluginReady"}, next: 4 * time.Minute, wantMetrics: -1, wantDevices: -1},
		{name: "DRA usable: fewer devices than minDevices: TooFewDevices",
			w: with(draReady, func(w *world) {
				w.expect = []Expectation{{Type: TypeDRA, Name: draExp.Name, Condition: draExp.Condition, MinDevices: 4}}
			}),
			want: []string{"False/TooFewDevices"}, set: []string{"False/TooFewDevices"}, notes: []string{"PluginNotReady"}, next: 4 * time.Minute, wantMetrics: -1, wantDevices: -1,
			check: wantMessage("3 usable devices of 3 in pool gpus, 4 needed")},
		{name: "topology conflict: the driver back with another node id",
			w: with(ready, func(w *world) {
				w.socks[0].Answering, w.socks[0].State = false, "NotAnswering"
				w.socks[0].Details = api.CSIDetails{Driver: "csi.example.com", CSIInstance: api.CSIInstance{NodeID: "node-b", Topology: map[string]string{"topology.example.com/node": "node-b"}}}
				w.labels = map[string]string{"topology.example.com/node": "node-a"}
				w.reads[0].registered, w.reads[0].seen = nil, []string{"/r/csi.sock"}
			}),
			want: []string{"False/TopologyConflict"}, set: []string{"False/TopologyConflict"}, notes: []string{"PluginNotReady"}, next: time.Minute /* the stale CSINode entry's grace */, wantMetrics: -1, wantDevices: -1,
			check: func(t *testing.T, p plan) {
				if !strings.Contains(p.set[0].Message, "kubectl label node node-a topology.example.com/node-") {
					t.Errorf("no remedy: %q", p.set[0].Message)
				}
			}},
		{name: "API outage: judged, nothing written",
			w:    with(ready, func(w *world) { w.outage = true; w.socks[0].Answering = false }),
			want: []string{"False/NotAnswering"}, next: fastFor, wantMetrics: unsettledFast - time.Second, wantDevices: -1,
			check: func(t *testing.T, p plan) {
				if !p.states[0].Pending || len(p.notes)+len(p.drop)+len(p.extra) != 0 {
					t.Errorf("state %+v, notes %v", p.states[0], p.notes)
				}
			}},
		{name: "plugd's own write, not brought back yet: judged against it",
			w: with(ready, func(w *world) { w.socks = nil; w.reads[0].registered = nil }),
			mem: func(m *memory) {
				m.written[csiCond] = written{conditionVerdict{corev1.ConditionFalse, ReasonNotAnswering, "m"}, 1, corev1.NodeCondition{Type: csiCond, Status: corev1.ConditionFalse, Reason: ReasonNotAnswering}}
			},
			// A new reason of False, held; no second PluginNotReady.
			want: []string{"False/SocketMissing"}, next: coalesce, wantMetrics: -1, wantDevices: -1},
		{name: "plugd's own write, not brought back yet, the same: nothing written",
			w: with(ready, func(w *world) { w.socks = nil; w.reads[0].registered = nil }),
			mem: func(m *memory) {
				c := verdictOf(with(ready, func(w *world) { w.socks = nil; w.reads[0].registered = nil }), csiExp, now)
				m.written[csiCond] = written{conditionVerdict{c.Status, c.Reason, c.Message}, 1, c}
			},
			want: []string{"False/SocketMissing"}, next: time.Minute, wantMetrics: -1, wantDevices: -1}, // the stale CSINode entry's grace
		{name: "overwrite fight: the third overwrite is written back after a delay",
			w: onNode(held, cond(csiExp, corev1.ConditionUnknown, "NotMaintained", "overwrite", now, now), now),
			mem: func(m *memory) {
				v := conditionVerdict{trueCond.Status, trueCond.Reason, trueCond.Message}
				m.fights[csiCond] = &fight{seen: v, mine: v, answered: true, undos: 2, first: now.Add(-time.Minute)}
			},
			want: []string{"True/PluginReady"}, tell: []string{"ConditionOverwritten"}, next: fightDelayMin, wantMetrics: -1, wantDevices: -1,
			check: func(t *testing.T, p plan) {
				if !slices.Equal(p.overwrites, []string{csiCond}) || len(p.logs) != 1 || !p.logs[0].warn {
					t.Errorf("overwrites %v, logs %+v", p.overwrites, p.logs)
				}
			}},
		{name: "overwrite fight: the first overwrites are written back at once",
			w: onNode(held, cond(csiExp, corev1.ConditionUnknown, "NotMaintained", "overwrite", now, now), now),
			mem: func(m *memory) {
				v := conditionVerdict{trueCond.Status, trueCond.Reason, trueCond.Message}
				m.fights[csiCond] = &fight{seen: v, mine: v, answered: true}
			},
			want: []string{"True/PluginReady"}, set: []string{"True/PluginReady"}, notes: []string{"PluginReady"}, next: 5 * time.Minute, wantMetrics: -1, wantDevices: -1},
		{name: "every expected plugin ready: the startup taint removed",
			w: with(ready, func(w *world) {
				w.taints = []corev1.Taint{{Key: "example.com/plugins-not-ready", Effect: corev1.TaintEffectNoSchedule}}
			}),
			want: []string{"True/PluginReady"}, taint: true, next: 4 * time.Minute, wantMetrics: -1, wantDevices: -1},
		{name: "a plugin no longer expected: its condition dropped, a second entry of plugd's removed",
			w: with(ready, func(w *world) {
				old := trueCond
				old.Type, old.Message = "old.example.com/CSIPluginReady", "plugd: CSIPlugin old.example.com: registered"
				w.conds = append(w.conds, w.conds[0], old)
				w.managed = []string{csiCond, "old.example.com/CSIPluginReady"}
			}),
			want: []string{"True/PluginReady"}, next: 4 * time.Minute, wantMetrics: -1, wantDevices: -1,
			check: func(t *testing.T, p plan) {
				if !slices.Equal(p.drop, []string{"old.example.com/CSIPluginReady"}) || len(p.extra) != 1 || p.extra[0].index != 1 {
					t.Errorf("drop %v, extra %+v; want the old type dropped, the second entry (1) removed", p.drop, p.extra)
				}
			}},
		{name: "dropped and removed already, not brought back yet: not again",
			w: with(ready, func(w *world) {
				old := trueCond
				old.Type, old.Message = "old.example.com/CSIPluginReady", "plugd: CSIPlugin old.example.com: registered"
				w.conds = append(w.conds, w.conds[0], old)
				w.managed = []string{csiCond, "old.example.com/CSIPluginReady"}
			}),
			mem: func(m *memory) {
				m.written["old.example.com/CSIPluginReady"] = written{seq: 1}
				m.removed, m.removedSeq = true, 1
			},
			want: []string{"True/PluginReady"}, next: 4 * time.Minute, wantMetrics: -1, wantDevices: -1,
			check: func(t *testing.T, p plan) {
				if len(p.drop)+len(p.extra) != 0 {
					t.Errorf("drop %v, extra %+v; want none", p.drop, p.extra)
				}
			}},
		{name: "the kubelet holds a CSI socket CSINode does not list: judged later",
			w:    with(held, func(w *world) { w.csi = nil }),
			want: []string{""}, next: csiNodeWait, wantMetrics: -1, wantDevices: -1},
		{name: "the kubelet holds a CSI socket CSINode never lists: a failed registration, False",
			w:     with(held, func(w *world) { w.csi = nil }),
			prior: []time.Duration{csiNodeWait},
			want:  []string{"False/NotInCSINode"}, set: []string{"False/NotInCSINode"}, next: -1, wantMetrics: -1, wantDevices: -1},
		{name: "a kubelet that renamed its ALPHA gauge: Inferred",
			w:    with(held, func(w *world) { w.reads[0].registered, w.reads[0].renamedGauge = nil, true }),
			want: []string{"True/Inferred"}, set: []string{"True/Inferred"}, notes: []string{"PluginReady"}, next: -1, wantMetrics: -1, wantDevices: -1},
	}
	for _, tc := range append(cases, anyOfCases(now)...) {
		t.Run(tc.name, func(t *testing.T) { testDecide(t, now, tc) })
	}
}

// anyOfCases are TestDecide's cases of an expectation with alternatives: a
// device plugin and a DRA driver, either of which makes the resource ready
// (anyof.go).
func anyOfCases(now time.Time) []decideCase {
	res := Expectation{Type: TypeAnyOf, Name: "gpu.example.com", Condition: "gpu.example.com/Ready", AnyOf: []Expectation{
		{Type: TypeDevice, Name: "vendor.example/gpu", MinHealthyDevices: 1}, {Type: TypeDRA, Name: "gpu.example.com"}}}
	dpReady := world{expect: []Expectation{res}, socks: []Socket{gpuSock},
		reads: []kubeletRead{{at: now, started: started, registered: []string{"/r/gpu.sock"}, devices: map[string]int{"vendor.example/gpu": 2}}}}
	draReady := world{expect: []Expectation{res}, socks: []Socket{draSock}, slices: []string{"gpu.example.com"},
		reads: []kubeletRead{{at: now, started: started, registered: []string{"/r/dra.sock"}}}}
	both := world{expect: []Expectation{res}, socks: []Socket{gpuSock, draSock}, slices: []string{"gpu.example.com"},
		reads: []kubeletRead{{at: now, started: started, registered: []string{"/r/gpu.sock", "/r/dra.sock"}, devices: map[string]int{"vendor.example/gpu": 2}}}}
	// neither: the device plugin gone, the DRA driver's socket answers,
	// the kubelet has not registered it yet.
	neither := world{expect: []Expectation{res}, socks: []Socket{draSock}, slices: []string{"gpu.example.com"},
		reads: []kubeletRead{{at: now, started: started}}}
	// csiNotListed: a resource of a CSI driver or a DRA driver; the
	// kubelet holds the CSI driver's socket, CSINode does not list it.
	csiRes := Expectation{Type: TypeAnyOf, Name: "store.example.com", Condition: "store.example.com/Ready", AnyOf: []Expectation{
		{Type: TypeCSI, Name: "csi.example.com"}, {Type: TypeDRA, Name: "gpu.example.com"}}}
	csiNotListed := world{expect: []Expectation{csiRes}, socks: []Socket{csiSock},
		reads: []kubeletRead{{at: now.Add(-time.Second), started: started, registered: []string{"/r/csi.sock"}}}}
	on := func(w world, held world) world {
		c := verdictOf(held, res, now)
		w.conds = []corev1.NodeCondition{cond(res, c.Status, c.Reason, c.Message, now.Add(-time.Minute), now.Add(-time.Minute))}
		return w
	}
	heldBy := func(holder string) func(t *testing.T, p plan) {
		return func(t *testing.T, p plan) {
			if m := p.states[0].Want.Message; !strings.HasPrefix(m, "plugd: anyOf gpu.example.com: held by "+holder+": registered with the kubelet") {
				t.Errorf("message %q; want it held by %s", m, holder)
			}
		}
	}
	return []decideCase{
		{name: "anyOf: the first alternative ready: True, held by it", w: dpReady,
			want: []string{"True/PluginReady"}, set: []string{"True/PluginReady"}, notes: []string{"PluginReady"}, next: -1, wantMetrics: -1, wantDevices: -1,
			check: heldBy("DevicePlugin vendor.example/gpu")},
		{name: "anyOf: the second alternative ready: True, held by it", w: draReady,
			want: []string{"True/PluginReady"}, set: []string{"True/PluginReady"}, notes: []string{"PluginReady"}, next: -1, wantMetrics: -1, wantDevices: -1,
			check: heldBy("DRAPlugin gpu.example.com")},
		{name: "anyOf: both ready: the holder stays, nothing written", w: on(both, draReady),
			want: []string{"True/PluginReady"}, next: 4 * time.Minute, wantMetrics: -1, wantDevices: -1,
			check: heldBy("DRAPlugin gpu.example.com")},
		{name: "anyOf: the DRA driver holding it republishes: True kept within the republish grace, as a plain entry's",
			w: func() world {
				w := on(draReady, draReady)
				w.pools = append(draPool(1, 3)[1:], resourceSlice("gpu.example.com", "gpus", 2, 3, "gpu-0"))
				return w
			}(),
			prior: []time.Duration{switchGrace},
			want:  []string{"True/PluginReady"}, next: republishGrace - switchGrace, wantMetrics: -1, wantDevices: -1,
			check: heldBy("DRAPlugin gpu.example.com")},
		{name: "anyOf: the holder stopped, the other ready: the new holder written at once, no transition",
			w: on(draReady, dpReady), mem: func(m *memory) { m.switching[res.Condition] = now.Add(-5 * time.Second) },
			want: []string{"True/PluginReady"}, set: []string{"True/PluginReady"}, next: 4 * time.Minute, wantMetrics: -1, wantDevices: -1,
			check: func(t *testing.T, p plan) {
				heldBy("DRAPlugin gpu.example.com")(t, p)
				if len(p.mem.switching) != 0 {
					t.Errorf("the switch is over, yet remembered: %v", p.mem.switching)
				}
			}},
		{name: "anyOf: the holder stopped, none ready yet: True kept for the switch's grace",
			w:    on(neither, dpReady),
			want: []string{"False/NoneReady"}, next: fastFor, wantMetrics: unsettledFast, wantDevices: -1, // fast reads end before the grace
			check: func(t *testing.T, p plan) {
				if !p.mem.switching[res.Condition].Equal(now) {
					t.Errorf("the switch's start %v; want now", p.mem.switching)
				}
				if !p.ready[res.Condition] || !p.states[0].Pending || len(p.taints) != 0 {
					t.Errorf("ready %v, pending %v, taints %+v; want True kept, a False pending", p.ready, p.states[0].Pending, p.taints)
				}
			}},
		{name: "anyOf: none ready past the switch's grace: False, with both reasons",
			w: on(neither, dpReady), prior: []time.Duration{switchGrace},
			want: []string{"False/NoneReady"}, set: []string{"False/NoneReady"}, notes: []string{"PluginNotReady"}, next: slowFor - switchGrace, wantMetrics: unsettledSlow, wantDevices: -1,
			check: func(t *testing.T, p plan) {
				m := p.set[0].Message
				for _, s := range []string{"plugd: anyOf gpu.example.com: none ready (DevicePlugin vendor.example/gpu: SocketMissing, DRAPlugin gpu.example.com: KubeletNotRegistered): DevicePlugin vendor.example/gpu: no registration socket", "; DRAPlugin gpu.example.com: its socket answers"} {
					if !strings.Contains(m, s) {
						t.Errorf("message %q; want it to say %q", m, s)
					}
				}
			}},
		{name: "anyOf: a CSI alternative the kubelet holds, CSINode does not list: judged later", w: csiNotListed,
			want: []string{""}, next: csiNodeWait, wantMetrics: -1, wantDevices: -1},
		{name: "anyOf: a CSI alternative CSINode never lists: False, its reason among the others", w: csiNotListed, prior: []time.Duration{csiNodeWait},
			want: []string{"False/NoneReady"}, set: []string{"False/NoneReady"}, next: -1, wantMetrics: -1, wantDevices: -1,
			check: func(t *testing.T, p plan) {
				if m := p.set[0].Message; !strings.Contains(m, "CSIPlugin csi.example.com: the kubelet holds its socket, but its CSINode has not listed the driver") || !strings.Contains(m, "(CSIPlugin csi.example.com: NotInCSINode, DRAPlugin gpu.example.com: SocketMissing)") {
					t.Errorf("message %q", m)
				}
			}},
		{name: "anyOf: none ready, and none was: False at once", w: neither,
			want: []string{"False/NoneReady"}, set: []string{"False/NoneReady"}, next: fastFor, wantMetrics: unsettledFast, wantDevices: -1},
	}
}

// draPool is the DRA driver's pool gpus at generation gen, three slices
// of one device each, published count of them.
func draPool(gen int64, count int) []*resourcev1.ResourceSlice {
	var out []*resourcev1.ResourceSlice
	for i := range count {
		out = append(out, resourceSlice(draExp.Name, "gpus", gen, int64(count), fmt.Sprintf("gpu-%d", i)))
	}
	return out
}

// wantMessage checks that the plan writes a condition whose message holds
// text.
func wantMessage(text string) func(*testing.T, plan) {
	return func(t *testing.T, p plan) {
		t.Helper()
		for _, c := range p.set {
			if strings.Contains(c.Message, text) {
				return
			}
		}
		t.Errorf("written %+v; want a message with %q", p.set, text)
	}
}

func testDecide(t *testing.T, now time.Time, tc decideCase) {
	pol := testPolicy(tc.w)
	mem := newMemory()
	for _, d := range tc.prior {
		mem = decide(pol, tc.w.facts(now.Add(-d)), mem).mem
	}
	if tc.mem != nil {
		tc.mem(&mem)
	}
	before := mem.clone()
	f := tc.w.facts(now)
	p := decide(pol, f, mem)
	if !reflect.DeepEqual(mem, before) {
		t.Errorf("decide changed the memory it was given")
	}
	var want, set, notes, tell []string
	for _, s := range p.states {
		w := ""
		if s.Want != nil {
			w = fmt.Sprintf("%s/%s", s.Want.Status, s.Want.Reason)
		}
		want = append(want, w)
	}
	for _, c := range p.set {
		set = append(set, fmt.Sprintf("%s/%s", c.Status, c.Reason))
	}
	for _, e := range p.notes {
		notes = append(notes, e.reason)
	}
	for _, e := range p.tell {
		tell = append(tell, e.reason)
	}
	for _, c := range []struct {
		what      string
		got, want []string
	}{{"wanted", want, tc.want}, {"written", set, tc.set}, {"told once written", notes, tc.notes}, {"told", tell, tc.tell}} {
		if !slices.Equal(c.got, c.want) {
			t.Errorf("%s: %q; want %q", c.what, c.got, c.want)
		}
	}
	if removed := len(p.taints) == 1 && !p.taints[0].add && p.taints[0].reason == ReasonTaintRemoved; removed != tc.taint || len(p.taints) > 1 {
		t.Errorf("taint changes %+v; want the startup taint removed: %v", p.taints, tc.taint)
	}
	for _, c := range []struct {
		what string
		got  time.Time
		want time.Duration
	}{{"next", p.next, tc.next}, {"metrics wished", p.wantMetrics, tc.wantMetrics}, {"devices wished", p.wantDevices, tc.wantDevices}} {
		if c.want == -1 && !c.got.IsZero() || c.want != -1 && !c.got.Equal(now.Add(c.want)) {
			t.Errorf("%s: %s after now (zero %v); want %s", c.what, c.got.Sub(now), c.got.IsZero(), c.want)
		}
	}
	if tc.check != nil {
		tc.check(t, p)
	}
}

// reregister makes w's CSI socket a new registrar's, which the kubelet
// registered (a retry begun before the socket was made, which the reads
// did not see begin) and dropped at dropped to register it again (its
// timestamp was the old socket's), as test/kube's TopologyConflict
// scenario caught it on a loaded machine.
func reregister(dropped time.Time) func(*world) {
	return func(w *world) {
		made := dropped.Add(-3 * time.Second)
		w.socks[0].Created = made
		w.reads = []kubeletRead{{at: made.Add(-time.Second), started: started},
			{at: made.Add(40 * time.Millisecond), started: started, seen: []string{"/r/csi.sock"}},         // retrying, as far as the reads know since now
			{at: made.Add(1300 * time.Millisecond), started: started, registered: []string{"/r/csi.sock"}}, // the old retry, against the new socket
			{at: dropped, started: started, seen: []string{"/r/csi.sock"}},                                 // dropped, to register it again
			{at: t0, started: started, seen: []string{"/r/csi.sock"}}}                                      // not back yet
	}
}

// Holds names the resources a plugin holds, as the Node says: the status
// API's holds of a plugin.
func TestHolds(t *testing.T) {
	res := Expectation{Type: TypeAnyOf, Name: "gpu.example.com", Condition: "gpu.example.com/Ready"}
	held := func(status corev1.ConditionStatus, text string) *corev1.NodeCondition {
		return &corev1.NodeCondition{Type: "gpu.example.com/Ready", Status: status, Message: nodecond.Message(TypeAnyOf, "gpu.example.com", text)}
	}
	n := &Node{}
	n.setConditions([]ConditionState{{Expectation: res, Actual: held(corev1.ConditionTrue, nodecond.HeldBy+"DRAPlugin gpu.example.com: registered")},
		{Expectation: draExp, Actual: &corev1.NodeCondition{Status: corev1.ConditionTrue, Message: nodecond.Message(TypeDRA, "gpu.example.com", "registered")}}})
	if got := n.Holds(TypeDRA, "gpu.example.com"); !slices.Equal(got, []string{"gpu.example.com/Ready"}) {
		t.Errorf("the DRA driver holds %q", got)
	}
	if got := n.Holds(TypeDevice, "vendor.example/gpu"); got != nil {
		t.Errorf("the device plugin holds %q", got)
	}
	n.setConditions([]ConditionState{{Expectation: res, Actual: held(corev1.ConditionFalse, "none ready: DRAPlugin gpu.example.com: gone (SocketMissing)")}})
	if got := n.Holds(TypeDRA, "gpu.example.com"); got != nil {
		t.Errorf("a False condition held by %q", got)
	}
}
