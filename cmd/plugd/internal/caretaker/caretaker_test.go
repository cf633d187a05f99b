package caretaker

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	testclock "k8s.io/utils/clock/testing"

	"github.com/plugd/plugd/internal/nodecond"
	"github.com/plugd/plugd/internal/testenv"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

type looked struct {
	name    string
	next    time.Time
	pods    podSighting
	drivers map[string]time.Time
}

// Run on a fake clock: a condition stale at start (by the API server's
// record of plugd's last write) is marked at once; one
// that goes stale later is looked at again when it does, by a timer on the
// clock, and marked then; another's condition in plugd's form is never
// written. Each write is one patch of nodes/status, as plugd's field
// manager.
func TestRun(t *testing.T) {
	clk := testclock.NewFakeClock(t0)
	// plugd's, written (by the API server's record) as long ago as the
	// heartbeat says.
	mine := func(age time.Duration) []metav1.ManagedFieldsEntry {
		return []metav1.ManagedFieldsEntry{withTime(managed("plugd", "a/Ready"), t0.Add(-age))}
	}
	nodes := []runtime.Object{
		&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "old", ManagedFields: mine(20 * time.Minute)}, Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{cond("a", corev1.ConditionTrue, 20*time.Minute)}}},
		&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "later", ManagedFields: mine(5 * time.Minute)}, Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{cond("a", corev1.ConditionTrue, 5*time.Minute)}}},
		&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "other", ManagedFields: []metav1.ManagedFieldsEntry{managed("kubectl-edit", "a/Ready")}},
			Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{cond("a", corev1.ConditionTrue, 20*time.Minute)}}},
	}
	cs := fake.NewClientset()
	for _, n := range nodes {
		// The tracker keeps managedFields as given (a fake clientset's
		// own do not record the status subresource).
		if err := cs.Tracker().Add(n); err != nil {
			t.Fatal(err)
		}
	}
	patched := make(chan string, 10)
	var mu sync.Mutex
	var patches []k8stesting.PatchAction
	cs.PrependReactor("patch", "nodes", func(a k8stesting.Action) (bool, runtime.Object, error) {
		p := a.(k8stesting.PatchAction)
		mu.Lock()
		patches = append(patches, p)
		mu.Unlock()
		patched <- p.GetName()
		return false, nil, nil // the tracker applies it
	})
	looks := make(chan looked, 100)
	c := newCaretaker(cs.CoreV1(), cs.StorageV1(), cs, Config{}, clk)
	c.looked = func(name string, next time.Time, pods podSighting, drivers map[string]time.Time) {
		looks <- looked{name, next, pods, drivers}
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- c.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()

	if got := waitFor(t, patched); got != "old" {
		t.Fatalf("first patch of %s, want old", got)
	}
	marked := func(name string) {
		t.Helper()
		n, err := cs.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		c := n.Status.Conditions[0]
		hb := nodes[0].(*corev1.Node).Status.Conditions[0].LastHeartbeatTime
		if name == "later" {
			hb = nodes[1].(*corev1.Node).Status.Conditions[0].LastHeartbeatTime
		}
		if c.Status != corev1.ConditionUnknown || c.Reason != nodecond.ReasonNotMaintained || !c.LastHeartbeatTime.Equal(&hb) || !c.LastTransitionTime.Time.Equal(clk.Now().Truncate(time.Second)) {
			t.Errorf("%s: %+v", name, c)
		}
	}
	marked("old")

	// "later" goes stale 6 minutes on: the caretaker wants to look then.
	due := t0.Add(nodecond.MaxHeartbeatAge - 5*time.Minute + time.Nanosecond)
	for l := waitLook(t, looks); l.name != "later" || !l.next.Equal(due); l = waitLook(t, looks) {
		if l.name == "later" {
			t.Fatalf("later looked at, next %v, want %v", l.next, due)
		}
	}
	select {
	case p := <-patched:
		t.Fatalf("%s patched before the clock moved", p)
	default:
	}
	clk.SetTime(due)
	if got := waitFor(t, patched); got != "later" {
		t.Fatalf("patch of %s, want later", got)
	}
	marked("later")

	mu.Lock()
	defer mu.Unlock()
	for _, p := range patches {
		if p.GetSubresource() != "status" || p.GetPatchType() != "application/json-patch+json" || p.GetName() == "other" {
			t.Errorf("patch %s/%s %s", p.GetName(), p.GetSubresource(), p.GetPatchType())
		}
	}
	if len(patches) != 2 {
		t.Errorf("%d patches, want 2", len(patches))
	}
}

