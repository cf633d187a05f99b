package kubenode

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
	jsonpatch "gopkg.in/evanphx/json-patch.v4"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	resourcev1 "k8s.io/api/resource/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/strategicpatch"

	"k8s.io/utils/clock"

	"github.com/plugd/plugd/api"
	"github.com/plugd/plugd/cmd/plugd/internal/kubenode/kubeletstate"
	"github.com/plugd/plugd/internal/nodecond"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func node(capacity, allocatable map[string]string) *corev1.Node {
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-a"}, Status: corev1.NodeStatus{Capacity: corev1.ResourceList{}, Allocatable: corev1.ResourceList{}}}
	for k, v := range capacity {
		n.Status.Capacity[corev1.ResourceName(k)] = resource.MustParse(v)
	}
	for k, v := range allocatable {
		n.Status.Allocatable[corev1.ResourceName(k)] = resource.MustParse(v)
	}
	return n
}

func csiNode(drivers ...storagev1.CSINodeDriver) *storagev1.CSINode {
	return &storagev1.CSINode{ObjectMeta: metav1.ObjectMeta{Name: "node-a"}, Spec: storagev1.CSINodeSpec{Drivers: drivers}}
}

// What the API objects show, as plugd says when it cannot read the
// kubelet itself.
func TestInferredView(t *testing.T) {
	down := &Problem{Reason: ReasonAPIUnavailable, Message: "cannot list: connection refused"}
	csi := Socket{Path: "/r/csi.sock", Type: TypeCSI, Name: "csi.example.com", Answering: true, Details: csiSaid("node-a")}
	gpu := Socket{Path: "/r/gpu.sock", Type: TypeDevice, Name: "vendor.example/gpu", Answering: true, Details: streamed(2, 0)}
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	older := gpu
	older.Details = looked(t0.Add(-time.Minute), 2, 0)
	for _, tc := range []struct {
		name      string
		k         key
		socks     []Socket
		s         snapshot
		state     string
		reason    string
		inMessage string
		healthy   int
	}{
		{"csi registered", key{TypeCSI, "csi.example.com"}, []Socket{csi},
			snapshot{csiNode: csiNode(storagev1.CSINodeDriver{Name: "csi.example.com", NodeID: "node-a"})}, api.KubeletRegistered, "", `nodeID "node-a"`, 0},
		{"csi node id differs", key{TypeCSI, "csi.example.com"}, []Socket{csi},
			snapshot{csiNode: csiNode(storagev1.CSINodeDriver{Name: "csi.example.com", NodeID: "old"})}, api.KubeletRegistered, "NodeIDMismatch", `"old"`, 0},
		{"csi not in drivers", key{TypeCSI, "csi.example.com"}, []Socket{csi},
			snapshot{csiNode: csiNode(storagev1.CSINodeDriver{Name: "other.example.com"})}, api.KubeletNotRegistered, "NotInCSINode", "other.example.com", 0},
		{"no csinode", key{TypeCSI, "csi.example.com"}, []Socket{csi}, snapshot{}, api.KubeletNotRegistered, "NoCSINode", "CSINode", 0},
		{"csinode unreadable", key{TypeCSI, "csi.example.com"}, []Socket{csi}, snapshot{csiProblem: down}, api.KubeletUnknown, ReasonAPIUnavailable, "connection refused", 0},
		{"device registered", key{TypeDevice, "vendor.example/gpu"}, []Socket{gpu},
			snapshot{node: node(map[string]string{"vendor.example/gpu": "2"}, map[string]string{"vendor.example/gpu": "2"})}, api.KubeletRegistered, "", "capacity 2", 2},
		{"device allocatable differs", key{TypeDevice, "vendor.example/gpu"}, []Socket{gpu},
			snapshot{node: node(map[string]string{"vendor.example/gpu": "2"}, map[string]string{"vendor.example/gpu": "1"})}, api.KubeletRegistered, "AllocatableMismatch", "2 healthy of 2", 0},
		{"device allocatable differs, the plugin's look older than the Node's", key{TypeDevice, "vendor.example/gpu"}, []Socket{older},
			snapshot{node: reported(node(map[string]string{"vendor.example/gpu": "2"}, map[string]string{"vendor.example/gpu": "1"}), t0)}, api.KubeletRegistered, "", "allocatable 1", 0},
		{"device plugin gone, in the kubelet's grace", key{TypeDevice, "vendor.example/gpu"}, nil,
			snapshot{node: node(map[string]string{"vendor.example/gpu": "2"}, map[string]string{"vendor.example/gpu": "0"})}, api.KubeletRegistered, "", "grace period", 0},
		{"device not in capacity", key{TypeDevice, "vendor.example/gpu"}, []Socket{gpu},
			snapshot{node: node(nil, nil)}, api.KubeletNotRegistered, "NotInCapacity", "status.capacity", 0},
		{"device capacity zero", key{TypeDevice, "vendor.example/gpu"}, []Socket{gpu},
			snapshot{node: node(map[string]string{"vendor.example/gpu": "0"}, nil)}, api.KubeletNotRegistered, "CapacityZero", "dropped", 0},
		{"no node", key{TypeDevice, "vendor.example/gpu"}, []Socket{gpu}, snapshot{}, api.KubeletUnknown, "NodeMissing", "no Node", 0},
		{"dra slices", key{TypeDRA, "gpu.example.com"}, nil,
			snapshot{slices: []*resourcev1.ResourceSlice{{Spec: resourcev1.ResourceSliceSpec{Driver: "gpu.example.com"}}, {Spec: resourcev1.ResourceSliceSpec{Driver: "other"}}}}, api.KubeletRegistered, "", "1 ResourceSlices for driver gpu.example.com exist on node", 0},
		{"dra no slices", key{TypeDRA, "gpu.example.com"}, nil, snapshot{}, api.KubeletUnknown, "NoResourceSlices", "not have published yet", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.s.nodeName = "node-a"
			v := inferredView(tc.k, tc.socks, tc.s)
			if v.State != tc.state || v.Reason != tc.reason || !strings.Contains(v.Message, tc.inMessage) {
				t.Errorf("view = %+v; want state %s, reason %q, a message with %q", v, tc.state, tc.reason, tc.inMessage)
			}
		})
	}
	// Through kubeletView, an inferred registration says so, and a device
	// plugin's healthy count is the Node's allocatable.
	off := kubeletFacts{problem: &Problem{Reason: ReasonKubeletForbidden}}
	s := snapshot{nodeName: "node-a", node: node(map[string]string{"vendor.example/gpu": "2"}, map[string]string{"vendor.example/gpu": "2"})}
	v := kubeletView(key{TypeDevice, "vendor.example/gpu"}, []Socket{gpu}, s, off, remembered{})
	if v.State != api.KubeletRegistered || v.Reason != ReasonInferred || !strings.Contains(v.Message, "inferred from API objects") || v.healthy != 2 || v.healthyFresh {
		t.Errorf("inferred device view = %+v", v)
	}
	v = kubeletView(key{"example.com/Greeter", "greeter"}, nil, snapshot{}, off, remembered{})
	if v.State != api.KubeletNotRegistered || v.Reason != "UnsupportedType" || !strings.Contains(v.Message, "refuses type example.com/Greeter") {
		t.Errorf("custom type: %+v", v)
	}
}

