package kubenode

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/plugd/plugd/cmd/plugd/internal/kubenode/deviceclass"
	"github.com/plugd/plugd/cmd/plugd/internal/kubenode/kubeletstate"
)

// The published and usable layers, as a pure function of the slices, the
// health stream and the DeviceTaintRules.
func TestJudgeDRA(t *testing.T) {
	const drv = "gpu.example.com"
	gen := func(g int64, count int64, names ...string) []*resourcev1.ResourceSlice {
		var out []*resourcev1.ResourceSlice
		for _, n := range names {
			out = append(out, resourceSlice(drv, "gpus", g, count, n))
		}
		return out
	}
	cat := func(ss ...[]*resourcev1.ResourceSlice) []*resourcev1.ResourceSlice { return slices.Concat(ss...) }
	str := func(s string) *string { return &s }
	for _, tc := range []struct {
		name      string
		slices    []*resourcev1.ResourceSlice
		unhealthy map[deviceID]bool
		rules     []deviceTaint
		min       int
		reason    string // "" for ready
		text      string
	}{
		{name: "a complete pool", slices: gen(1, 2, "a", "b"), text: "2 usable devices in pool gpus"},
		{name: "none", reason: ReasonNoResourceSlices},
		{name: "another driver's slices are not its", slices: []*resourcev1.ResourceSlice{resourceSlice("other.example.com", "gpus", 1, 1, "a")}, reason: ReasonNoResourceSlices},
		{name: "a slice missing", slices: gen(1, 3, "a", "b"), reason: ReasonPoolIncomplete, text: "pool gpus generation 1 has 2 of 3 ResourceSlices"},
		{name: "generation 2 begun: the old generation does not count", slices: cat(gen(1, 2, "a"), gen(2, 2, "b")), reason: ReasonPoolIncomplete, text: "generation 2 has 1 of 2"},
		{name: "generation 2 complete, an old slice left", slices: cat(gen(1, 2, "old"), gen(2, 2, "a", "b")), text: "2 usable devices"},
		{name: "two pools, one incomplete", slices: cat(gen(1, 1, "a"), []*resourcev1.ResourceSlice{resourceSlice(drv, "nics", 4, 2, "n")}), reason: ReasonPoolIncomplete, text: "pool nics generation 4 has 1 of 2"},
		{name: "too many slices for the count", slices: gen(1, 1, "a", "b"), reason: ReasonPoolIncomplete, text: "has 2 of 1"},
		{name: "NoSchedule in the slice", slices: []*resourcev1.ResourceSlice{tainted(resourceSlice(drv, "gpus", 1, 1, "a", "b"), "example.com/xid", resourcev1.DeviceTaintEffectNoSchedule)},
			reason: ReasonDevicesTainted, text: "0 usable devices of 2 in pool gpus, 1 needed: 2 tainted NoSchedule or NoExecute (example.com/xid)"},
		{name: "NoExecute in the slice", slices: []*resourcev1.ResourceSlice{tainted(resourceSlice(drv, "gpus", 1, 1, "a"), "example.com/gone", resourcev1.DeviceTaintEffectNoExecute)},
			reason: ReasonDevicesTainted, text: "(example.com/gone)"},
		{name: "None does not keep pods off", slices: []*resourcev1.ResourceSlice{tainted(resourceSlice(drv, "gpus", 1, 1, "a"), "example.com/info", resourcev1.DeviceTaintEffectNone)}, text: "1 usable"},
		{name: "an effect Kubernetes may add later counts as None", slices: []*resourcev1.ResourceSlice{tainted(resourceSlice(drv, "gpus", 1, 1, "a"), "example.com/new", "Someday")}, text: "1 usable"},
		{name: "one of two tainted, one needed", slices: cat([]*resourcev1.ResourceSlice{tainted(resourceSlice(drv, "gpus", 1, 2, "a"), "example.com/xid", resourcev1.DeviceTaintEffectNoSchedule)}, gen(1, 2, "b")), text: "1 usable"},
		{name: "one of two tainted, two needed", min: 2, slices: cat([]*resourcev1.ResourceSlice{tainted(resourceSlice(drv, "gpus", 1, 2, "a"), "example.com/xid", resourcev1.DeviceTaintEffectNoSchedule)}, gen(1, 2, "b")),
			reason: ReasonDevicesTainted, text: "1 usable devices of 2 in pool gpus, 2 needed"},
		{name: "a DeviceTaintRule for the driver", slices: gen(1, 1, "a"), rules: []deviceTaint{{key: "example.com/maintenance", effect: resourcev1.DeviceTaintEffectNoExecute, driver: str(drv)}},
			reason: ReasonDevicesTainted, text: "(example.com/maintenance)"},
		{name: "a DeviceTaintRule for another driver", slices: gen(1, 1, "a"), rules: []deviceTaint{{key: "example.com/maintenance", effect: resourcev1.DeviceTaintEffectNoExecute, driver: str("other.example.com")}}, text: "1 usable"},
		{name: "a DeviceTaintRule for another device", slices: gen(1, 1, "a"), rules: []deviceTaint{{key: "k", effect: resourcev1.DeviceTaintEffectNoSchedule, pool: str("gpus"), device: str("b")}}, text: "1 usable"},
		{name: "a DeviceTaintRule for the device", slices: gen(1, 1, "a"), rules: []deviceTaint{{key: "k", effect: resourcev1.DeviceTaintEffectNoSchedule, pool: str("gpus"), device: str("a")}}, reason: ReasonDevicesTainted},
		{name: "Unhealthy", slices: gen(1, 2, "a", "b"), unhealthy: map[deviceID]bool{{"gpus", "a"}: true, {"gpus", "b"}: true},
			reason: ReasonDevicesUnhealthy, text: "2 Unhealthy by its DRAResourceHealth stream (gpus/a, gpus/b)"},
		{name: "Unhealthy elsewhere", slices: gen(1, 1, "a"), unhealthy: map[deviceID]bool{{"other", "a"}: true}, text: "1 usable"},
		{name: "too few", min: 3, slices: gen(1, 2, "a", "b"), reason: ReasonTooFewDevices, text: "2 usable devices of 2 in pool gpus, 3 needed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ok, reason, text := draVerdict(judgeDRA(tc.slices, drv, tc.unhealthy, tc.rules, false), tc.min)
			if ok != (tc.reason == "") || reason != tc.reason || !strings.Contains(text, tc.text) {
				t.Errorf("= %v %s %q; want %s %q", ok, reason, text, tc.reason, tc.text)
			}
		})
	}
}