func waitFor(t *testing.T, ch <-chan string) string {
	t.Helper()
	select {
	case s := <-ch:
		return s
	case <-time.After(testenv.Timeout):
		t.Fatal("no patch")
		return ""
	}
}

func waitLook(t *testing.T, ch <-chan looked) looked {
	t.Helper()
	select {
	case l := <-ch:
		return l
	case <-time.After(testenv.Timeout):
		t.Fatal("no look")
		return looked{}
	}
}

// A condition whose mark an admission policy refuses (its type no longer
// listed as plugd's: dropped from expect while plugd was down) leaves the
// others marked: one patch a condition. The refusal is logged once, with
// the condition and the policy's reason, however often it is retried.
func TestMarkRefusedOne(t *testing.T) {
	clk := testclock.NewFakeClock(t0)
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n",
		ManagedFields: []metav1.ManagedFieldsEntry{withTime(managed("plugd", "a/Ready", "gone/Ready"), t0.Add(-20*time.Minute))}},
		Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{
			cond("gone", corev1.ConditionTrue, 20*time.Minute), cond("a", corev1.ConditionTrue, 20*time.Minute)}}}
	// The simple fake: NewClientset's field manager would take gone/Ready
	// out of plugd's managedFields at the first mark of another, where
	// the API server keeps what an Update's manager held.
	cs := fake.NewSimpleClientset() //nolint:staticcheck // see above
	if err := cs.Tracker().Add(n); err != nil {
		t.Fatal(err)
	}
	const reason = "the caretaker may set only plugd's conditions"
	refused := make(chan struct{}, 100)
	cs.PrependReactor("patch", "nodes", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if !strings.Contains(string(a.(k8stesting.PatchAction).GetPatch()), "gone/Ready") {
			return false, nil, nil // the tracker applies it
		}
		select {
		case refused <- struct{}{}:
		default:
		}
		err := apierrors.NewInvalid(schema.GroupKind{Kind: "Node"}, "n", nil)
		err.ErrStatus.Message = "ValidatingAdmissionPolicy 'plugd-caretaker' with binding 'plugd-caretaker' denied request: " + reason
		return true, nil, err
	})
	logs := &lines{wrote: make(chan struct{}, 100)}
	c := newCaretaker(cs.CoreV1(), cs.StorageV1(), cs, Config{Logger: slog.New(slog.NewTextHandler(logs, nil))}, clk)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- c.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	wait := func(k int) {
		t.Helper()
		for range k {
			select {
			case <-refused:
			case <-time.After(testenv.Timeout):
				t.Fatal("no refused patch")
			}
		}
	}
	wait(markTries)
	select {
	case <-logs.wrote:
	case <-time.After(testenv.Timeout):
		t.Fatal("the refusal not logged")
	}
	// Again, not after the backoff (on the fake clock) but at a change of
	// plugd's conditions; the first refusal of a third look says the second is
	// decided, logged or not.
	touched := 0
	touch := func() {
		t.Helper()
		m, err := cs.CoreV1().Nodes().Get(ctx, "n", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		touched++
		m.Status.Conditions[1].Reason = fmt.Sprint("Touched", touched) // a/Ready, marked already
		m.ResourceVersion = ""
		if err := cs.Tracker().Update(schema.GroupVersionResource{Version: "v1", Resource: "nodes"}, m, ""); err != nil {
			t.Fatal(err)
		}
	}
	touch()
	wait(markTries)
	touch()
	wait(1)
	got, err := cs.CoreV1().Nodes().Get(ctx, "n", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if a := got.Status.Conditions[1]; a.Type != "a/Ready" || a.Status != corev1.ConditionUnknown || !strings.Contains(a.Message, "marked by plugd's caretaker") {
		t.Errorf("a/Ready not marked beside the refused one: %+v", a)
	}
	if g := got.Status.Conditions[0]; g.Status != corev1.ConditionTrue {
		t.Errorf("gone/Ready changed: %+v", g)
	}
	warned := 0
	for _, l := range logs.get() {
		if strings.Contains(l, "cannot mark") {
			warned++
			if !strings.Contains(l, "gone/Ready") || !strings.Contains(l, reason) {
				t.Errorf("the warning names neither the condition nor the reason: %s", l)
			}
		}
	}
	if warned != 1 {
		t.Errorf("%d warnings of the refusal, want 1: %q", warned, logs.get())
	}
}

// lines is a log's output, a line a record.
type lines struct {
	mu    sync.Mutex
	l     []string
	wrote chan struct{} // told of each line
}

func (w *lines) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.l = append(w.l, string(p))
	select {
	case w.wrote <- struct{}{}:
	default:
	}
	return len(p), nil
}