// reported is n with a Ready condition last reported at t.
func reported(n *corev1.Node, t time.Time) *corev1.Node {
	n.Status.Conditions = append(n.Status.Conditions, corev1.NodeCondition{Type: corev1.NodeReady, Status: corev1.ConditionTrue, LastHeartbeatTime: metav1.NewTime(t)})
	return n
}

func TestJudge(t *testing.T) {
	csi := Expectation{Type: TypeCSI, Name: "csi.example.com", Condition: "csi.example.com/CSIPluginReady"}
	gpu := Expectation{Type: TypeDevice, Name: "vendor.example/gpu", Condition: "c", MinHealthyDevices: 2}
	up := Socket{Path: "/r/csi.sock", Answering: true, State: "Answering"}
	stale := Socket{Path: "/r/csi.sock", State: "Stale"}
	reg := view{KubeletView: api.KubeletView{State: api.KubeletRegistered, Message: "in CSINode"}}
	for _, tc := range []struct {
		name   string
		e      Expectation
		socks  []Socket
		v      view
		status corev1.ConditionStatus
		reason string
		ok     bool
	}{
		{"ready", csi, []Socket{up}, reg, corev1.ConditionTrue, ReasonReady, true},
		{"no socket", csi, nil, reg, corev1.ConditionFalse, ReasonSocketMissing, true},
		{"stale", csi, []Socket{stale}, reg, corev1.ConditionFalse, ReasonNotAnswering, true},
		{"kubelet lacks it", csi, []Socket{up}, view{KubeletView: api.KubeletView{State: api.KubeletNotRegistered}}, corev1.ConditionFalse, ReasonKubeletNotRegistered, true},
		{"node id", csi, []Socket{up}, view{KubeletView: api.KubeletView{State: api.KubeletRegistered, Reason: "NodeIDMismatch"}}, corev1.ConditionFalse, "NodeIDMismatch", true},
		{"no slices", csi, []Socket{up}, view{KubeletView: api.KubeletView{State: api.KubeletUnknown, Reason: "NoResourceSlices"}}, corev1.ConditionFalse, "NoResourceSlices", true},
		{"api down: left alone", csi, []Socket{up}, view{KubeletView: api.KubeletView{State: api.KubeletUnknown, Reason: ReasonAPIUnavailable}}, "", "", false},
		{"forbidden: left alone", csi, []Socket{up}, view{KubeletView: api.KubeletView{State: api.KubeletUnknown, Reason: ReasonForbidden}}, "", "", false},
		{"inferred", csi, []Socket{up}, view{KubeletView: api.KubeletView{State: api.KubeletRegistered, Reason: ReasonInferred}}, corev1.ConditionTrue, ReasonInferred, true},
		{"topology conflict, the registrar gone", csi, []Socket{stale}, view{KubeletView: api.KubeletView{State: api.KubeletNotRegistered, Reason: ReasonTopologyConflict, Message: "the driver reports"}}, corev1.ConditionFalse, ReasonTopologyConflict, true},
		{"held, CSINode being written: left alone", csi, []Socket{up}, view{KubeletView: api.KubeletView{State: api.KubeletRegistered, Reason: "NotInCSINode"}}, "", "", false},
		{"just found: left alone", csi, []Socket{{Path: "/r/csi.sock", State: "Pending", Unsettled: true}}, reg, "", "", false},
		{"kubelet not read yet: left alone", csi, []Socket{up}, view{KubeletView: api.KubeletView{State: api.KubeletUnknown, Reason: ReasonNotSynced}}, "", "", false},
		{"enough devices", gpu, []Socket{{Answering: true, Details: streamed(2, 0)}}, view{KubeletView: reg.KubeletView, healthy: 2, healthyFresh: false}, corev1.ConditionTrue, ReasonReady, true},
		{"kubelet counts fewer", gpu, []Socket{{Answering: true, Details: streamed(2, 0)}}, view{KubeletView: reg.KubeletView, healthy: 1, healthyFresh: false}, corev1.ConditionFalse, ReasonNoHealthyDevices, true},
		{"a streaming handler counts fewer than the Node", gpu, []Socket{{Answering: true, Details: streamed(1, 1)}}, view{KubeletView: reg.KubeletView, healthy: 2, healthyFresh: false}, corev1.ConditionFalse, ReasonNoHealthyDevices, true},
		{"an old look counts fewer than the Node", gpu, []Socket{{Answering: true, Details: looked(time.Unix(1, 0), 1, 1)}}, view{KubeletView: reg.KubeletView, healthy: 2, healthyFresh: false}, corev1.ConditionTrue, ReasonReady, true},
		{"the kubelet's live count is the truth", gpu, []Socket{{Answering: true, Details: streamed(1, 1)}}, view{KubeletView: reg.KubeletView, healthy: 2, healthyFresh: true}, corev1.ConditionTrue, ReasonReady, true},
		{"kubelet count alone", gpu, []Socket{{Answering: true}}, view{KubeletView: reg.KubeletView, healthy: 3, healthyFresh: false}, corev1.ConditionTrue, ReasonReady, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v, ok := judge(tc.e, tc.socks, false, tc.v, "/r")
			if ok != tc.ok || v.status != tc.status || v.reason != tc.reason {
				t.Fatalf("judge = %+v, %v; want %s %s, %v", v, ok, tc.status, tc.reason, tc.ok)
			}
			if !ok {
				return
			}
			if typ, name, pok := nodecond.Parse(v.message); !pok || typ != tc.e.Type || name != tc.e.Name {
				t.Errorf("message %q does not name %s %s in plugd's form", v.message, tc.e.Type, tc.e.Name)
			}
		})
	}
}

