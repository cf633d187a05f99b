package fleet

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"

	"github.com/plugd/plugd/internal/nodecond"
)

// ReadCluster answers from plugd caretaker's summary where it is usable
// (one request, no Node read), and from the Nodes where it is not: none
// (silently), too old, forbidden, or without the lists an output needs
// (saying why); -l and --source=nodes always read the Nodes, and
// --source=summary never does.
func TestReadClusterFromSummary(t *testing.T) {
	now := time.Now()
	// Three nodes; the summary says five, so that the answer tells which
	// was read.
	nodes := corev1.NodeList{}
	for _, name := range []string{"a", "b", "c"} {
		nodes.Items = append(nodes.Items, corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}})
	}
	summary := func(age time.Duration, complete bool) string {
		s := nodecond.Summary{Time: now.Add(-age), Complete: complete, View: nodecond.ClusterView{Nodes: 5}}
		b, err := json.Marshal(s)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	for _, tc := range []struct {
		name      string
		summary   string // the ConfigMap's summary; "" and status: the answer to its GET
		status    int
		o         ClusterOptions
		wantNodes int
		fallback  string // in the reason for reading the Nodes
		err       string
		lists     bool // the Nodes were listed
	}{
		{name: "fresh", summary: summary(30*time.Second, true), wantNodes: 5},
		{name: "fresh, counts only, for a table", summary: summary(0, false), wantNodes: 5},
		{name: "counts only, for -o wide", summary: summary(0, false), o: ClusterOptions{Lists: true}, wantNodes: 3, fallback: "counts only", lists: true},
		{name: "old", summary: summary(5*time.Minute, true), wantNodes: 3, fallback: "5m0s ago", lists: true},
		{name: "none", status: http.StatusNotFound, wantNodes: 3, lists: true},
		{name: "forbidden", status: http.StatusForbidden, wantNodes: 3, fallback: "forbidden", lists: true},
		{name: "not a summary", summary: "{", wantNodes: 3, fallback: "not plugd caretaker's", lists: true},
		{name: "-l", summary: summary(0, true), o: ClusterOptions{Selector: "a=b"}, wantNodes: 3, lists: true},
		{name: "--source=nodes", summary: summary(0, true), o: ClusterOptions{Source: SourceNodes}, wantNodes: 3, lists: true},
		{name: "--source=summary, none", status: http.StatusNotFound, o: ClusterOptions{Source: SourceSummary}, err: "does not exist"},
		{name: "--source=summary, old", summary: summary(time.Hour, true), o: ClusterOptions{Source: SourceSummary}, err: "is it running?"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var listed atomic.Int32
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "application/json")
				switch r.URL.Path {
				case "/api/v1/namespaces/plugd/configmaps/" + nodecond.SummaryName:
					if tc.status != 0 {
						w.WriteHeader(tc.status)
						json.NewEncoder(w).Encode(metav1.Status{Status: metav1.StatusFailure, Code: int32(tc.status), Reason: metav1.StatusReason(http.StatusText(tc.status))})
						return
					}
					json.NewEncoder(w).Encode(corev1.ConfigMap{Data: map[string]string{nodecond.SummaryKey: tc.summary}})
				case "/api/v1/nodes":
					listed.Add(1)
					json.NewEncoder(w).Encode(nodes)
				default:
					http.NotFound(w, r)
				}
			}))
			defer srv.Close()
			c, err := NewClients(&rest.Config{Host: srv.URL, QPS: -1})
			if err != nil {
				t.Fatal(err)
			}
			tc.o.Namespace = "plugd"
			v, fallback, err := ReadCluster(context.Background(), c.Core.RESTClient(), tc.o)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err %v, want one saying %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if v.Nodes != tc.wantNodes || (listed.Load() > 0) != tc.lists {
				t.Errorf("%d nodes (source %s), Nodes listed %d times; want %d nodes, listed: %v", v.Nodes, v.Source, listed.Load(), tc.wantNodes, tc.lists)
			}
			if want := map[bool]string{true: SourceNodes, false: SourceSummary}[tc.lists]; v.Source != want || v.AsOf.IsZero() {
				t.Errorf("source %q as of %s, want %q", v.Source, v.AsOf, want)
			}
			if tc.fallback == "" && fallback != "" || !strings.Contains(fallback, tc.fallback) {
				t.Errorf("fallback %q, want one saying %q", fallback, tc.fallback)
			}
		})
	}
}

// The table says how old a summary is, and how to read the Nodes instead.
func TestWriteClusterFromSummary(t *testing.T) {
	now := time.Now()
	v := nodecond.ClusterView{Nodes: 3, NodesWithPlugd: 3, Source: SourceSummary, AsOf: now.Add(-42 * time.Second),
		Plugins: []nodecond.ClusterPlugin{{Type: "CSIPlugin", Name: "csi.example.com", Condition: "c", Ready: 3, Expected: 3}}}
	var b strings.Builder
	if err := WriteCluster(&b, v, Format{}, now); err != nil {
		t.Fatal(err)
	}
	if want := "3 nodes, 3 with plugd's conditions, as plugd caretaker counted them 42s ago (--source=nodes reads every Node now)"; !strings.Contains(b.String(), want) {
		t.Errorf("got:\n%s\nwant a line %q", b.String(), want)
	}
}
