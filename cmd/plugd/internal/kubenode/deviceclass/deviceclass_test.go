package deviceclass

import (
	"context"
	"fmt"
	"strings"
	"testing"

	resourcev1 "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
)

const driver = "gpu.example.com"

// gpus are three devices as a driver publishes them: attributes without a
// domain are the driver's, one attribute of another domain, capacities.
func gpus() []resourcev1.Device {
	gpu := func(name, model, version string, mem string, extra map[resourcev1.QualifiedName]resourcev1.DeviceAttribute) resourcev1.Device {
		attrs := map[resourcev1.QualifiedName]resourcev1.DeviceAttribute{
			"model":         {StringValue: ptr.To(model)},
			"driverVersion": {VersionValue: ptr.To(version)},
			"index":         {IntValue: ptr.To[int64](int64(len(name)))},
		}
		for k, v := range extra {
			attrs[k] = v
		}
		return resourcev1.Device{Name: name, Attributes: attrs,
			Capacity: map[resourcev1.QualifiedName]resourcev1.DeviceCapacity{"memory": {Value: resource.MustParse(mem)}}}
	}
	shared := gpu("gpu-1", "A100", "1.3.0", "80Gi", map[resourcev1.QualifiedName]resourcev1.DeviceAttribute{
		"family": {StringValue: ptr.To("ampere")},
	})
	shared.AllowMultipleAllocations = ptr.To(true)
	return []resourcev1.Device{
		gpu("gpu-0", "A100", "1.2.0", "40Gi", map[resourcev1.QualifiedName]resourcev1.DeviceAttribute{
			"family":                          {StringValue: ptr.To("ampere")},
			"resource.kubernetes.io/pcieRoot": {StringValue: ptr.To("pci0000:00")},
		}),
		shared,                                   // consumable capacity: allocated to several claims at once
		gpu("gpu-2", "T4", "1.1.0", "16Gi", nil), // no family
	}
}

// class is a DeviceClass as the API server returns it, with a CEL selector
// for each expression.
func class(name string, rv int, exprs ...string) *resourcev1.DeviceClass {
	c := &resourcev1.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: name, UID: types.UID("uid-" + name), ResourceVersion: fmt.Sprint(rv)}}
	for _, e := range exprs {
		c.Spec.Selectors = append(c.Spec.Selectors, resourcev1.DeviceSelector{CEL: &resourcev1.CELDeviceSelector{Expression: e}})
	}
	return c
}

// Count evaluates real selectors with the scheduler's CEL environment: the
// driver as the default domain of attributes and capacities, versions,
// quantities, several selectors all needed; errors are findings, named.
func TestCount(t *testing.T) {
	for _, tc := range []struct {
		name  string
		exprs []string
		want  int
		err   string // a part of the error; empty: none
	}{
		{"no selectors: every device", nil, 3, ""},
		{"driver", []string{`device.driver == "gpu.example.com"`}, 3, ""},
		{"another driver", []string{`device.driver == "other.example.com"`}, 0, ""},
		{"attribute, qualified", []string{`device.attributes["gpu.example.com"].model == "A100"`}, 2, ""},
		{"attribute of another domain", []string{`"pcieRoot" in device.attributes["resource.kubernetes.io"]`}, 1, ""},
		{"optional attribute", []string{`device.attributes["gpu.example.com"].?family.orValue("") == "ampere"`}, 2, ""},
		{"version", []string{`device.attributes["gpu.example.com"].driverVersion.isGreaterThan(semver("1.1.5"))`}, 2, ""},
		{"capacity", []string{`device.capacity["gpu.example.com"].memory.compareTo(quantity("40Gi")) >= 0`}, 2, ""},
		{"all selectors", []string{`device.driver == "gpu.example.com"`, `device.capacity["gpu.example.com"].memory.isGreaterThan(quantity("50Gi"))`}, 1, ""},
		{"allowMultipleAllocations", []string{`device.allowMultipleAllocations`}, 1, ""},
		{"compile error", []string{`device.driver ==`}, 0, "selector #0: CEL compile error"},
		{"not a bool", []string{`device.driver`, `true`}, 0, "selector #0: CEL compile error"},
		{"second selector does not compile", []string{`true`, `device.nosuchfield == 1`}, 0, "selector #1: CEL compile error"},
		{"runtime error: a missing attribute", []string{`device.attributes["gpu.example.com"].family == "ampere"`}, 2,
			"selector #0 on device gpu-2: CEL runtime error: no such key: family"},
		{"the cost limit", []string{`[0,1,2,3,4,5,6,7,8,9].all(a, [0,1,2,3,4,5,6,7,8,9].all(b, [0,1,2,3,4,5,6,7,8,9].all(c, [0,1,2,3,4,5,6,7,8,9].all(d, [0,1,2,3,4,5,6,7,8,9].all(e, [0,1,2,3,4,5,6,7,8,9].all(f, a+b+c+d+e+f >= 0))))))`}, 0,
			"selector #0 on device gpu-0: CEL runtime error: operation cancelled: actual cost limit exceeded"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var m Matcher
			n, err := m.Count(t.Context(), class("gpu.example.com", 1, tc.exprs...), driver, gpus())
			if n != tc.want {
				t.Errorf("%d devices match, want %d", n, tc.want)
			}
			switch {
			case tc.err == "" && err != nil:
				t.Errorf("error %v, want none", err)
			case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
				t.Errorf("error %v, want one that says %q", err, tc.err)
			}
		})
	}
}