// A socket not asked yet, or a directory not walked yet, may be any
// expected plugin's: none is called missing, but what the kubelet's side
// alone decides still holds.
func TestJudgeUnasked(t *testing.T) {
	csi := Expectation{Type: TypeCSI, Name: "csi.example.com", Condition: "csi.example.com/CSIPluginReady"}
	reg := view{KubeletView: api.KubeletView{State: api.KubeletRegistered}}
	if v, ok := judge(csi, nil, true, reg, "/r"); ok {
		t.Errorf("no socket of it, one not asked yet: %+v; want it left alone", v)
	}
	conflict := view{KubeletView: api.KubeletView{State: api.KubeletNotRegistered, Reason: ReasonTopologyConflict, Message: "the driver reports"}}
	if v, ok := judge(csi, nil, true, conflict, "/r"); !ok || v.reason != ReasonTopologyConflict {
		t.Errorf("a topology conflict, one not asked yet: %+v, %v", v, ok)
	}
	up := Socket{Path: "/r/csi.sock", Answering: true, State: "Answering"}
	if v, ok := judge(csi, []Socket{up}, true, reg, "/r"); !ok || v.status != corev1.ConditionTrue {
		t.Errorf("its own socket answers, another not asked yet: %+v, %v", v, ok)
	}
}

