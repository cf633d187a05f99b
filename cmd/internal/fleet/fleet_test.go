package fleet

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"
	"unicode"
	"unicode/utf8"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	kjson "k8s.io/apimachinery/pkg/runtime/serializer/json"
	"k8s.io/apimachinery/pkg/runtime/serializer/protobuf"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"

	"github.com/plugd/plugd/api"
	"github.com/plugd/plugd/cmd/internal/printer"
	"github.com/plugd/plugd/internal/nodecond"
)

func TestWriteCluster(t *testing.T) {
	now := time.Now()
	v := nodecond.ClusterView{Nodes: 3, NodesWithPlugd: 3, Plugins: []nodecond.ClusterPlugin{
		{Type: "CSIPlugin", Name: "csi.example.com", Condition: "csi.example.com/CSIPluginReady", Ready: 2, Expected: 3,
			NotReady: []nodecond.NodeCondition{{Node: "node-c", Status: "False", Reason: "SocketMissing", Message: "plugd: CSIPlugin csi.example.com: no socket", Since: now.Add(-3 * time.Minute)}}},
	}}
	var b strings.Builder
	if err := WriteCluster(&b, v, Format{Wide: true}, now); err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"TYPE        NAME              READY   EXPECTED   CONDITION", "CSIPlugin   csi.example.com   2       3          csi.example.com/CSIPluginReady",
		"3 nodes, 3 with plugd's conditions", "CSIPlugin csi.example.com: not ready on 1 of 3 nodes", "node-c   False    SocketMissing   3m      plugd: CSIPlugin"} {
		if !strings.Contains(b.String(), s) {
			t.Errorf("cluster -o wide does not print %q:\n%s", s, b.String())
		}
	}
	b.Reset()
	WriteCluster(&b, nodecond.ClusterView{Nodes: 2}, Format{}, now)
	if !strings.Contains(b.String(), "no node has a condition of plugd's (2 nodes)") {
		t.Errorf("empty cluster:\n%s", b.String())
	}
}

// A page decoded for its names and conditions only counts what a whole
// decode counts, in the API server's protobuf and in JSON alike; the
// continue token comes through; a malformed page is an error, not a panic.
func TestAddPage(t *testing.T) {
	cond := func(typ string, status corev1.ConditionStatus, plugin string) corev1.NodeCondition {
		f := strings.Fields(plugin)
		return corev1.NodeCondition{Type: corev1.NodeConditionType(typ), Status: status, Reason: "R", Message: nodecond.Message(f[0], f[1], "why"),
			LastTransitionTime: metav1.NewTime(time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC))}
	}
	list := &corev1.NodeList{ListMeta: metav1.ListMeta{Continue: "next-page", ResourceVersion: "42"}, Items: []corev1.Node{
		{ObjectMeta: metav1.ObjectMeta{Name: "a", Labels: map[string]string{"x": "y"}, ManagedFields: append(managedBy("kubelet", "Ready"), managedBy(nodecond.FieldManager, "c/CSIPluginReady")...)}, Status: corev1.NodeStatus{
			Conditions: []corev1.NodeCondition{cond("c/CSIPluginReady", corev1.ConditionFalse, "CSIPlugin c"), {Type: "Ready", Status: "True"}},
			Images:     []corev1.ContainerImage{{Names: []string{"registry.example.com/a@sha256:00"}, SizeBytes: 1}}}},
		{ObjectMeta: metav1.ObjectMeta{Name: "b", ManagedFields: managedBy(nodecond.FieldManager, "c/CSIPluginReady")}, Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{cond("c/CSIPluginReady", corev1.ConditionTrue, "CSIPlugin c")}}},
		{ObjectMeta: metav1.ObjectMeta{Name: "c"}},
		// plugd's form, written by someone else: not plugd's.
		{ObjectMeta: metav1.ObjectMeta{Name: "d", ManagedFields: managedBy("kubectl-edit", "c/CSIPluginReady")}, Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{cond("c/CSIPluginReady", corev1.ConditionFalse, "CSIPlugin c")}}},
	}}
	list.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("NodeList"))
	var want nodecond.Census
	for i := range list.Items {
		want.Add(&list.Items[i])
	}
	if v := want.View(); v.Nodes != 4 || v.NodesWithPlugd != 2 || len(v.Plugins) != 1 || v.Plugins[0].Expected != 2 {
		t.Fatalf("the whole decode counts %+v", v)
	}
	pb := protobuf.NewSerializer(scheme.Scheme, scheme.Scheme)
	for _, enc := range []struct {
		name string
		s    runtime.Encoder
	}{{"protobuf", pb}, {"json", kjson.NewSerializerWithOptions(kjson.DefaultMetaFactory, scheme.Scheme, scheme.Scheme, kjson.SerializerOptions{})}} {
		var b bytes.Buffer
		if err := enc.s.Encode(list, &b); err != nil {
			t.Fatal(err)
		}
		var got nodecond.Census
		cont, n, err := addPage(b.Bytes(), enc.name, &got)
		g, _ := json.Marshal(got.View())
		w, _ := json.Marshal(want.View())
		tok, terr := continueToken(b.Bytes())
		if err != nil || cont != "next-page" || n != 4 || tok != cont || terr != nil || !bytes.Equal(g, w) {
			t.Errorf("%s: continue %q, %v:\n got %+v\nwant %+v", enc.name, cont, err, got.View(), want.View())
		}
		if enc.name != "protobuf" {
			continue
		}
		for n := 5; n < b.Len(); n += 7 {
			var c nodecond.Census
			if _, _, err := addPage(b.Bytes()[:n], enc.name, &c); err == nil && n < b.Len()-1 {
				// A cut that falls between two fields parses; it must not
				// count more than the whole.
				if v := c.View(); v.Nodes > 4 {
					t.Errorf("cut at %d: %+v", n, v)
				}
			}
		}
	}
	if _, _, err := addPage([]byte("<html>proxy error</html>"), "text/html", new(nodecond.Census)); err == nil {
		t.Error("an HTML page was taken for Nodes")
	}
}