// A message lists the first taint keys, devices and pools and counts the
// rest: it stays bounded, and the same for the same slices in any order.
func TestJudgeDRABounded(t *testing.T) {
	var all []*resourcev1.ResourceSlice
	unhealthy := map[deviceID]bool{}
	for i := range 1000 {
		all = append(all, resourceSlice("d", fmt.Sprintf("pool-%04d", i), 1, 1, "a"))
		unhealthy[deviceID{fmt.Sprintf("pool-%04d", i), "a"}] = true
	}
	_, _, text := draVerdict(judgeDRA(all, "d", unhealthy, nil, false), 1)
	slices.Reverse(all)
	_, _, again := draVerdict(judgeDRA(all, "d", unhealthy, nil, false), 1)
	if len(text) > 1024 || text != again || !strings.Contains(text, "and 992 more") {
		t.Errorf("%d bytes, the same in another order %v: %s", len(text), text == again, text)
	}
}

// plugd_dra_pool_devices and plugd_dra_pool_complete show each pool of a
// DRA driver's, from the views of the last evaluation.
func TestPoolMetrics(t *testing.T) {
	b := newBench(t)
	sick := map[deviceID]bool{{"gpus", "gpu-2"}: true}
	all := append(draPool(1, 3)[:2], tainted(resourceSlice(draExp.Name, "gpus", 1, 3, "gpu-2", "gpu-3"), "example.com/xid", resourcev1.DeviceTaintEffectNoSchedule),
		resourceSlice(draExp.Name, "nics", 2, 2, "nic-0"))
	st := judgeDRA(all, draExp.Name, sick, nil, false)
	b.n.publish(map[key]view{{TypeDRA, draExp.Name}: {dra: &st}}, t0)
	want := `
# HELP plugd_dra_pool_complete 1 while a DRA driver's pool on this node has, at its newest generation, the ResourceSlices its resourceSliceCount says; 0 while it is incomplete (a republish, or a driver that failed to publish). The first 64 pools of a driver.
# TYPE plugd_dra_pool_complete gauge
plugd_dra_pool_complete{driver="gpu.example.com",pool="gpus"} 1
plugd_dra_pool_complete{driver="gpu.example.com",pool="nics"} 0
`
	if err := testutil.CollectAndCompare(collector{b.n}, strings.NewReader(want), "plugd_dra_pool_complete"); err != nil {
		t.Error(err)
	}
	ch := make(chan prometheus.Metric, 100)
	collector{b.n}.Collect(ch)
	close(ch)
	got := map[string]float64{}
	for m := range ch {
		var pb dto.Metric
		if m.Desc() != poolDevicesDesc || m.Write(&pb) != nil {
			continue
		}
		var labels []string
		for _, l := range pb.GetLabel() {
			labels = append(labels, l.GetValue())
		}
		got[strings.Join(labels, " ")] = pb.GetGauge().GetValue()
	}
	wantDevices := map[string]float64{"gpu.example.com gpus usable": 2, "gpu.example.com gpus tainted": 2, "gpu.example.com gpus unhealthy": 0,
		"gpu.example.com nics usable": 0, "gpu.example.com nics tainted": 0, "gpu.example.com nics unhealthy": 0}
	if !maps.Equal(got, wantDevices) {
		t.Errorf("plugd_dra_pool_devices = %v; want %v", got, wantDevices)
	}
}