func TestExpectationDefaults(t *testing.T) {
	for _, tc := range []struct {
		e    Expectation
		want string // condition, or the error's text
	}{
		{Expectation{Type: TypeCSI, Name: "csi.example.com"}, "csi.example.com/CSIPluginReady"},
		{Expectation{Type: TypeDRA, Name: "gpu.example.com"}, "gpu.example.com/DRAPluginReady"},
		{Expectation{Type: TypeDevice, Name: "vendor.example/gpu"}, "vendor.example/gpu-DevicePluginReady"},
		{Expectation{Type: "example.com/Greeter", Name: "greeter.example.com"}, "greeter.example.com/GreeterReady"},
		{Expectation{Type: TypeCSI, Name: "Not_A_Domain"}, "set condition"},
		{Expectation{Type: TypeCSI, Name: "csi.example.com", Condition: "csi.example.net/NodePluginRegistered"}, "csi.example.net/NodePluginRegistered"},
		{Expectation{Type: TypeCSI, Name: "csi.example.com", Condition: "Ready"}, "the kubelet's"},
		{Expectation{Type: TypeCSI, Name: "csi.example.com", Condition: "bad condition"}, "not a valid"},
		{Expectation{Type: TypeCSI, Name: "csi.example.com", MinHealthyDevices: 1}, "applies to DevicePlugin"},
		{Expectation{Type: TypeCSI, Name: "csi example"}, "spaces"},
		{Expectation{Type: TypeDRA, Name: "gpu.example.com", DeviceClasses: []string{"gpu.example.com", "fast.gpu.example.com"}}, "gpu.example.com/DRAPluginReady"},
		{Expectation{Type: TypeDevice, Name: "vendor.example/gpu", DeviceClasses: []string{"gpu.example.com"}}, "deviceClasses applies to DRAPlugin plugins, not DevicePlugin"},
		{Expectation{Type: TypeDRA, Name: "gpu.example.com", DeviceClasses: []string{"gpu.example.com", "GPU_Class"}}, `deviceClasses[1] "GPU_Class" is not a DeviceClass name`},
		{Expectation{Type: TypeDRA, Name: "gpu.example.com", DeviceClasses: []string{""}}, `deviceClasses[0] "" is not a DeviceClass name`},
		{Expectation{Type: TypeDRA, Name: "gpu.example.com", DeviceClasses: []string{"a.example.com", "b.example.com", "a.example.com"}}, `deviceClasses[2] "a.example.com" is listed twice`},
		{Expectation{Type: TypeCSI}, "type and name"},
	} {
		e, err := tc.e.WithDefaults()
		got := e.Condition
		if err != nil {
			got = err.Error()
		}
		if !strings.Contains(got, tc.want) {
			t.Errorf("%+v: got %q, want %q", tc.e, got, tc.want)
		}
	}
	e, _ := Expectation{Type: TypeDevice, Name: "vendor.example/gpu"}.WithDefaults()
	if e.MinHealthyDevices != 1 {
		t.Errorf("a device plugin needs %d healthy devices by default, want 1", e.MinHealthyDevices)
	}
}

