package fleet

import (
	"strings"
	"testing"
	"time"

	"github.com/plugd/plugd/internal/nodecond"
)

func TestWriteCluster(t *testing.T) {
	now := time.Now()
	v := nodecond.ClusterView{Nodes: 3, NodesWithPlugd: 3, Plugins: []nodecond.ClusterPlugin{
		{Type: "CSIPlugin", Name: "csi.example.com", Condition: "csi.example.com/CSIPluginReady", Ready: 2, Expected: 3,
			NotReady: []nodecond.NodeCondition{{Node: "node-c", Status: "False", Reason: "SocketMissing", Message: "plugd: CSIPlugin csi.example.com: no socket", Since: now.Add(-3 * time.Minute)}}},
	}}
	var b strings.Builder
	if err := WriteCluster(&b, v, true, now); err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"TYPE        NAME              READY   EXPECTED   CONDITION", "CSIPlugin   csi.example.com   2       3          csi.example.com/CSIPluginReady",
		"3 nodes, 3 with plugd's conditions", "CSIPlugin csi.example.com: not ready on 1 of 3 nodes", "node-c   False    SocketMissing   3m      plugd: CSIPlugin"} {
		if !strings.Contains(b.String(), s) {
			t.Errorf("cluster -o wide does not print %q:\n%s", s, b.String())
		}
	}
	b.Reset()
	WriteCluster(&b, nodecond.ClusterView{Nodes: 2}, false, now)
	if !strings.Contains(b.String(), "no node has a condition of plugd's (2 nodes)") {
		t.Errorf("empty cluster:\n%s", b.String())
	}
}
