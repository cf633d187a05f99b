package caretaker

import (
	"context"
	"fmt"
	"reflect"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	testclock "k8s.io/utils/clock/testing"

	"github.com/plugd/plugd/internal/nodecond"
)

// summaryNode is a Node with plugd's condition about DevicePlugin a.
func summaryNode(name string, status corev1.ConditionStatus) *corev1.Node {
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, ManagedFields: []metav1.ManagedFieldsEntry{withTime(managed("plugd", "a/Ready"), t0)}},
		Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{cond("a", status, 0)}}}
}

// The summary is the census of the Nodes the informer holds (slim, as it
// holds them), written as one server-side apply of the ConfigMap; it is
// written again when the view changes, at most at each call (every
// summaryEvery), and every summaryRefresh when it does not; a change of a
// Node that leaves the view as it was writes nothing; a write refused is
// an error, and tried again.
func TestWriteSummary(t *testing.T) {
	clk := testclock.NewFakeClock(t0)
	cs := fake.NewClientset()
	var writes int
	refuse := false
	cs.PrependReactor("patch", "configmaps", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if p := a.(k8stesting.PatchAction); p.GetPatchType() != "application/apply-patch+yaml" || p.GetName() != nodecond.SummaryName {
			t.Errorf("a %s patch of %s", p.GetPatchType(), p.GetName())
		}
		if refuse {
			return true, nil, apierrors.NewForbidden(schema.GroupResource{Resource: "configmaps"}, nodecond.SummaryName, nil)
		}
		writes++
		return false, nil, nil // the tracker applies it
	})
	c := newCaretaker(cs.CoreV1(), cs.StorageV1(), cs, Config{}, clk)
	defer c.queue.ShutDown() // never Run: its queue's goroutine ends here
	c.summaries, c.summaryNamespace = cs.CoreV1().ConfigMaps("plugd"), "plugd"
	store := c.inf.GetStore()
	nodes := []*corev1.Node{summaryNode("n1", corev1.ConditionTrue), summaryNode("n2", corev1.ConditionFalse), {ObjectMeta: metav1.ObjectMeta{Name: "n3"}}}
	for _, n := range nodes {
		s, _ := slim(n)
		if err := store.Add(s); err != nil {
			t.Fatal(err)
		}
	}
	ctx := context.Background()
	check := func(step string, last *lastSummary, wantWrites int) {
		t.Helper()
		if writes != wantWrites {
			t.Fatalf("%s: %d writes, want %d", step, writes, wantWrites)
		}
		cm, err := cs.CoreV1().ConfigMaps("plugd").Get(ctx, nodecond.SummaryName, metav1.GetOptions{})
		if err != nil {
			t.Fatalf("%s: %v", step, err)
		}
		s, err := nodecond.DecodeSummary([]byte(cm.Data[nodecond.SummaryKey]))
		if err != nil {
			t.Fatalf("%s: %v", step, err)
		}
		// What a reader of every Node would count at that time.
		census := nodecond.Census{Now: s.Time}
		for _, n := range nodes {
			census.Add(n)
		}
		if want := census.View(); !reflect.DeepEqual(s.View, want) || !s.Complete || !s.Time.Equal(last.at) {
			t.Errorf("%s: the summary is %+v at %s, complete %v; a census of the Nodes counts %+v", step, s.View, s.Time, s.Complete, want)
		}
	}

	c.dirty.Store(true)
	last, err := c.writeSummary(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	check("first", last, 1)

	clk.Step(summaryEvery)
	if last, err = c.writeSummary(ctx, last); err != nil {
		t.Fatal(err)
	}
	check("nothing changed", last, 1)

	// A heartbeat: the census is not counted again (nothing else
	// changed), and nothing is written.
	update := func(i int, n *corev1.Node) {
		t.Helper()
		was, _ := slim(nodes[i])
		nodes[i] = n
		s, _ := slim(n)
		if err := store.Update(s); err != nil {
			t.Fatal(err)
		}
		c.updated(was, s)
	}
	beat := summaryNode("n1", corev1.ConditionTrue)
	beat.Status.Conditions[0].LastHeartbeatTime = metav1.NewTime(t0.Add(5 * time.Second))
	beat.ManagedFields[0].Time = &beat.Status.Conditions[0].LastHeartbeatTime
	update(0, beat)
	if c.dirty.Load() {
		t.Errorf("a heartbeat alone marks the summary to be counted again")
	}
	// A change that leaves the view as it was (a message): counted
	// again, nothing written.
	words := summaryNode("n1", corev1.ConditionTrue)
	words.Status.Conditions[0].Message = nodecond.Message("DevicePlugin", "a", "registered, in other words")
	update(0, words)
	if last, err = c.writeSummary(ctx, last); err != nil {
		t.Fatal(err)
	}
	check("the same view", last, 1)

	update(1, summaryNode("n2", corev1.ConditionTrue))
	if last, err = c.writeSummary(ctx, last); err != nil {
		t.Fatal(err)
	}
	check("a plugin ready", last, 2)

	clk.Step(summaryRefresh)
	if last, err = c.writeSummary(ctx, last); err != nil {
		t.Fatal(err)
	}
	check("a minute later", last, 3)

	refuse = true
	clk.Step(summaryRefresh)
	next, err := c.writeSummary(ctx, last)
	if !apierrors.IsForbidden(err) || next != last {
		t.Errorf("a write refused: %v, %v", next, err)
	}
}

// Run writes the summary once the informer has listed the Nodes, and
// returns, its summarizing goroutine ended, when ctx ends (goleak).
func TestRunWritesSummary(t *testing.T) {
	clk := testclock.NewFakeClock(t0)
	cs := fake.NewClientset(summaryNode("n1", corev1.ConditionTrue))
	written := make(chan struct{}, 10)
	cs.PrependReactor("patch", "configmaps", func(k8stesting.Action) (bool, runtime.Object, error) {
		written <- struct{}{}
		return false, nil, nil
	})
	c := newCaretaker(cs.CoreV1(), cs.StorageV1(), cs, Config{}, clk)
	c.summaries, c.summaryNamespace = cs.CoreV1().ConfigMaps("plugd"), "plugd"
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- c.Run(ctx) }()
	select {
	case <-written:
	case <-time.After(10 * time.Second):
		t.Fatal("no summary written within 10s of Run")
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// The census the caretaker counts every 10 seconds while Nodes change (a
// live fleet's heartbeats change them all the time), over the slim Nodes
// of a cluster of 65,000, each with plugd's conditions for three plugins.
func BenchmarkSummaryCensus(b *testing.B) {
	var nodes []*corev1.Node
	for i := range 65000 {
		n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("node-%05d", i),
			ManagedFields: []metav1.ManagedFieldsEntry{withTime(managed("plugd", "a/Ready", "b/Ready", "c/Ready"), t0)}}}
		for _, p := range []string{"a", "b", "c"} {
			n.Status.Conditions = append(n.Status.Conditions, cond(p, corev1.ConditionTrue, 0))
		}
		nodes = append(nodes, n)
	}
	b.ReportAllocs()
	for b.Loop() {
		census := nodecond.Census{Now: t0}
		for _, n := range nodes {
			census.Add(n)
		}
		if v := census.View(); v.Nodes != len(nodes) {
			b.Fatal(v.Nodes)
		}
	}
}