// The conditions patch, applied as the API server applies a strategic merge
// patch, changes plugd's condition and keeps everyone else's.
func TestConditionsPatchKeepsOthers(t *testing.T) {
	t0 := metav1.NewTime(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	n := node(nil, nil)
	n.Status.Conditions = []corev1.NodeCondition{
		{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady"},
		{Type: "example.com/Other", Status: corev1.ConditionFalse, Reason: "TheirsAlone"},
		{Type: "c1", Status: corev1.ConditionFalse, Reason: ReasonSocketMissing, LastTransitionTime: t0},
	}
	now := t0.Add(time.Hour)
	set := []corev1.NodeCondition{
		nodeCondition("c1", conditionVerdict{corev1.ConditionTrue, ReasonReady, "m1"}, findCondition(n, "c1"), now),
		nodeCondition("c2", conditionVerdict{corev1.ConditionFalse, ReasonSocketMissing, "m2"}, nil, now),
	}
	n.Status.Conditions = append(n.Status.Conditions,
		corev1.NodeCondition{Type: "gone", Status: corev1.ConditionTrue, Reason: ReasonReady, Message: nodecond.Message("CSIPlugin", "gone.example.com", "ready")},
		// In plugd's form, but written by someone else: not plugd's to delete.
		corev1.NodeCondition{Type: "example.com/Mimic", Status: corev1.ConditionTrue, Message: nodecond.Message("CSIPlugin", "mimic.example.com", "ready")})
	n.ManagedFields = []metav1.ManagedFieldsEntry{
		{Manager: "plugd", Operation: metav1.ManagedFieldsOperationUpdate, Subresource: "status", FieldsType: "FieldsV1",
			FieldsV1: &metav1.FieldsV1{Raw: []byte(`{"f:status":{"f:conditions":{"k:{\"type\":\"c1\"}":{".":{},"f:message":{}},"k:{\"type\":\"gone\"}":{".":{},"f:message":{}}}}}`)}},
		{Manager: "kubectl-edit", Operation: metav1.ManagedFieldsOperationUpdate, Subresource: "status", FieldsType: "FieldsV1",
			FieldsV1: &metav1.FieldsV1{Raw: []byte(`{"f:status":{"f:conditions":{"k:{\"type\":\"example.com/Mimic\"}":{".":{},"f:message":{}}}}}`)}},
	}
	if got := unexpected(n, []Expectation{{Condition: "c1"}, {Condition: "c2"}}); len(got) != 1 || got[0] != "gone" {
		t.Errorf("unexpected = %q; want only plugd's condition of a plugin it no longer expects", got)
	}
	patch, err := conditionsPatch(set, []string{"gone"})
	if err != nil {
		t.Fatal(err)
	}
	orig, _ := json.Marshal(n)
	merged, err := strategicpatch.StrategicMergePatch(orig, patch, corev1.Node{})
	if err != nil {
		t.Fatal(err)
	}
	var out corev1.Node
	if err := json.Unmarshal(merged, &out); err != nil {
		t.Fatal(err)
	}
	got := map[string]corev1.NodeCondition{}
	for _, c := range out.Status.Conditions {
		got[string(c.Type)] = c
	}
	if len(got) != 5 || got["Ready"].Reason != "KubeletReady" || got["example.com/Other"].Reason != "TheirsAlone" {
		t.Errorf("others' conditions changed: %+v", out.Status.Conditions)
	}
	if c := got["c1"]; c.Status != corev1.ConditionTrue || !c.LastTransitionTime.Time.Equal(now) {
		t.Errorf("c1 = %+v; want True, moved at %s", c, now)
	}
	if c := got["c2"]; c.Reason != ReasonSocketMissing || c.Message != "m2" {
		t.Errorf("c2 = %+v", c)
	}
	// A verdict that keeps its status keeps its transition time.
	if c := nodeCondition("c1", conditionVerdict{corev1.ConditionFalse, ReasonNotAnswering, "m"}, findCondition(n, "c1"), now); !c.LastTransitionTime.Equal(&t0) {
		t.Errorf("transition time moved to %s for a status that did not change", c.LastTransitionTime)
	}
}

// Several entries of one type (a status PUT keeps them): plugd removes,
// by index, its entries after the first of a type it expects, and its
// entries of a type it no longer expects that another's entries share
// (deleting that type would take theirs); never an entry in another's
// form, nor one of a type plugd's managedFields do not name. The patch
// fails, rather than remove another entry, once the list has changed.
func TestExtrasRemovedByIndex(t *testing.T) {
	mine := func(typ, text string) corev1.NodeCondition {
		return corev1.NodeCondition{Type: corev1.NodeConditionType(typ), Status: corev1.ConditionTrue, Reason: ReasonReady, Message: nodecond.Message("CSIPlugin", "x.example.com", text)}
	}
	theirs := corev1.NodeCondition{Type: "c1", Status: corev1.ConditionTrue, Reason: "Noted", Message: "someone else's"}
	n := node(nil, nil)
	n.Status.Conditions = []corev1.NodeCondition{
		mine("c1", "first"), {Type: corev1.NodeReady, Status: corev1.ConditionTrue}, mine("c1", "copy"), theirs,
		mine("gone", "left"), {Type: "gone", Status: corev1.ConditionFalse, Message: "another's"},
		mine("untracked", "one"), mine("untracked", "two"),
	}
	n.ManagedFields = []metav1.ManagedFieldsEntry{{Manager: "plugd", Operation: metav1.ManagedFieldsOperationUpdate, Subresource: "status", FieldsType: "FieldsV1",
		FieldsV1: &metav1.FieldsV1{Raw: []byte(`{"f:status":{"f:conditions":{"k:{\"type\":\"c1\"}":{},"k:{\"type\":\"gone\"}":{}}}}`)}}}
	expect := []Expectation{{Condition: "c1"}, {Condition: "untracked"}}
	es := extras(n, expect)
	var at []int
	for _, e := range es {
		at = append(at, e.index)
	}
	if !slices.Equal(at, []int{2, 4}) {
		t.Fatalf("extras at %v; want 2 (plugd's copy) and 4 (plugd's, beside another's of a type no longer expected)", at)
	}
	if got := unexpected(n, expect); len(got) != 0 {
		t.Errorf("unexpected = %q; a type with another's entry is not deleted whole", got)
	}
	patch, err := removalPatch(es)
	if err != nil {
		t.Fatal(err)
	}
	doc, _ := json.Marshal(n)
	out, err := jsonpatch.DecodePatch(patch)
	if err != nil {
		t.Fatal(err)
	}
	res, err := out.Apply(doc)
	if err != nil {
		t.Fatalf("%v\n%s", err, patch)
	}
	var got corev1.Node
	if err := json.Unmarshal(res, &got); err != nil {
		t.Fatal(err)
	}
	want := []corev1.NodeCondition{n.Status.Conditions[0], n.Status.Conditions[1], theirs, n.Status.Conditions[5], n.Status.Conditions[6], n.Status.Conditions[7]}
	if !equality.Semantic.DeepEqual(got.Status.Conditions, want) {
		t.Errorf("after the patch: %+v", got.Status.Conditions)
	}
	// Another's entry moved into the place of plugd's copy: the patch fails.
	n.Status.Conditions[2], n.Status.Conditions[3] = theirs, n.Status.Conditions[2]
	doc, _ = json.Marshal(n)
	if _, err := out.Apply(doc); err == nil {
		t.Errorf("the patch applied to a list that changed")
	}
}

func TestTaintPatchRemovesOnlyItsTaint(t *testing.T) {
	n := node(nil, nil)
	n.Spec.Taints = []corev1.Taint{
		{Key: "example.com/plugins", Effect: corev1.TaintEffectNoExecute},
		{Key: "example.com/plugins", Effect: corev1.TaintEffectNoSchedule},
		{Key: "other", Effect: corev1.TaintEffectNoSchedule},
	}
	patch, ok, err := taintPatch(n, "example.com/plugins", corev1.TaintEffectNoSchedule)
	if err != nil || !ok {
		t.Fatalf("taintPatch = %v, %v", ok, err)
	}
	p, err := jsonpatch.DecodePatch(patch)
	if err != nil {
		t.Fatal(err)
	}
	orig, _ := json.Marshal(n)
	res, err := p.Apply(orig)
	if err != nil {
		t.Fatal(err)
	}
	var out corev1.Node
	json.Unmarshal(res, &out)
	if len(out.Spec.Taints) != 2 || out.Spec.Taints[0].Effect != corev1.TaintEffectNoExecute || out.Spec.Taints[1].Key != "other" {
		t.Errorf("taints after the patch: %+v", out.Spec.Taints)
	}
	// The list changed before the patch arrived: the test fails, nothing is removed.
	moved := n.DeepCopy()
	moved.Spec.Taints = moved.Spec.Taints[1:]
	b, _ := json.Marshal(moved)
	if _, err := p.Apply(b); err == nil {
		t.Error("the patch applied to a list where its taint had moved")
	}
	if _, ok, _ := taintPatch(&out, "example.com/plugins", corev1.TaintEffectNoSchedule); ok {
		t.Error("taintPatch found a taint that is gone")
	}
}

func TestParseTaint(t *testing.T) {
	if k, e, err := ParseTaint("example.com/plugins-not-ready:NoSchedule"); err != nil || k != "example.com/plugins-not-ready" || e != corev1.TaintEffectNoSchedule {
		t.Errorf("ParseTaint = %q, %q, %v", k, e, err)
	}
	for _, bad := range []string{"", "key", ":NoSchedule", "key:Sometimes", "bad key:NoSchedule"} {
		if _, _, err := ParseTaint(bad); err == nil {
			t.Errorf("ParseTaint(%q) accepted it", bad)
		}
	}
	// Taints Kubernetes owns: plugd would remove each every time it came
	// back (a cordon's unschedulable taint: plugd would uncordon the node).
	for _, owned := range []string{"node.kubernetes.io/unschedulable:NoSchedule", "node.kubernetes.io/not-ready:NoExecute",
		"node-role.kubernetes.io/control-plane:NoSchedule", "node-restriction.kubernetes.io/pci:NoSchedule",
		"node.cloudprovider.kubernetes.io/uninitialized:NoSchedule", "kubernetes.io/x:NoSchedule", "k8s.io/x:NoSchedule",
		"sub.k8s.io/x:NoSchedule", "csi.k8s.io/x:NoSchedule", "cluster-autoscaler.kubernetes.io/x:NoSchedule",
		"x.readiness.k8s.io/x:NoSchedule", "x.startup-taint.cluster-autoscaler.kubernetes.io/x:NoSchedule"} {
		if _, _, err := ParseTaint(owned); err == nil || !strings.Contains(err.Error(), "Kubernetes reserves") {
			t.Errorf("ParseTaint(%q) = %v; want it refused as Kubernetes'", owned, err)
		}
	}
	// Keys of one's own, also those that only look alike.
	for _, own := range []string{"dedicated:NoSchedule", "example.com/plugins-not-ready:NoSchedule", "notkubernetes.io/x:NoSchedule",
		"kubernetes.io.example.com/x:NoSchedule", "example.com/node.kubernetes.io:NoSchedule",
		// Startup taints in Kubernetes' domains that others put on for a
		// node agent to remove: Cluster Autoscaler's (and GKE's),
		// node-readiness-controller's, a kubernetes-sigs CSI driver's.
		"startup-taint.cluster-autoscaler.kubernetes.io/csi-not-ready:NoSchedule", "readiness.k8s.io/csi-not-ready:NoSchedule",
		"secrets-store.csi.k8s.io/agent-not-ready:NoExecute"} {
		if _, _, err := ParseTaint(own); err != nil {
			t.Errorf("ParseTaint(%q): %v", own, err)
		}
	}
}

// recorder keeps the events it is given, with their action.
type recorder struct{ got []string }

func (r *recorder) Eventf(_ runtime.Object, _ runtime.Object, eventtype, reason, action, note string, args ...any) {
	r.got = append(r.got, fmt.Sprintf("%s %s [%s] %s", eventtype, reason, action, fmt.Sprintf(note, args...)))
}

// disagreements is decide's part that tells of disagreements, on l's
// memory at now, with what it tells recorded as act does.
func (l *loop) disagreements(now time.Time, socks map[key][]Socket, views map[key]view, stale []staleEntry, kubeletLive bool, nd *corev1.Node) time.Time {
	d := &decision{pol: l.pol, f: facts{now: now, socks: socks, views: views, stale: stale, kubelet: kubeletFacts{live: kubeletLive}, node: nd}, m: l.mem}
	next := d.disagreements()
	for _, e := range d.p.tell {
		l.record(nd, e)
	}
	return next
}

func TestDisagreements(t *testing.T) {
	csi, gpu := key{TypeCSI, "csi.example.com"}, key{TypeDevice, "vendor.example/gpu"}
	up := []Socket{{Path: "/r/s.sock", Answering: true}}
	registered := view{KubeletView: api.KubeletView{State: api.KubeletRegistered, Message: "in CSINode"}}
	notRegistered := view{KubeletView: api.KubeletView{State: api.KubeletNotRegistered, Message: "not in CSINode"}}
	for _, tc := range []struct {
		name  string
		k     key
		socks []Socket
		v     view
		want  string // the event, or "" for none
	}{
		{"answers, kubelet lacks it", csi, up, notRegistered, "Warning KubeletDisagrees [Check CSIPlugin csi.example.com: NotRegistered] CSIPlugin csi.example.com: for 1m0s, its socket answers, but the kubelet has not registered it: not in CSINode"},
		{"kubelet has it, no socket", csi, nil, registered, "Warning KubeletDisagrees [Check CSIPlugin csi.example.com: SocketNotServed] CSIPlugin csi.example.com: for 1m0s, the kubelet has it (in CSINode), but no socket of it answers"},
		{"device plugin gone, capacity kept, none allocatable", gpu, nil, view{KubeletView: registered.KubeletView, healthy: 0, healthyFresh: false}, ""},
		{"device plugin gone, devices still allocatable", gpu, nil, view{KubeletView: registered.KubeletView, healthy: 2, healthyFresh: false}, "Warning KubeletDisagrees [Check DevicePlugin vendor.example/gpu: SocketNotServed] DevicePlugin vendor.example/gpu: for 1m0s, the kubelet has it (in CSINode), but no socket of it answers"},
		{"agree", csi, up, registered, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := &recorder{}
			n := &Node{grace: time.Minute}
			n.m = newMetrics(n, nil)
			l := newLoop(n, rec)
			t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
			socks, views := map[key][]Socket{tc.k: tc.socks}, map[key]view{tc.k: tc.v}
			nd := node(nil, nil)
			next := l.disagreements(t0, socks, views, nil, true, nd)
			if tc.want != "" && !next.Equal(t0.Add(time.Minute)) {
				t.Errorf("the next look is due at %s, want at the end of the grace", next)
			}
			l.disagreements(t0.Add(59*time.Second), socks, views, nil, true, nd)
			l.disagreements(t0.Add(time.Minute), socks, views, nil, true, nd)
			l.disagreements(t0.Add(2*time.Minute), socks, views, nil, true, nd) // told once only
			if (tc.want == "" && len(rec.got) != 0) || (tc.want != "" && !slices.Equal(rec.got, []string{tc.want})) {
				t.Errorf("events: %q; want %q", rec.got, tc.want)
			}
		})
	}
}

// ResourceSlices are the DRA driver's writing (or anyone's who may create
// them), not the kubelet's: where they are all plugd has, the view and the
// event say what they show and do not say "the kubelet has it"; where
// plugd reads the kubelet itself, slices of a driver it has not registered
// are no disagreement.
func TestSlicesAreNotTheKubelets(t *testing.T) {
	dra := key{TypeDRA, "gpu.example.com"}
	s := snapshot{nodeName: "node-a", slices: []*resourcev1.ResourceSlice{{Spec: resourcev1.ResourceSliceSpec{Driver: "gpu.example.com"}}}}
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name string
		kf   kubeletFacts
		want string // in the event; "" for none
	}{
		{"kubelet not read", kubeletFacts{problem: &Problem{Reason: "KubeletDisabled"}},
			"DRAPlugin gpu.example.com: for 1m0s, 1 ResourceSlices for driver gpu.example.com exist on node node-a (published by the driver, not proof of kubelet registration)"},
		{"kubelet read, driver not registered", kubeletFacts{live: true, registered: map[string]bool{}, seen: map[string]bool{}}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := &recorder{}
			n := &Node{grace: time.Minute}
			n.m = newMetrics(n, nil)
			l := newLoop(n, rec)
			v := kubeletView(dra, nil, s, tc.kf, remembered{})
			views := map[key]view{dra: v}
			for _, at := range []time.Duration{0, time.Minute} {
				l.disagreements(t0.Add(at), map[key][]Socket{dra: nil}, views, nil, tc.kf.live, node(nil, nil))
			}
			switch {
			case tc.want == "" && len(rec.got) > 0:
				t.Errorf("events: %q; want none (view %+v)", rec.got, v.KubeletView)
			case tc.want != "" && (len(rec.got) != 1 || !strings.Contains(rec.got[0], tc.want) || strings.Contains(rec.got[0], "kubelet has it")):
				t.Errorf("events: %q; want one that says %q", rec.got, tc.want)
			}
		})
	}
}