// A selector of a kind plugd does not know (none but CEL today) is an error,
// not a crash.
func TestCountSelectorWithoutCEL(t *testing.T) {
	var m Matcher
	c := class("gpu.example.com", 1, "true")
	c.Spec.Selectors = append(c.Spec.Selectors, resourcev1.DeviceSelector{})
	if n, err := m.Count(t.Context(), c, driver, gpus()); n != 0 || err == nil || !strings.Contains(err.Error(), "selector #1 is not a CEL selector") {
		t.Errorf("Count = %d, %v; want 0 and an error naming selector #1", n, err)
	}
}

// A class is compiled once per resourceVersion: an edit (a new
// resourceVersion) is compiled again, the same version is not; the cache
// holds at most maxClasses of them.
func TestCompiledOncePerVersion(t *testing.T) {
	var m Matcher
	c := class("gpu.example.com", 1, `device.attributes["gpu.example.com"].model == "A100"`)
	if n, _ := m.Count(t.Context(), c, driver, gpus()); n != 2 {
		t.Fatalf("%d devices match, want 2", n)
	}
	// Another expression under the same version: the compiled one stands.
	same := class("gpu.example.com", 1, `device.attributes["gpu.example.com"].model == "T4"`)
	if n, _ := m.Count(t.Context(), same, driver, gpus()); n != 2 {
		t.Errorf("the same resourceVersion was compiled again: %d devices match, want the cached 2", n)
	}
	edited := class("gpu.example.com", 2, `device.attributes["gpu.example.com"].model == "T4"`)
	if n, _ := m.Count(t.Context(), edited, driver, gpus()); n != 1 {
		t.Errorf("the edited class matches %d devices, want 1", n)
	}
	// A compile error is kept too: it is not compiled on every evaluation.
	broken := class("broken.example.com", 1, `device.driver ==`)
	_, err1 := m.Count(t.Context(), broken, driver, gpus())
	fixedSameVersion := class("broken.example.com", 1, `true`)
	if _, err2 := m.Count(t.Context(), fixedSameVersion, driver, gpus()); err1 == nil || err2 == nil {
		t.Errorf("a compile error was not kept for its version: %v, then %v", err1, err2)
	}
	for i := range 2 * maxClasses {
		_, _ = m.Count(t.Context(), class(fmt.Sprintf("c%d.example.com", i), 1, "true"), driver, nil)
	}
	if l := m.compiled.Len(); l != maxClasses {
		t.Errorf("the cache holds %d classes, want at most %d", l, maxClasses)
	}
}

