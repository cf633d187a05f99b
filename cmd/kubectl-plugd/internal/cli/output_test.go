package cli

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/plugd/plugd/internal/nodecond"
)

// Issue 33, item 12: kubectl plugd's views take kubectl's -o
// jsonpath=TEMPLATE and --no-headers; a bad template is a usage error.
func TestJSONPathAndNoHeaders(t *testing.T) {
	const cond = "c.example.com/CSIPluginReady"
	fields, _ := json.Marshal(map[string]any{"f:status": map[string]any{"f:conditions": map[string]any{`k:{"type":"` + cond + `"}`: map[string]any{".": map[string]any{}, "f:status": map[string]any{}}}}})
	node := func(name string, status corev1.ConditionStatus) corev1.Node {
		return corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, ManagedFields: []metav1.ManagedFieldsEntry{{Manager: nodecond.FieldManager,
			Operation: metav1.ManagedFieldsOperationUpdate, APIVersion: "v1", FieldsType: "FieldsV1", FieldsV1: &metav1.FieldsV1{Raw: fields}, Subresource: "status"}}},
			Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{{Type: cond, Status: status, Reason: "R", Message: nodecond.Message("CSIPlugin", "c.example.com", "why"),
				LastHeartbeatTime: metav1.Now(), LastTransitionTime: metav1.NewTime(time.Now().Add(-time.Hour))}}}}
	}
	list := corev1.NodeList{TypeMeta: metav1.TypeMeta{Kind: "NodeList", APIVersion: "v1"}, Items: []corev1.Node{node("a", corev1.ConditionTrue), node("b", corev1.ConditionFalse)}}
	kubeconfig := hostileAPI(t, func(w http.ResponseWriter, r *http.Request) {
		if strings.Contains(r.URL.Path, "/configmaps/") {
			http.NotFound(w, r) // no plugd caretaker keeps a summary here
			return
		}
		w.Header().Set("Content-Type", "application/json")
		if r.URL.Path == "/api/v1/nodes/a" {
			json.NewEncoder(w).Encode(list.Items[0])
			return
		}
		json.NewEncoder(w).Encode(list)
	})
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"cluster", "-o", `jsonpath={range .plugins[*]}{.name}{" "}{.ready}/{.expected}{"\n"}{end}`}, "c.example.com 1/2\n"},
		{[]string{"cluster", "-o", "jsonpath={.nodes}"}, "2"},
		{[]string{"cluster", "--no-headers"}, "CSIPlugin   c.example.com   1       2          " + cond + "\n"},
		{[]string{"node", "a", "-o", "jsonpath={.plugins[0].status}"}, "True"},
	} {
		code, out := run(append(tc.args, "--kubeconfig", kubeconfig)...)
		if code != ExitOK || out != tc.want {
			t.Errorf("kubectl plugd %q: exit %d, %q; want %q", tc.args, code, out, tc.want)
		}
	}
	if code, out := run("cluster", "-o", "jsonpath={.plugins[", "--kubeconfig", kubeconfig); code != ExitUsage || !strings.Contains(out, "--output jsonpath=") {
		t.Errorf("a bad template: exit %d:\n%s", code, out)
	}
	if code, out := run("node", "a", "--no-headers", "--kubeconfig", kubeconfig); code != ExitOK || strings.Contains(out, "TYPE") || !strings.Contains(out, "CSIPlugin   c.example.com") {
		t.Errorf("node --no-headers: exit %d:\n%s", code, out)
	}
}