// One disagreement is one event, however many API outages interrupt it; a
// disagreement of another cause is another event; a stale CSINode entry is
// not forgotten while the kubelet cannot be read.
func TestDisagreementOutlastsOutages(t *testing.T) {
	csi := key{TypeCSI, "csi.example.com"}
	up := map[key][]Socket{csi: {{Path: "/r/s.sock", Answering: true}}}
	gone := map[key][]Socket{csi: nil}
	lacks := map[key]view{csi: {KubeletView: api.KubeletView{State: api.KubeletNotRegistered, Message: "not registered"}}}
	outage := map[key]view{csi: {KubeletView: api.KubeletView{State: api.KubeletUnknown, Reason: ReasonAPIUnavailable}}}
	holds := map[key]view{csi: {KubeletView: api.KubeletView{State: api.KubeletRegistered, Message: "held"}}}
	stale := []staleEntry{{driver: "old.example.com", message: "stale"}}
	rec := &recorder{}
	n := &Node{grace: 10 * time.Second}
	n.m = newMetrics(n, nil)
	l := newLoop(n, rec)
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	nd := node(nil, nil)
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	l.disagreements(at(0), up, lacks, stale, true, nd)
	l.disagreements(at(10), up, lacks, stale, true, nd) // both told
	l.disagreements(at(11), up, outage, nil, false, nd) // the API and the kubelet unreadable
	l.disagreements(at(40), up, outage, nil, false, nd)
	l.disagreements(at(41), up, lacks, stale, true, nd) // back: the same disagreements
	l.disagreements(at(60), up, lacks, stale, true, nd)
	l.disagreements(at(61), gone, holds, stale, true, nd) // another cause
	l.disagreements(at(71), gone, holds, stale, true, nd)
	var reasons []string
	for _, e := range rec.got {
		reasons = append(reasons, e[:strings.Index(e, "]")+1])
	}
	want := []string{
		"Warning KubeletDisagrees [Check CSIPlugin csi.example.com: NotRegistered]",
		"Warning KubeletDisagrees [Check CSIPlugin old.example.com: StaleCSINodeEntry]",
		"Warning KubeletDisagrees [Check CSIPlugin csi.example.com: SocketNotServed]",
	}
	slices.Sort(reasons[:2])
	if !slices.Equal(reasons, want) {
		t.Errorf("events:\n%s\nwant:\n%s", strings.Join(reasons, "\n"), strings.Join(want, "\n"))
	}
}