func (w *lines) get() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.l)
}

// Issue 32, item 5, on a fake clock: plugd's pod deleted and a new one
// Ready within the grace (a DaemonSet's rolling update) writes nothing;
// the pod gone past the grace marks the node's conditions
// PlugdNotRunning; a CSI driver the kubelet drops from CSINode marks its
// True condition after the CSINode grace. Only the node whose plugd is
// gone is written, one patch a condition; the pods are listed by the
// selector alone.
func TestRunSigns(t *testing.T) {
	clk := testclock.NewFakeClock(t0)
	const ns, grace, csiGrace = "plugd", 40 * time.Second, 10 * time.Second
	sel := map[string]string{"app.kubernetes.io/name": "plugd"}
	// A fresh heartbeat, plugd's (by the API server's record), of a
	// device plugin and a CSI driver.
	nodeOf := func(name string) *corev1.Node {
		a, c := cond("a", corev1.ConditionTrue, time.Minute), csiCond("csi.example.com", corev1.ConditionTrue, time.Minute)
		return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name,
			ManagedFields: []metav1.ManagedFieldsEntry{withTime(managed("plugd", string(a.Type), string(c.Type)), t0.Add(-time.Minute))}},
			Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{a, c}}}
	}
	pod := func(name, node string, ready bool) *corev1.Pod {
		st := corev1.ConditionFalse
		if ready {
			st = corev1.ConditionTrue
		}
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: sel}, Spec: corev1.PodSpec{NodeName: node},
			Status: corev1.PodStatus{Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: st}}}}
	}
	csiNode := func(name string, drivers ...string) *storagev1.CSINode {
		n := &storagev1.CSINode{ObjectMeta: metav1.ObjectMeta{Name: name}}
		for _, d := range drivers {
			n.Spec.Drivers = append(n.Spec.Drivers, storagev1.CSINodeDriver{Name: d, NodeID: name})
		}
		return n
	}
	other := pod("other-ns", "rolled", true)
	other.Namespace = "elsewhere"
	cs := fake.NewClientset(nodeOf("rolled"), nodeOf("gone"), nodeOf("dropped"),
		pod("p-rolled", "rolled", true), pod("p-gone", "gone", true), pod("p-dropped", "dropped", true), other,
		csiNode("rolled", "csi.example.com"), csiNode("gone", "csi.example.com"), csiNode("dropped", "csi.example.com"))
	var mu sync.Mutex
	var patches []string
	patched := make(chan string, 10)
	cs.PrependReactor("patch", "nodes", func(a k8stesting.Action) (bool, runtime.Object, error) {
		p := a.(k8stesting.PatchAction)
		mu.Lock()
		patches = append(patches, p.GetName()+": "+string(p.GetPatch()))
		mu.Unlock()
		patched <- p.GetName()
		return false, nil, nil
	})
	var lists []string
	cs.PrependReactor("list", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
		l := a.(k8stesting.ListAction)
		mu.Lock()
		lists = append(lists, l.GetNamespace()+" "+l.GetListRestrictions().Labels.String())
		mu.Unlock()
		return false, nil, nil
	})
	looks := make(chan looked, 100)
	c := newCaretaker(cs.CoreV1(), cs.StorageV1(), cs, Config{PlugdNamespace: ns, PlugdSelector: "app.kubernetes.io/name=plugd", PodGrace: grace, CSINodeGrace: csiGrace}, clk)
	c.looked = func(name string, next time.Time, pods podSighting, drivers map[string]time.Time) {
		looks <- looked{name, next, pods, drivers}
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- c.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	// Each node looked at with its pod Ready and its driver listed, as
	// the caretaker saw them.
	var want []func(looked) bool
	for _, name := range []string{"rolled", "gone", "dropped"} {
		want = append(want, func(l looked) bool {
			_, listed := l.drivers["csi.example.com"]
			return l.name == name && l.pods.seen && l.pods.down.IsZero() && listed
		})
	}
	waitLooks(t, looks, want...)

	pods := cs.CoreV1().Pods(ns)
	// rolled: deleted, a new pod, Ready 20s on. gone: deleted for good.
	for _, p := range []string{"p-rolled", "p-gone"} {
		if err := pods.Delete(ctx, p, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	downAt := t0.Add(grace + time.Nanosecond)
	waitLooks(t, looks, func(l looked) bool { return l.name == "gone" && l.next.Equal(downAt) },
		func(l looked) bool { return l.name == "rolled" && l.next.Equal(downAt) })
	if _, err := pods.Create(ctx, pod("p-rolled-2", "rolled", false), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	clk.Step(20 * time.Second)
	if _, err := pods.UpdateStatus(ctx, pod("p-rolled-2", "rolled", true), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitLooks(t, looks, func(l looked) bool {
		return l.name == "rolled" && l.next.Equal(t0.Add(nodecond.MaxHeartbeatAge-time.Minute+time.Nanosecond))
	})
	// dropped: the kubelet drops the driver; its pod stays Ready.
	if _, err := cs.StorageV1().CSINodes().Update(ctx, csiNode("dropped"), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitLooks(t, looks, func(l looked) bool {
		return l.name == "dropped" && l.next.Equal(t0.Add(20*time.Second+csiGrace+time.Nanosecond))
	})
	select {
	case p := <-patched:
		t.Fatalf("%s patched before any grace passed", p)
	default:
	}
	clk.SetTime(t0.Add(20*time.Second + csiGrace + time.Nanosecond))
	if got := waitFor(t, patched); got != "dropped" {
		t.Fatalf("patch of %s, want dropped", got)
	}
	clk.SetTime(downAt)
	for range 2 {
		if got := waitFor(t, patched); got != "gone" {
			t.Fatalf("patch of %s, want gone", got)
		}
	}
	for _, name := range []string{"dropped", "gone"} {
		n, err := cs.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for _, cd := range n.Status.Conditions {
			wantUnknown := name == "gone" || cd.Type == "csi.example.com/CSIPluginReady"
			if got := cd.Status == corev1.ConditionUnknown && cd.Reason == nodecond.ReasonPlugdNotRunning; got != wantUnknown {
				t.Errorf("%s %s: %s %s %q", name, cd.Type, cd.Status, cd.Reason, cd.Message)
			}
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if len(patches) != 3 {
		t.Errorf("%d patches, want 3 (dropped's CSI condition, gone's two): %q", len(patches), patches)
	}
	for _, l := range lists {
		if l != ns+" app.kubernetes.io/name=plugd" {
			t.Errorf("pods listed as %q, want only plugd's in %s", l, ns)
		}
	}
}

// waitLooks waits for a look each of want accepts, in any order.
func waitLooks(t *testing.T, ch <-chan looked, want ...func(looked) bool) {
	t.Helper()
	var seen []looked
	for len(want) > 0 {
		select {
		case l := <-ch:
			if i := slices.IndexFunc(want, func(ok func(looked) bool) bool { return ok(l) }); i >= 0 {
				want = slices.Delete(want, i, i+1)
				continue
			}
			seen = append(seen, l)
		case <-time.After(testenv.Timeout):
			t.Fatalf("no such look; saw %v", seen)
		}
	}
}

// Bad flags are refused before the caretaker reads anything, saying which
// and what to give.
func TestCommandFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--pod-grace", "0s"}, "--pod-grace 0s: give a positive duration, such as 40s"},
		{[]string{"--csinode-grace", "-1s"}, "--csinode-grace -1s: give a positive duration, such as 10s, or 0 to watch no CSINodes"},
		{[]string{"--plugd-namespace", "plugd", "--plugd-selector", "a in (b"}, `--plugd-selector "a in (b"`},
		{[]string{"--plugd-selector", "app=plugd"}, `--plugd-selector "app=plugd" without --plugd-namespace`},
	} {
		cmd := Command()
		cmd.SetArgs(tc.args)
		if err := cmd.Execute(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: %v, want %q", tc.args, err, tc.want)
		}
	}
}

// Pods the caretaker may not read (a Role missing: an older RBAC) take
// none of its other signs away: a stale heartbeat is marked all the same,
// and the refusal is logged once, naming the permission.
func TestRunPodsForbidden(t *testing.T) {
	clk := testclock.NewFakeClock(t0)
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "old",
		ManagedFields: []metav1.ManagedFieldsEntry{withTime(managed("plugd", "a/Ready"), t0.Add(-20*time.Minute))}},
		Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{cond("a", corev1.ConditionTrue, 20*time.Minute)}}}
	cs := fake.NewClientset(n)
	forbid := func(verb string) {
		cs.PrependReactor(verb, "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
			return true, nil, apierrors.NewForbidden(schema.GroupResource{Resource: "pods"}, "", fmt.Errorf("RBAC: no"))
		})
	}
	forbid("list")
	forbid("watch")
	patched := make(chan string, 10)
	cs.PrependReactor("patch", "nodes", func(a k8stesting.Action) (bool, runtime.Object, error) {
		patched <- a.(k8stesting.PatchAction).GetName()
		return false, nil, nil
	})
	logs := &lines{wrote: make(chan struct{}, 100)}
	c := newCaretaker(cs.CoreV1(), cs.StorageV1(), cs, Config{Logger: slog.New(slog.NewTextHandler(logs, nil)), PlugdNamespace: "plugd", PlugdSelector: "app=plugd"}, clk)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- c.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	if got := waitFor(t, patched); got != "old" {
		t.Fatalf("patch of %s, want old", got)
	}
	for !slices.ContainsFunc(logs.get(), func(l string) bool { return strings.Contains(l, "cannot read plugd's pods") }) {
		select {
		case <-logs.wrote:
		case <-time.After(testenv.Timeout):
			t.Fatalf("the refusal not logged: %q", logs.get())
		}
	}
	warned := 0
	for _, l := range logs.get() {
		if strings.Contains(l, "cannot read plugd's pods") {
			warned++
			if !strings.Contains(l, `list, watch pods in namespace plugd`) {
				t.Errorf("the warning does not name the permission: %s", l)
			}
		}
	}
	if warned != 1 {
		t.Errorf("%d warnings, want 1: %q", warned, logs.get())
	}
}
