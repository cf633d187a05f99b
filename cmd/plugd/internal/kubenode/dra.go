package kubenode

import (
	"context"
	"fmt"
	"maps"
	"slices"

	resourcev1 "k8s.io/api/resource/v1"

	"github.com/plugd/plugd/api"
	"github.com/plugd/plugd/cmd/plugd/internal/kubenode/deviceclass"
)

// A DRA driver is ready in layers, each judged against what the API and
// the kubelet hold, each a reason of its own when it fails:
//
//	registered  the running kubelet holds its socket (judge, as for any plugin)
//	published   its ResourceSlices for this node form complete pools at their
//	            newest generation (PoolIncomplete; NoResourceSlices: none)
//	usable      at least minDevices devices of those pools carry no NoSchedule
//	            or NoExecute taint (DevicesTainted) and are not Unhealthy by the
//	            driver's DRAResourceHealth stream (DevicesUnhealthy);
//	            TooFewDevices when the pools hold fewer devices than that
//	classes     each DeviceClass the expectation names exists
//	            (DeviceClassMissing) and selects minDevices of those usable
//	            devices (NoMatchingDevices; package deviceclass)
//
// A republish (a pool's generation moves) does not turn a True condition
// False while the new generation completes within republishGrace
// (decide.go, republished).

// The reasons of the DRA layers.
const (
	ReasonNoResourceSlices = "NoResourceSlices"
	ReasonPoolIncomplete   = "PoolIncomplete"
	ReasonDevicesTainted   = "DevicesTainted"
	ReasonDevicesUnhealthy = "DevicesUnhealthy"
	ReasonTooFewDevices    = "TooFewDevices"
)

// classNames are, by DRA driver, the DeviceClasses its expectations (and
// anyOf alternatives) name, each once.
func classNames(expect []Expectation) map[string][]string {
	out := map[string][]string{}
	for _, e := range expect {
		for _, x := range append([]Expectation{e}, e.AnyOf...) {
			if x.Type != TypeDRA {
				continue
			}
			for _, c := range x.DeviceClasses {
				if !slices.Contains(out[x.Name], c) {
					out[x.Name] = append(out[x.Name], c)
				}
			}
		}
	}
	return out
}

// matchClasses is what the DeviceClasses names make of the usable
// devices of driver in v (the last layer: DeviceClassMissing,
// NoMatchingDevices), with m's compiled classes; v unchanged where its
// slices or the classes cannot be read.
func matchClasses(m *deviceclass.Matcher, driver string, names []string, v view, classes map[string]*resourcev1.DeviceClass, problem *Problem) view {
	if v.dra == nil || problem != nil || len(names) == 0 {
		return v
	}
	st := *v.dra
	st.classes = map[string]deviceclass.Result{}
	for _, name := range names {
		// A selector's runtime error or a missing class is a verdict; the
		// count is held against each expectation's minDevices (draVerdict).
		r, err := m.Check(context.Background(), name, classes[name], driver, st.matchable, 0)
		if err != nil {
			return v
		}
		st.classes[name] = r
	}
	v.dra = &st
	return v
}

// deviceID names a device of a driver: its pool and its name.
type deviceID struct{ pool, device string }

// poolState is one pool of a driver on this node, as its slices show it.
type poolState struct {
	name       string
	generation int64 // the highest of its slices
	have, want int64 // slices at generation; resourceSliceCount
	// usable, tainted and unhealthy count its devices at generation, once
	// it is complete (plugd_dra_devices).
	usable, tainted, unhealthy int
}

func (p poolState) complete() bool { return p.have == p.want }

// draState is what a DRA driver's slices on this node, its health stream
// and the DeviceTaintRules say of its devices (judgeDRA).
type draState struct {
	pools []poolState // by name
	// devices are those of the complete pools, at their newest generation;
	// usable those of them neither tainted nor unhealthy.
	devices, usable int
	// tainted counts the devices with a NoSchedule or NoExecute taint, and
	// taintKeys are those taints' keys; unhealthy the other devices the
	// health stream says are Unhealthy, named in sick.
	tainted   int
	taintKeys []string
	unhealthy int
	sick      []string
	// matchable are the usable devices, as DeviceClasses are matched
	// against them: kept only where a class is matched (judgeDRA's keep).
	matchable []resourcev1.Device
	// classes are what each DeviceClass an expectation of the driver names
	// makes of the usable devices, by name (matchClasses).
	classes map[string]deviceclass.Result
}

// incomplete are the pools whose newest generation lacks slices.
func (s draState) incomplete() []poolState {
	var out []poolState
	for _, p := range s.pools {
		if !p.complete() {
			out = append(out, p)
		}
	}
	return out
}

// deviceTaint is a taint on devices, with what the DeviceTaintRule that
// puts it selects (nil: any). A taint from a slice names no selector: it
// is on its device.
type deviceTaint struct {
	key                  string
	effect               resourcev1.DeviceTaintEffect
	driver, pool, device *string
}

func (t deviceTaint) selects(driver string, id deviceID) bool {
	match := func(want *string, have string) bool { return want == nil || *want == have }
	return match(t.driver, driver) && match(t.pool, id.pool) && match(t.device, id.device)
}

// evicts says a taint keeps pods off its device: NoSchedule or NoExecute
// (None, and effects Kubernetes may add later, do not).
func evicts(e resourcev1.DeviceTaintEffect) bool {
	return e == resourcev1.DeviceTaintEffectNoSchedule || e == resourcev1.DeviceTaintEffectNoExecute
}

