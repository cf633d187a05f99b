package fleet

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"

	"github.com/plugd/plugd/api"
	"github.com/plugd/plugd/internal/nodecond"
)

// The node view shows the Node's taints and their last writer, and each
// expected plugin's taint with its state as plugd on the node keeps it,
// asked through the API server's proxy to plugd's pod. A real API server
// here proxies to no pod (they would be on loopback, which it refuses), so
// this one answers as it would; where plugd cannot be asked, the view says
// why and shows the rest.
func TestNodeViewTaints(t *testing.T) {
	now := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	held := api.TaintView{Taint: "csi.example.com/agent-not-ready:NoExecute", State: api.TaintHeld, Holder: "node-manager", Since: now.Add(-2 * time.Minute)}
	proxied := true
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		switch r.URL.Path {
		case "/api/v1/namespaces/plugd/pods":
			pod := corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "plugd-abc", Namespace: "plugd"},
				Spec:   corev1.PodSpec{Containers: []corev1.Container{{Ports: []corev1.ContainerPort{{Name: "status", ContainerPort: 9090}}}}},
				Status: corev1.PodStatus{ContainerStatuses: []corev1.ContainerStatus{{Ready: true}}}}
			json.NewEncoder(w).Encode(corev1.PodList{TypeMeta: metav1.TypeMeta{Kind: "PodList", APIVersion: "v1"}, Items: []corev1.Pod{pod}})
		case "/api/v1/namespaces/plugd/pods/http:plugd-abc:9090/proxy/v1/plugins":
			if !proxied {
				http.Error(w, "the NetworkPolicy drops it", http.StatusServiceUnavailable)
				return
			}
			json.NewEncoder(w).Encode(api.PluginList{Plugins: []api.Plugin{
				{ID: "old.sock", Type: "CSIPlugin", Name: "csi.example.com"},
				{ID: "csi.sock", Type: "CSIPlugin", Name: "csi.example.com", Taints: []api.TaintView{held}},
			}})
		case "/apis/resource.k8s.io/v1/resourceslices":
			json.NewEncoder(w).Encode(map[string]any{"kind": "ResourceSliceList", "apiVersion": "resource.k8s.io/v1", "items": []any{}})
		default:
			http.Error(w, `{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"NotFound","code":404}`, http.StatusNotFound)
		}
	}))
	defer srv.Close()
	c, err := NewClients(&rest.Config{Host: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	written := metav1.NewTime(now.Add(-2 * time.Minute))
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "a", ManagedFields: append(managedBy(nodecond.FieldManager, "csi.example.com/CSIPluginReady"),
		metav1.ManagedFieldsEntry{Manager: "node-manager", Operation: metav1.ManagedFieldsOperationUpdate, APIVersion: "v1", Time: &written,
			FieldsType: "FieldsV1", FieldsV1: &metav1.FieldsV1{Raw: []byte(`{"f:spec":{"f:taints":{}}}`)}})},
		Spec: corev1.NodeSpec{Taints: []corev1.Taint{{Key: "node.kubernetes.io/not-ready", Effect: corev1.TaintEffectNoSchedule},
			{Key: "csi.example.com/agent-not-ready", Effect: corev1.TaintEffectNoExecute}}},
		Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{{Type: "csi.example.com/CSIPluginReady", Status: corev1.ConditionTrue, Reason: "PluginReady",
			Message: nodecond.Message("CSIPlugin", "csi.example.com", "ready")}}}}

	v := nodeView(context.Background(), c, n, DoctorOptions{ReportTimeout: 5 * time.Second})
	if len(v.Plugins) != 1 || len(v.Plugins[0].Taints) != 1 || v.Plugins[0].Taints[0] != held {
		t.Fatalf("plugins: %+v (unreadable %q); want the CSI driver's taint Held", v.Plugins, v.Unreadable)
	}
	if strings.Join(v.Taints, ",") != "csi.example.com/agent-not-ready:NoExecute" || v.TaintsWrittenBy != "node-manager" || !v.TaintsWrittenAt.Equal(written.Time) {
		t.Errorf("the Node's taints: %q, written by %q at %s", v.Taints, v.TaintsWrittenBy, v.TaintsWrittenAt)
	}
	var b strings.Builder
	if err := WriteNode(&b, v, Format{}, now); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"SINCE   TAINT", "Held by node-manager", "Taints (but Kubernetes' own): csi.example.com/agent-not-ready:NoExecute; last written by node-manager 2m ago"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("node view lacks %q:\n%s", want, b.String())
		}
	}

	proxied = false
	v = nodeView(context.Background(), c, n, DoctorOptions{ReportTimeout: 5 * time.Second})
	if len(v.Plugins) != 1 || v.Plugins[0].Taints != nil || len(v.Unreadable) != 1 || !strings.Contains(v.Unreadable[0], "plugd's taint states: GET pods/plugd-abc/proxy/v1/plugins") {
		t.Errorf("plugd unreachable: plugins %+v, unreadable %q", v.Plugins, v.Unreadable)
	}
}