// The last layer: each DeviceClass the expectation names exists and its
// CEL selectors select minDevices of the usable devices (package
// deviceclass), matched where the views are made.
func TestDRAClasses(t *testing.T) {
	const drv = "gpu.example.com"
	class := func(name, expr string) *resourcev1.DeviceClass {
		return &resourcev1.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: name, UID: types.UID(name), ResourceVersion: "1"},
			Spec: resourcev1.DeviceClassSpec{Selectors: []resourcev1.DeviceSelector{{CEL: &resourcev1.CELDeviceSelector{Expression: expr}}}}}
	}
	classes := map[string]*resourcev1.DeviceClass{
		"all":  class("all", `device.driver == "`+drv+`"`),
		"none": class("none", `device.driver == "other.example.com"`),
	}
	all := []*resourcev1.ResourceSlice{resourceSlice(drv, "gpus", 1, 1, "gpu-0", "gpu-1")}
	var m deviceclass.Matcher
	for _, tc := range []struct {
		names  []string
		min    int
		reason string
	}{
		{[]string{"all"}, 2, ""},
		{[]string{"all"}, 3, ReasonTooFewDevices},
		{[]string{"none"}, 1, deviceclass.ReasonNoMatch},
		{[]string{"all", "gone"}, 1, deviceclass.ReasonMissing},
	} {
		st := judgeDRA(all, drv, nil, nil, true)
		v := matchClasses(&m, drv, tc.names, view{dra: &st}, classes, nil)
		ok, reason, text := draVerdict(*v.dra, tc.min, tc.names...)
		if ok != (tc.reason == "") || reason != tc.reason {
			t.Errorf("classes %v, %d needed: %v %s %q; want %s", tc.names, tc.min, ok, reason, text, tc.reason)
		}
	}
	// Unmatched (the classes not read yet): nothing is concluded.
	st := judgeDRA(all, drv, nil, nil, true)
	v := matchClasses(&m, drv, []string{"all"}, view{dra: &st}, nil, &Problem{Reason: ReasonNotSynced})
	if ok, reason, _ := draVerdict(*v.dra, 1, "all"); ok || reason != "" {
		t.Errorf("classes not read: %v %s; want no verdict", ok, reason)
	}
}

// The views are made again when the DeviceClasses' read trouble ends: an
// informer that syncs with no class (the class missing) delivers no
// object, and the views cached while it had not synced said nothing of
// the classes for as long as nothing else changed.
func TestClassesReadEndsTheCachedViews(t *testing.T) {
	const drv = "gpu.example.com"
	l := &loop{pol: policy{expect: []Expectation{{Type: TypeDRA, Name: drv, DeviceClasses: []string{"gone"}}}}, said: map[key]remembered{}}
	socks := map[key][]Socket{{TypeDRA, drv}: {draSock}}
	snap := snapshot{nodeName: "node-a", seq: [3]uint64{1, 1, 1}, slices: []*resourcev1.ResourceSlice{resourceSlice(drv, "gpus", 1, 1, "gpu-0")},
		classProblem: &Problem{Reason: ReasonNotSynced}}
	verdict := func() string {
		views, _, _ := l.views(socks, snap, kubeletFacts{}, kubeletstate.Evidence{})
		v := views[key{TypeDRA, drv}]
		if v.dra == nil {
			return "no DRA layers"
		}
		_, reason, _ := draVerdict(*v.dra, 1, "gone")
		return reason
	}
	if got := verdict(); got != "" && got != "no DRA layers" {
		t.Fatalf("classes not read: %q; want no verdict", got)
	}
	snap.classProblem, snap.classes = nil, map[string]*resourcev1.DeviceClass{}
	if got := verdict(); got != deviceclass.ReasonMissing {
		t.Errorf("classes read, none there: %q; want %s", got, deviceclass.ReasonMissing)
	}
}
