package kubenode

import (
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/plugd/plugd/api"
)

// csiSaid is the csi handler's details of a driver whose NodeGetInfo
// answered nodeID.
func csiSaid(nodeID string) api.CSIDetails {
	return api.CSIDetails{Driver: "csi.example.com", Active: true, Instances: 1, CSIInstance: api.CSIInstance{NodeID: nodeID}}
}

// streamed is the deviceplugin handler's details of a plugin it registered,
// whose stream lists healthy and unhealthy devices.
func streamed(healthy, unhealthy int) api.DevicePluginDetails {
	return api.DevicePluginDetails{Resource: "vendor.example/gpu", Serving: true, Connected: true,
		Devices: map[string]int{api.DeviceHealthy: healthy, api.DeviceUnhealthy: unhealthy}}
}

// looked is the deviceplugin handler's details of a plugin it observed,
// at, with healthy and unhealthy devices.
func looked(at time.Time, healthy, unhealthy int) api.DevicePluginObserved {
	return api.DevicePluginObserved{Resource: "vendor.example/gpu", Observed: true, ObservedAt: at,
		Devices: map[string]int{api.DeviceHealthy: healthy, api.DeviceUnhealthy: unhealthy}}
}

// The node agent reads its facts from the details the built-in handlers
// return, by their Go type; any other details, whatever the plugin's type,
// say nothing.
func TestFactsFromDetails(t *testing.T) {
	at := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	topology := map[string]string{"topology.example.com/zone": "a"}
	withTopology := csiSaid("node-a")
	withTopology.Topology = topology
	for _, tc := range []struct {
		name     string
		p        Socket
		nodeID   string
		topology int
		devices  string // healthy/all@at, or "" when unknown
	}{
		{"csi", Socket{Type: TypeCSI, Details: withTopology}, "node-a", 1, ""},
		{"csi before NodeGetInfo", Socket{Type: TypeCSI, Details: api.CSIDetails{Driver: "csi.example.com"}}, "", 0, ""},
		{"device stream", Socket{Type: TypeDevice, Details: streamed(3, 1)}, "", 0, "3/4@0"},
		{"device look", Socket{Type: TypeDevice, Details: looked(at, 1, 1)}, "", 0, "1/2@" + at.Format(time.RFC3339)},
		{"a look that saw no list", Socket{Type: TypeDevice, Details: api.DevicePluginObserved{Observed: true, LastError: "refused"}}, "", 0, ""},
		{"other health than Healthy", Socket{Type: TypeDevice, Details: api.DevicePluginDetails{Devices: map[string]int{"Broken": 2, api.DeviceHealthy: 1}}}, "", 0, "1/3@0"},
		{"a hook's run", Socket{Type: TypeCSI, Details: api.HookRun{Event: "register", Result: "accepted"}}, "", 0, ""},
		{"a handler of one's own", Socket{Type: TypeDevice, Details: map[string]any{"devices": 9}}, "", 0, ""},
		{"no details", Socket{Type: TypeDevice}, "", 0, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			id, topo := tc.p.nodeInfo()
			if id != tc.nodeID || len(topo) != tc.topology {
				t.Errorf("nodeInfo = %q %v; want %q and %d topology keys", id, topo, tc.nodeID, tc.topology)
			}
			got := ""
			if healthy, all, seen, ok := tc.p.devices(); ok {
				when := "0"
				if !seen.IsZero() {
					when = seen.Format(time.RFC3339)
				}
				got = fmt.Sprintf("%d/%d@%s", healthy, all, when)
			}
			if got != tc.devices {
				t.Errorf("devices = %q; want %q", got, tc.devices)
			}
		})
	}
}

// Fed typed details, the node agent holds them against the API: a CSI
// driver's node id against CSINode's, a device plugin's healthy devices
// against the Node's allocatable, the serving instance's count winning.
func TestViewsFromTypedDetails(t *testing.T) {
	csi := key{TypeCSI, "csi.example.com"}
	gpu := key{TypeDevice, "vendor.example/gpu"}
	s := snapshot{nodeName: "node-a",
		csiNode: csiNode(storagev1.CSINodeDriver{Name: "csi.example.com", NodeID: "node-a"}),
		node: &corev1.Node{Status: corev1.NodeStatus{
			Capacity:    corev1.ResourceList{"vendor.example/gpu": resource.MustParse("2")},
			Allocatable: corev1.ResourceList{"vendor.example/gpu": resource.MustParse("2")},
			Conditions:  []corev1.NodeCondition{{Type: corev1.NodeReady, LastHeartbeatTime: metav1.NewTime(time.Unix(100, 0))}},
		}}}
	kf := kubeletFacts{problem: &Problem{Reason: ReasonKubeletForbidden}}
	for _, tc := range []struct {
		name   string
		k      key
		socks  []Socket
		reason string
	}{
		{"the node id CSINode holds", csi, []Socket{{Path: "/r/csi.sock", Answering: true, Details: csiSaid("node-a")}}, ReasonInferred},
		{"another node id", csi, []Socket{{Path: "/r/csi.sock", Answering: true, Details: csiSaid("node-b")}}, "NodeIDMismatch"},
		{"as many healthy as allocatable", gpu, []Socket{{Path: "/r/gpu.sock", Answering: true, Details: streamed(2, 0)}}, ReasonInferred},
		{"fewer healthy than allocatable", gpu, []Socket{{Path: "/r/gpu.sock", Answering: true, Details: streamed(1, 1)}}, "AllocatableMismatch"},
		{"the old instance has fewer", gpu, []Socket{
			{Path: "/r/gpu-old.sock", Answering: true, Details: streamed(0, 2)},
			{Path: "/r/gpu.sock", Answering: true, Details: streamed(2, 0)}}, ReasonInferred},
		{"a look from before the Node's report", gpu, []Socket{{Path: "/r/gpu.sock", Answering: true, Details: looked(time.Unix(50, 0), 1, 1)}}, ReasonInferred},
		{"a look from after it", gpu, []Socket{{Path: "/r/gpu.sock", Answering: true, Details: looked(time.Unix(150, 0), 1, 1)}}, "AllocatableMismatch"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for i := range tc.socks {
				tc.socks[i].Type, tc.socks[i].Name = tc.k.typ, tc.k.name
			}
			v := kubeletView(tc.k, tc.socks, s, kf, remembered{})
			if v.Reason != tc.reason {
				t.Errorf("view = %s %s: %s; want reason %s", v.State, v.Reason, v.Message, tc.reason)
			}
		})
	}
}