// plugd's own report comes through the API server's proxy to its pod's
// status port. A real API server here proxies to no pod (they would be on
// loopback, which it refuses), so this one answers as it would.
func TestReportThroughProxy(t *testing.T) {
	want := api.FindingList{Findings: []api.Finding{{Severity: api.SeverityWarning, Check: "stale-socket", Summary: "stale socket"}}}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/api/v1/namespaces/plugd/pods/http:plugd-abc:9090/proxy/v1/findings" {
			http.Error(w, "no such path "+r.URL.Path, http.StatusNotFound)
			return
		}
		json.NewEncoder(w).Encode(want)
	}))
	defer srv.Close()
	c, err := NewClients(&rest.Config{Host: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "plugd-abc", Namespace: "plugd"},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Ports: []corev1.ContainerPort{{Name: "status", ContainerPort: 9090}}}}}}
	got := reportFindings(context.Background(), c, pod, DoctorOptions{ReportTimeout: 5 * time.Second})
	if len(got) != 1 || got[0].Check != "stale-socket" {
		t.Errorf("plugd's report: %+v", got)
	}
	pod.Name = "plugd-gone"
	if got := reportFindings(context.Background(), c, pod, DoctorOptions{ReportTimeout: 5 * time.Second}); len(got) != 1 || got[0].Check != "report-unreachable" ||
		!strings.Contains(got[0].Remedy, "kubectl -n plugd exec plugd-gone -- plugctl") {
		t.Errorf("an unreachable report: %+v", got)
	}
}

// managedBy is the managedFields entry the API server records when manager
// sets conditions of these types through nodes/status.
func managedBy(manager string, types ...string) []metav1.ManagedFieldsEntry {
	conds := map[string]any{}
	for _, typ := range types {
		k, _ := json.Marshal(map[string]string{"type": typ})
		conds["k:"+string(k)] = map[string]any{".": map[string]any{}, "f:message": map[string]any{}, "f:status": map[string]any{}, "f:type": map[string]any{}}
	}
	raw, _ := json.Marshal(map[string]any{"f:status": map[string]any{"f:conditions": conds}})
	return []metav1.ManagedFieldsEntry{{Manager: manager, Operation: metav1.ManagedFieldsOperationUpdate, APIVersion: "v1",
		FieldsType: "FieldsV1", FieldsV1: &metav1.FieldsV1{Raw: raw}, Subresource: "status"}}
}

