package kubenode

import (
	"strings"
	"testing"
	"time"

	storagev1 "k8s.io/api/storage/v1"

	"github.com/plugd/plugd/api"
)

// What the running kubelet holds decides; CSINode and the Node only add
// details.
func TestLiveView(t *testing.T) {
	csi := key{TypeCSI, "csi.example.com"}
	gpu := key{TypeDevice, "vendor.example/gpu"}
	sock := Socket{Path: "/r/csi.sock", Type: TypeCSI, Name: "csi.example.com", Answering: true, Details: csiSaid("node-a")}
	dev := Socket{Path: "/r/gpu.sock", Type: TypeDevice, Name: "vendor.example/gpu", Answering: true}
	listed := snapshot{csiNode: csiNode(storagev1.CSINodeDriver{Name: "csi.example.com", NodeID: "node-a"})}
	labelled := listed
	labelled.node = node(nil, nil)
	labelled.node.Labels = map[string]string{"topology.example.com/node": "node-a"}
	holds := kubeletFacts{live: true, registered: map[string]bool{"/r/csi.sock": true, "/r/gpu.sock": true}, devices: map[string]int{"vendor.example/gpu": 3}}
	for _, tc := range []struct {
		name      string
		k         key
		socks     []Socket
		s         snapshot
		kf        kubeletFacts
		mem       remembered
		state     string
		reason    string
		inMessage string
	}{
		{"registered", csi, []Socket{sock}, listed, holds, remembered{}, api.KubeletRegistered, "", `holds /r/csi.sock; CSINode node-a lists it with nodeID "node-a"`},
		{"registered, CSINode not yet", csi, []Socket{sock}, snapshot{csiNode: csiNode()}, holds, remembered{}, api.KubeletRegistered, "NotInCSINode", "does not list the driver"},
		{"CSINode lists it, the kubelet does not hold it", csi, []Socket{sock}, listed, kubeletFacts{live: true}, remembered{}, api.KubeletNotRegistered, ReasonNotRegistered, "holds no socket of it"},
		{"seen, not registered", csi, []Socket{sock}, listed, kubeletFacts{live: true, seen: map[string]bool{"/r/csi.sock": true}}, remembered{}, api.KubeletNotRegistered, ReasonSeenNotRegistered, "has seen /r/csi.sock"},
		{"restarted", csi, []Socket{sock}, listed, kubeletFacts{live: true, restarted: true, started: time.Unix(100, 0)}, remembered{}, api.KubeletNotRegistered, ReasonKubeletRestarted, "restarted"},
		{"a socket made since the restart", csi, []Socket{{Path: "/r/csi.sock", Answering: true, Created: time.Unix(200, 0)}}, listed, kubeletFacts{live: true, restarted: true, started: time.Unix(100, 0)}, remembered{}, api.KubeletNotRegistered, ReasonNotRegistered, "holds no socket"},
		{"not running", csi, []Socket{sock}, listed, kubeletFacts{down: true, address: "10.0.0.1:10250"}, remembered{}, api.KubeletNotRegistered, ReasonKubeletNotRunning, "nothing listens at 10.0.0.1:10250"},
		{"not read yet", csi, []Socket{sock}, listed, kubeletFacts{}, remembered{}, api.KubeletUnknown, ReasonNotSynced, "not read"},
		{"topology conflict", csi, []Socket{{Path: "/r/csi.sock", State: "Stale"}}, labelled, kubeletFacts{live: true, seen: map[string]bool{"/r/csi.sock": true}},
			remembered{topology: map[string]string{"topology.example.com/node": "node-b"}}, api.KubeletNotRegistered, ReasonTopologyConflict,
			"reports topology.example.com/node=node-b but Node node-a has the label topology.example.com/node=node-a"},
		// The kubelet holds the socket while its CSI handler retries the
		// Node's update (seconds, in test/kube); the collision makes that
		// registration fail whatever the actual state says meanwhile.
		{"topology conflict, the kubelet still trying", csi, []Socket{sock}, snapshot{csiNode: csiNode(), node: labelled.node}, holds,
			remembered{topology: map[string]string{"topology.example.com/node": "node-b"}}, api.KubeletNotRegistered, ReasonTopologyConflict, "kubectl label node node-a"},
		{"topology agrees", csi, []Socket{sock}, labelled, holds, remembered{topology: map[string]string{"topology.example.com/node": "node-a"}}, api.KubeletRegistered, "", "holds"},
		{"inferred topology conflict", csi, []Socket{sock}, labelled, kubeletFacts{problem: &Problem{Reason: ReasonKubeletTLS}},
			remembered{topology: map[string]string{"topology.example.com/node": "node-b"}}, api.KubeletRegistered, ReasonInferred, "inferred"},
		{"device, its live count", gpu, []Socket{dev}, snapshot{}, holds, remembered{}, api.KubeletRegistered, "", "can allocate 3"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.s.nodeName = "node-a"
			v := kubeletView(tc.k, tc.socks, tc.s, tc.kf, tc.mem)
			if v.State != tc.state || v.Reason != tc.reason || !strings.Contains(v.Message, tc.inMessage) {
				t.Errorf("view = %+v; want state %s, reason %q, a message with %q", v, tc.state, tc.reason, tc.inMessage)
			}
		})
	}
	v := kubeletView(gpu, []Socket{dev}, snapshot{nodeName: "node-a", node: node(map[string]string{"vendor.example/gpu": "3"}, map[string]string{"vendor.example/gpu": "1"})}, holds, remembered{})
	if v.healthy != 3 || !v.healthyFresh {
		t.Errorf("the device count is %d (fresh %v); want the kubelet's 3, not the Node's allocatable", v.healthy, v.healthyFresh)
	}
}