// sinkFunc answers every event write with err.
type sinkFunc func() error

func (f sinkFunc) Create(context.Context, *eventsv1.Event) (*eventsv1.Event, error) { return nil, f() }
func (f sinkFunc) Update(context.Context, *eventsv1.Event) (*eventsv1.Event, error) { return nil, f() }
func (f sinkFunc) Patch(context.Context, *eventsv1.Event, []byte) (*eventsv1.Event, error) {
	return nil, f()
}

// A refused event is a Problem that names the permission, until an event is
// written; a series patch whose event is gone (the machinery creates it
// anew) is none.
func TestEventSinkKeepsRefusals(t *testing.T) {
	n := &Node{problems: map[string]*Problem{}, log: slog.New(slog.DiscardHandler), clock: clock.RealClock{},
		eventWrite: writeOp{"record events about Node node-a", "create, patch events.events.k8s.io", "event"}}
	n.m = newMetrics(n, nil)
	var err error
	s := eventSink{n, sinkFunc(func() error { return err })}
	ctx := context.Background()
	problems := func() (out []Problem) { // of writes: the Node has no informers here
		for _, p := range n.problems {
			out = append(out, *p)
		}
		return out
	}
	err = apierrors.NewForbidden(schema.GroupResource{Group: "events.k8s.io", Resource: "events"}, "", errors.New("RBAC: no"))
	s.Create(ctx, &eventsv1.Event{})
	if ps := problems(); len(ps) != 1 || ps[0].Reason != ReasonForbidden || ps[0].Permission != "create, patch events.events.k8s.io" {
		t.Fatalf("problems after a refused event: %+v", ps)
	}
	err = nil
	s.Create(ctx, &eventsv1.Event{})
	if ps := problems(); len(ps) != 0 {
		t.Fatalf("problems after an event was written: %+v", ps)
	}
	err = apierrors.NewNotFound(schema.GroupResource{Group: "events.k8s.io", Resource: "events"}, "e")
	s.Patch(ctx, &eventsv1.Event{}, nil)
	if ps := problems(); len(ps) != 0 {
		t.Fatalf("problems after a series patch found no event: %+v", ps)
	}
}

// Stale CSINode entries are told of one by one up to maxStaleEntries (an
// event and a doctor finding each); the others are counted.
func TestStaleEntriesBounded(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	drivers := make([]storagev1.CSINodeDriver, 30000)
	for i := range drivers {
		drivers[i] = storagev1.CSINodeDriver{Name: fmt.Sprintf("d%d.example.com", i), NodeID: "node-a"}
	}
	s := snapshot{nodeName: "node-a", csiNode: csiNode(drivers...)}
	kn := kubeletstate.Evidence{Reading: &kubeletstate.Reading{At: t0, Started: t0.Add(-time.Hour)}}
	got, more := staleEntries(s, nil, kubeletFacts{live: true}, kn)
	if len(got) != maxStaleEntries || more != len(drivers)-maxStaleEntries || got[0].Driver != "d0.example.com" {
		t.Errorf("%d entries (first %+v) and %d more; want %d and %d", len(got), got[0], more, maxStaleEntries, len(drivers)-maxStaleEntries)
	}
}