// Issue 25, item 11: the node view and the doctor take as plugd's only the
// conditions plugd set, as the managedFields say; one in plugd's form that
// another manager wrote is not shown as an expected plugin, nor found as
// one that is not ready.
func TestNodeShowsOnlyPlugdsConditions(t *testing.T) {
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "a", ManagedFields: append(managedBy(nodecond.FieldManager, "mine"), managedBy("intruder", "forged")...)},
		Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{
			{Type: "Ready", Status: corev1.ConditionTrue},
			{Type: "mine", Status: corev1.ConditionTrue, Reason: "PluginReady", Message: nodecond.Message("CSIPlugin", "mine.example.com", "ready")},
			{Type: "forged", Status: corev1.ConditionFalse, Reason: "SocketMissing", Message: nodecond.Message("CSIPlugin", "forged.example.com", "gone")},
		}}}
	if ps := pluginsOf(n); len(ps) != 1 || ps[0].Name != "mine.example.com" {
		t.Errorf("node view: %+v", ps)
	}
	for _, f := range nodeFindings(n) {
		if f.Check == "plugin-not-ready" {
			t.Errorf("doctor found a condition another manager wrote: %+v", f)
		}
	}
}

// Issue 25, item 11: -o wide prints a message of a megabyte (the API
// bounds none) cut, visibly, at a character boundary, with nothing in it a
// terminal acts on; so do the node view and the doctor's text.
func TestWideCutsForeignText(t *testing.T) {
	huge := "plugd: CSIPlugin c: " + strings.Repeat("é\u009b\u202e\x7f", 1<<18) // 1.25 MiB
	now := time.Now()
	var b strings.Builder
	v := nodecond.ClusterView{Nodes: 1, NodesWithPlugd: 1, Plugins: []nodecond.ClusterPlugin{{Type: "CSIPlugin", Name: "c", Condition: "c/CSIPluginReady", Expected: 1,
		NotReady: []nodecond.NodeCondition{{Node: "a", Status: "False", Reason: huge, Message: huge}}}}}
	if err := WriteCluster(&b, v, Format{Wide: true}, now); err != nil {
		t.Fatal(err)
	}
	checkCut(t, "cluster -o wide", b.String(), 1024)
	b.Reset()
	if err := WriteNode(&b, NodeView{Node: "a", Ready: "True", Plugins: []NodePlugin{{Type: "CSIPlugin", Name: "c", Status: "False", Reason: huge, Message: huge}},
		Unreadable: []string{huge}}, Format{Wide: true}, now); err != nil {
		t.Fatal(err)
	}
	checkCut(t, "node -o wide", b.String(), 2048)
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "a"}, Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{{Type: "Ready", Status: "False", Reason: huge, Message: huge}}}}
	fs := nodeFindings(n)
	b.Reset()
	if err := printer.Findings(&b, "doctor", fs); err != nil {
		t.Fatal(err)
	}
	checkCut(t, "doctor", b.String(), 2048)
	if js, _ := json.Marshal(fs); len(js) > 4096 {
		t.Errorf("doctor -o json holds %d bytes of a Node's text", len(js))
	}
}

// checkCut fails if out is longer than max bytes, has no visible cut, is
// not valid UTF-8, or holds a character a terminal acts on.
func checkCut(t *testing.T, what, out string, max int) {
	t.Helper()
	if len(out) > max || !strings.Contains(out, "...") || !utf8.ValidString(out) {
		t.Errorf("%s: %d bytes (at most %d), cut visibly %v, valid UTF-8 %v", what, len(out), max, strings.Contains(out, "..."), utf8.ValidString(out))
	}
	if i := strings.IndexFunc(out, func(r rune) bool { return r != '\n' && !unicode.IsPrint(r) && r != ' ' }); i >= 0 {
		t.Errorf("%s lets %q through raw", what, out[i:min(i+4, len(out))])
	}
}