// The same class on the same devices is counted once: an evaluation may
// cost a third of a second per device. Other devices, another driver, or
// the caller's devices changed in place after a count are counted again.
func TestCountedOncePerDevices(t *testing.T) {
	var m Matcher
	c := class("gpu.example.com", 1, `device.driver == "gpu.example.com" && device.attributes["gpu.example.com"].model == "A100"`)
	last := func() *count {
		v, _ := m.compiled.Get(classKey{c.UID, c.ResourceVersion})
		return v.(*compiledClass).last
	}
	devs := gpus()
	if n, _ := m.Count(t.Context(), c, driver, devs); n != 2 {
		t.Fatalf("%d devices match, want 2", n)
	}
	first := last()
	if n, _ := m.Count(t.Context(), c, driver, gpus()); n != 2 || last() != first {
		t.Errorf("the same devices were counted again (%d)", n)
	}
	devs[2].Attributes["model"] = resourcev1.DeviceAttribute{StringValue: ptr.To("A100")} // in place
	if n, _ := m.Count(t.Context(), c, driver, devs); n != 3 {
		t.Errorf("after a device changed in place, %d match, want 3", n)
	}
	if n, _ := m.Count(t.Context(), c, "other.example.com", devs); n != 0 {
		t.Errorf("another driver's devices: %d match, want 0", n)
	}
}

// Check gives the reasons and messages a condition carries.
func TestCheck(t *testing.T) {
	const name = "gpu.example.com"
	for _, tc := range []struct {
		test    string
		class   *resourcev1.DeviceClass
		min     int
		reason  string
		matched int
		message string
	}{
		{"missing", nil, 1, ReasonMissing, 0, "DeviceClass gpu.example.com does not exist"},
		{"enough", class(name, 1, `device.driver == "gpu.example.com"`), 3, "", 3, "DeviceClass gpu.example.com selects 3 of the driver's 3 usable devices"},
		{"too few", class(name, 1, `device.attributes["gpu.example.com"].model == "T4"`), 2, ReasonNoMatch, 1,
			"DeviceClass gpu.example.com selects 1 of the driver's 3 usable devices, 2 needed"},
		{"none", class(name, 1, `device.driver == "other.example.com"`), 1, ReasonNoMatch, 0,
			"DeviceClass gpu.example.com selects 0 of the driver's 3 usable devices, 1 needed"},
		{"compile error", class(name, 1, `device.driver ==`), 1, ReasonNoMatch, 0,
			"DeviceClass gpu.example.com cannot select the driver's devices: selector #0: CEL compile error: compilation failed: ERROR: <input>:1:17: Syntax error: mismatched input '<EOF>'"},
		{"runtime error, even with enough matched", class(name, 1, `device.attributes["gpu.example.com"].family == "ampere"`), 1, ReasonNoMatch, 2,
			"DeviceClass gpu.example.com cannot select the driver's devices: selector #0 on device gpu-2: CEL runtime error: no such key: family. consider using CEL optional chaining"},
	} {
		t.Run(tc.test, func(t *testing.T) {
			var m Matcher
			r, err := m.Check(t.Context(), name, tc.class, driver, gpus(), tc.min)
			if err != nil {
				t.Fatal(err)
			}
			if r.Reason != tc.reason || r.Matched != tc.matched || !strings.HasPrefix(r.Message, tc.message) {
				t.Errorf("Check = %+v; want reason %q, %d matched, a message that starts %q", r, tc.reason, tc.matched, tc.message)
			}
			if len(r.Message) > 400 {
				t.Errorf("the message is %d bytes: %q", len(r.Message), r.Message)
			}
			// The same inputs give the same message: no write for nothing.
			if again, _ := m.Check(t.Context(), name, tc.class, driver, gpus(), tc.min); again != r {
				t.Errorf("a second Check says %+v, the first %+v", again, r)
			}
		})
	}
}

// plugd stopping is no verdict on the class.
func TestCheckCancelled(t *testing.T) {
	var m Matcher
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if r, err := m.Check(ctx, driver, class(driver, 1, "true"), driver, gpus(), 1); err == nil {
		t.Errorf("Check with a cancelled context = %+v, nil; want ctx's error", r)
	}
}