// judgeDRA is what the slices of driver on this node (as the informer
// keeps them), the devices its health stream calls Unhealthy and the
// taints of DeviceTaintRules say of its devices: a pure function.
func judgeDRA(all []*resourcev1.ResourceSlice, driver string, unhealthy map[deviceID]bool, rules []deviceTaint, keep bool) draState {
	pools := map[string]*poolState{}
	for _, sl := range all {
		if sl.Spec.Driver != driver {
			continue
		}
		p := pools[sl.Spec.Pool.Name]
		switch {
		case p == nil:
			p = &poolState{name: sl.Spec.Pool.Name, generation: sl.Spec.Pool.Generation}
			pools[p.name] = p
		case sl.Spec.Pool.Generation > p.generation:
			*p = poolState{name: p.name, generation: sl.Spec.Pool.Generation}
		case sl.Spec.Pool.Generation < p.generation:
			continue // the scheduler ignores an older generation
		}
		p.have++
		p.want = sl.Spec.Pool.ResourceSliceCount
	}
	var s draState
	keys := map[string]bool{}
	for _, sl := range all {
		p := pools[sl.Spec.Pool.Name]
		if sl.Spec.Driver != driver || sl.Spec.Pool.Generation != p.generation || !p.complete() {
			continue
		}
		for _, d := range sl.Spec.Devices {
			id := deviceID{p.name, d.Name}
			s.devices++
			if k := deviceTaintKeys(d.Taints, rules, driver, id); len(k) > 0 {
				s.tainted++
				p.tainted++
				for _, key := range k {
					keys[key] = true
				}
				continue
			}
			if unhealthy[id] {
				s.unhealthy++
				p.unhealthy++
				s.sick = append(s.sick, id.pool+"/"+id.device)
				continue
			}
			s.usable++
			p.usable++
			if keep {
				s.matchable = append(s.matchable, d)
			}
		}
	}
	for _, name := range slices.Sorted(maps.Keys(pools)) {
		s.pools = append(s.pools, *pools[name])
	}
	s.taintKeys = slices.Sorted(maps.Keys(keys))
	slices.Sort(s.sick) // the informer's order is no order: a message must not change with it
	return s
}

// deviceTaintKeys are the keys of the taints that keep pods off device id:
// its own, in its slice, and those of the DeviceTaintRules that select it.
func deviceTaintKeys(own []resourcev1.DeviceTaint, rules []deviceTaint, driver string, id deviceID) []string {
	var out []string
	for _, t := range own {
		if evicts(t.Effect) {
			out = append(out, t.Key)
		}
	}
	for _, r := range rules {
		if evicts(r.effect) && r.selects(driver, id) {
			out = append(out, r.key)
		}
	}
	return out
}

// draVerdict is what the published and usable layers say of a driver
// the kubelet holds: ok, with what to add to the True condition's text,
// or the reason and text of False.
func draVerdict(s draState, minDevices int, classes ...string) (ok bool, reason, text string) {
	minDevices = max(minDevices, 1) // ready means usable: a device at least
	if len(s.pools) == 0 {
		return false, ReasonNoResourceSlices, "registered with the kubelet, but it has published no ResourceSlices for this node"
	}
	if in := s.incomplete(); len(in) > 0 {
		return false, ReasonPoolIncomplete, "pool " + some(len(in), func(i int) string {
			return fmt.Sprintf("%s generation %d has %d of %d ResourceSlices", in[i].name, in[i].generation, in[i].have, in[i].want)
		})
	}
	if s.usable >= minDevices {
		text := fmt.Sprintf("%d usable devices in %s", s.usable, poolNames(s.pools))
		for _, name := range classes {
			r, judged := s.classes[name]
			switch {
			case !judged:
				return false, "", "" // not matched (yet): nothing is concluded
			case r.Reason != "":
				return false, r.Reason, r.Message
			case r.Matched < minDevices:
				return false, deviceclass.ReasonNoMatch, fmt.Sprintf("%s, %d needed", r.Message, minDevices)
			}
			text += "; " + r.Message
		}
		return true, "", text
	}
	short := fmt.Sprintf("%d usable devices of %d in %s, %d needed", s.usable, s.devices, poolNames(s.pools), minDevices)
	switch {
	case s.tainted > 0:
		return false, ReasonDevicesTainted, fmt.Sprintf("%s: %d tainted NoSchedule or NoExecute (%s)", short, s.tainted,
			some(len(s.taintKeys), func(i int) string { return s.taintKeys[i] }))
	case s.unhealthy > 0:
		return false, ReasonDevicesUnhealthy, fmt.Sprintf("%s: %d Unhealthy by its DRAResourceHealth stream (%s)", short, s.unhealthy,
			some(len(s.sick), func(i int) string { return s.sick[i] }))
	}
	return false, ReasonTooFewDevices, short
}

func poolNames(ps []poolState) string {
	word := "pool "
	if len(ps) > 1 {
		word = "pools "
	}
	return word + some(len(ps), func(i int) string { return ps[i].name })
}

// unhealthyDevices are the devices a DRA driver's health stream, as its
// handler reports it on any of its sockets, says are Unhealthy (Unknown
// is not: a driver that stopped reporting is not a sick device).
func unhealthyDevices(socks []Socket) map[deviceID]bool {
	out := map[deviceID]bool{}
	for _, p := range socks {
		var ds []api.DRADeviceHealth
		switch d := p.Details.(type) {
		case api.DRADetails:
			ds = d.Devices
		case *api.DRADetails:
			ds = d.Devices
		case api.DRAObserved:
			ds = d.Devices
		case *api.DRAObserved:
			ds = d.Devices
		}
		for _, h := range ds {
			if h.Health == api.DeviceUnhealthy {
				out[deviceID{h.Pool, h.Device}] = true
			}
		}
	}
	return out
}