// Issue 33, item 7: an API server whose list of Nodes never ends (a
// continue token on every page) stops the read at a bound, with an error
// that names the bound and what to do, after no more requests than the
// bound allows; a list that ends within the bounds is read whole.
func TestClusterBoundsAnEndlessList(t *testing.T) {
	const nodesPerPage = 3
	for _, tc := range []struct {
		name     string
		limits   listLimits
		nodes    bool // pages hold Nodes, else they are empty
		pages    int  // pages the list has (0: endless)
		want     string
		requests int32 // at most; the next page may be asked for while one is decoded
	}{
		{name: "empty pages", limits: defaultListLimits, want: fmt.Sprintf("%d pages of at most %d Nodes", MaxListPages, PageSize), requests: MaxListPages},
		{name: "nodes", limits: listLimits{pages: 100, nodes: 10, bytes: 1 << 30}, nodes: true, want: "more than 10 Nodes", requests: 5},
		{name: "bytes", limits: listLimits{pages: 100, nodes: 1000, bytes: 1 << 10}, nodes: true, want: "more than 0 MiB", requests: 3},
		{name: "ends", limits: listLimits{pages: 3, nodes: 9, bytes: 1 << 20}, nodes: true, pages: 3, requests: 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var requests atomic.Int32
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				page := int(requests.Add(1))
				l := corev1.NodeList{ListMeta: metav1.ListMeta{Continue: "again"}}
				if tc.pages > 0 && page == tc.pages {
					l.Continue = ""
				}
				for i := 0; tc.nodes && i < nodesPerPage; i++ {
					l.Items = append(l.Items, corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("n-%d-%d", page, i), Labels: map[string]string{"pad": strings.Repeat("x", 60)}}})
				}
				w.Header().Set("Content-Type", "application/json")
				json.NewEncoder(w).Encode(l)
			}))
			defer srv.Close()
			c, err := NewClients(&rest.Config{Host: srv.URL, QPS: -1}) // no client-side rate limit
			if err != nil {
				t.Fatal(err)
			}
			v, err := cluster(context.Background(), c.Core.RESTClient(), "", 0, tc.limits)
			if tc.want == "" {
				if err != nil || v.Nodes != tc.pages*nodesPerPage {
					t.Fatalf("a list of %d pages: %d nodes, %v", tc.pages, v.Nodes, err)
				}
			} else if !errors.Is(err, ErrListTooLong) || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "-l") {
				t.Fatalf("an endless list: %v; want ErrListTooLong naming %q and what to do", err, tc.want)
			}
			if n := requests.Load(); n > tc.requests {
				t.Errorf("%d requests, want at most %d", n, tc.requests)
			}
		})
	}
}

// Issue 33, info: a node with thousands of CSI drivers is summed up in the
// node view (ten names and a count), not printed on one line of hundreds
// of kilobytes; -o wide lists them all.
func TestNodeViewCountsManyDrivers(t *testing.T) {
	v := NodeView{Node: "a", Ready: "True"}
	for i := range 30000 {
		v.Kubelet.CSIDrivers = append(v.Kubelet.CSIDrivers, CSIDriver{Name: fmt.Sprintf("csi-%05d.example.com", i)})
	}
	var b strings.Builder
	if err := WriteNode(&b, v, Format{}, time.Now()); err != nil {
		t.Fatal(err)
	}
	if b.Len() > 2048 || !strings.Contains(b.String(), "csi-00009.example.com and 29990 more (30000 in all; -o wide or -o json lists them)") {
		t.Errorf("the node view of 30,000 drivers: %d bytes:\n%.2048s", b.Len(), b.String())
	}
	b.Reset()
	if err := WriteNode(&b, v, Format{Wide: true}, time.Now()); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(b.String(), "csi-29999.example.com") {
		t.Errorf("-o wide does not list every driver")
	}
}

// A resource's condition (an expect entry with anyOf) says which plugin
// holds it: the node view has it apart, in a column of its own.
func TestNodeViewHeldBy(t *testing.T) {
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "a", ManagedFields: managedBy(nodecond.FieldManager, "gpu.example.com/Ready", "csi.example.com/CSIPluginReady")},
		Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{
			{Type: "gpu.example.com/Ready", Status: corev1.ConditionTrue, Reason: "PluginReady",
				Message: nodecond.Message("anyOf", "gpu.example.com", nodecond.HeldBy+"DRAPlugin gpu.example.com: registered with the kubelet")},
			{Type: "csi.example.com/CSIPluginReady", Status: corev1.ConditionTrue, Reason: "PluginReady",
				Message: nodecond.Message("CSIPlugin", "csi.example.com", "registered with the kubelet")},
		}}}
	ps := pluginsOf(n)
	if len(ps) != 2 || ps[0].HeldBy != "" || ps[1].Type != "anyOf" || ps[1].HeldBy != "DRAPlugin gpu.example.com" {
		t.Fatalf("plugins %+v", ps)
	}
	var b strings.Builder
	if err := WriteNode(&b, NodeView{Node: "a", Ready: "True", Plugins: ps}, Format{}, time.Now()); err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`(?m)^TYPE +NAME +READY +REASON +SINCE +HELD BY$`).MatchString(b.String()) ||
		!regexp.MustCompile(`(?m)^anyOf +gpu\.example\.com +True +PluginReady +\S+ +DRAPlugin gpu\.example\.com$`).MatchString(b.String()) {
		t.Errorf("the node view:\n%s", b.String())
	}
}
