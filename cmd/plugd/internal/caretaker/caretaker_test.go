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
	name string
	next time.Time
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
	c := newCaretaker(cs.CoreV1().Nodes(), cs, Config{}, clk)
	c.looked = func(name string, next time.Time) { looks <- looked{name, next} }
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
	c := newCaretaker(cs.CoreV1().Nodes(), cs, Config{Logger: slog.New(slog.NewTextHandler(logs, nil))}, clk)
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
