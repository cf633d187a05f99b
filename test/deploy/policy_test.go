package deploy

import (
	"slices"
	"strings"
	"testing"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
)

// policyBinding is the binding of the policy named name (zero if none).
func policyBinding(o objects, name string) admissionv1.ValidatingAdmissionPolicyBinding {
	for _, b := range o.policyBindings {
		if b.Spec.PolicyName == name {
			return b
		}
	}
	return admissionv1.ValidatingAdmissionPolicyBinding{}
}

// configMapData is the data of the ConfigMap named name, and whether it is
// rendered.
func configMapData(o objects, name string) (map[string]string, bool) {
	for _, c := range o.configMaps {
		if c.Name == name {
			return c.Data, true
		}
	}
	return nil, false
}

// Issue 33: the admission policies that confine plugd's ServiceAccount and
// the caretaker's are rendered, each bound (Deny) to its parameters: plugd's
// condition types from expect (extraConfig's expect winning, as in plugd's
// configuration), the taint from removeTaintWhenReady beside the RBAC that
// lets plugd patch Nodes; they match the release's ServiceAccounts. Off,
// or for an API server without them, none is rendered and NOTES.txt warns.
// (test/kube checks what they refuse on a real API server.)
func TestAdmissionPolicyRendering(t *testing.T) {
	names := func(o objects) []string {
		var out []string
		for _, p := range o.policies {
			out = append(out, p.Name)
		}
		return out
	}
	t.Run("defaults", func(t *testing.T) {
		m, notes := mustRender(t, "")
		o := decode(t, m)
		if got := names(o); !slices.Equal(got, []string{"plugd-node-status", "plugd-node", "plugd-events", "plugd-caretaker"}) || len(o.policyBindings) != 4 {
			t.Fatalf("policies %v, %d bindings", got, len(o.policyBindings))
		}
		for _, p := range o.policies {
			b := policyBinding(o, p.Name)
			if b.Name != p.Name || !slices.Equal(b.Spec.ValidationActions, []admissionv1.ValidationAction{admissionv1.Deny}) ||
				p.Spec.FailurePolicy == nil || *p.Spec.FailurePolicy != admissionv1.Fail {
				t.Errorf("%s: binding %+v, failure policy %v", p.Name, b, p.Spec.FailurePolicy)
			}
			if (p.Spec.ParamKind != nil) != (b.Spec.ParamRef != nil) ||
				b.Spec.ParamRef != nil && (b.Spec.ParamRef.Namespace != "plugd" || *b.Spec.ParamRef.ParameterNotFoundAction != admissionv1.AllowAction) {
				// Allow: the API server looks a parameter up before it reads
				// matchConditions, so Deny would refuse everyone's writes once
				// a ConfigMap is gone (test/kube TestAdmissionPolicies).
				t.Errorf("%s: parameter %+v of kind %+v", p.Name, b.Spec.ParamRef, p.Spec.ParamKind)
			}
			user := "'system:serviceaccount:plugd:plugd'"
			if p.Name == "plugd-caretaker" {
				user = "'system:serviceaccount:plugd:plugd-caretaker'"
			}
			if len(p.Spec.MatchConditions) != 1 || !strings.HasSuffix(p.Spec.MatchConditions[0].Expression, user) {
				t.Errorf("%s matches %+v, want %s", p.Name, p.Spec.MatchConditions, user)
			}
		}
		if d, ok := configMapData(o, "plugd-admission"); !ok || d["conditions"] != "" {
			t.Errorf("with no expect, plugd-admission: %v %v", d, ok)
		}
		if _, ok := configMapData(o, "plugd-remove-taint"); ok {
			t.Error("the taint's parameter is rendered without removeTaintWhenReady")
		}
		if !strings.Contains(notes, "authentication.kubernetes.io/node-name") || strings.Contains(notes, "WARNING") {
			t.Errorf("NOTES.txt:\n%s", notes)
		}
	})

	t.Run("full", func(t *testing.T) {
		m, _ := mustRender(t, fullValues)
		o := decode(t, m)
		if d, _ := configMapData(o, "plugd-admission"); d["conditions"] != "csi.example.com/CSIPluginReady\nvendor.example/gpu-DevicePluginReady\nexample.com/GPUDriverReady\n" {
			t.Errorf("plugd's conditions: %q", d["conditions"])
		}
		if d, _ := configMapData(o, "plugd-remove-taint"); d["taints"] != "example.com/plugins-not-ready:NoSchedule\n" {
			t.Errorf("plugd's taint: %q", d["taints"])
		}
		// A resource's condition (an entry with anyOf): NAME/Ready, or
		// NAME-Ready for an extended resource's name.
		m, _ = mustRender(t, "expect: [{name: gpu.example.com, anyOf: [{type: DevicePlugin, name: example.com/gpu}, {type: DRAPlugin, name: gpu.example.com}]}, {name: example.com/fpga, anyOf: [{type: DevicePlugin, name: example.com/fpga}]}]")
		if d, _ := configMapData(decode(t, m), "plugd-admission"); d["conditions"] != "gpu.example.com/Ready\nexample.com/fpga-Ready\n" {
			t.Errorf("the resources' conditions: %q", d["conditions"])
		}
		// Each expected plugin's taint joins it, once; with them alone
		// (no taint for all) plugd may patch Nodes, for those taints.
		m, _ = mustRender(t, "expect: [{type: CSIPlugin, name: a.example.com, taint: 'a.example.com/not-ready:NoExecute'}, {type: CSIPlugin, name: b.example.com, taint: 'example.com/t:NoSchedule'}]\n"+
			"extraConfig: {expect: [{type: CSIPlugin, name: a.example.com, taint: 'a.example.com/not-ready:NoExecute'}, {type: CSIPlugin, name: c.example.com, taint: 'example.com/c:NoSchedule'}, {type: CSIPlugin, name: d.example.com, taint: 'example.com/c:NoSchedule'}]}")
		per := decode(t, m)
		if d, _ := configMapData(per, "plugd-remove-taint"); d["taints"] != "a.example.com/not-ready:NoExecute\nexample.com/c:NoSchedule\n" {
			t.Errorf("per-plugin taints, extraConfig's expect winning: %q", d["taints"])
		}
		if !strings.Contains(showOnly(m, "remove-taint-rbac.yaml"), "kind: ClusterRoleBinding") {
			t.Error("no patch nodes for per-plugin taints")
		}
		// The taint's parameter is in deploy/kubernetes with its RBAC.
		if got := showOnly(m, "remove-taint-rbac.yaml"); !strings.Contains(got, "name: plugd-remove-taint\n  namespace: plugd") {
			t.Errorf("remove-taint-rbac.yaml:\n%s", got)
		}
	})

	t.Run("extraConfig's expect and another ServiceAccount", func(t *testing.T) {
		m, _ := mustRender(t, `
expect: [{type: CSIPlugin, name: csi.example.com}]
extraConfig: {expect: [{type: DevicePlugin, name: vendor.example/gpu}, {type: example.com/Greeter, name: greeter.example.com}]}
serviceAccount: {name: node-agent}
caretaker: {enabled: false}`)
		o := decode(t, m)
		if d, _ := configMapData(o, "plugd-admission"); d["conditions"] != "vendor.example/gpu-DevicePluginReady\ngreeter.example.com/GreeterReady\n" {
			t.Errorf("plugd's conditions: %q", d["conditions"])
		}
		if got := names(o); slices.Contains(got, "plugd-caretaker") || len(got) != 3 || len(o.policyBindings) != 3 {
			t.Errorf("without the caretaker: policies %v, %d bindings", got, len(o.policyBindings))
		}
		for _, p := range o.policies {
			if !strings.HasSuffix(p.Spec.MatchConditions[0].Expression, "'system:serviceaccount:plugd:node-agent'") {
				t.Errorf("%s matches %s", p.Name, p.Spec.MatchConditions[0].Expression)
			}
		}
	})

	// Against a cluster that lists its kinds, the policy's kind decides:
	// a 1.30 whose API server serves no such policy gets none.
	t.Run("a cluster without the kind", func(t *testing.T) {
		m, notes, err := renderWith(t, "", kubeVersion, "v1/ConfigMap")
		if err != nil {
			t.Fatal(err)
		}
		if o := decode(t, m); len(o.policies) != 0 || !strings.Contains(notes, "WARNING: no admission policy") {
			t.Errorf("%d policies; NOTES.txt:\n%s", len(o.policies), notes)
		}
		m, _, err = renderWith(t, "", "v1.29.0", "v1/ConfigMap", "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy")
		if err != nil {
			t.Fatal(err)
		}
		if o := decode(t, m); len(o.policies) != 4 {
			t.Errorf("with the kind listed: %d policies", len(o.policies))
		}
	})

	for _, tc := range []struct{ name, values, kube, warns string }{
		{"off", "admissionPolicy: {enabled: false}", kubeVersion, "admissionPolicy.enabled\nis false"},
		{"Kubernetes 1.29", "kubernetes: {removeTaintWhenReady: example.com/t:NoSchedule}\nexpect: [{type: CSIPlugin, name: csi.example.com}]", "v1.29.4", "has no\nadmissionregistration.k8s.io/v1 ValidatingAdmissionPolicy"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, notes, err := renderFor(t, tc.values, tc.kube)
			if err != nil {
				t.Fatal(err)
			}
			o := decode(t, m)
			if len(o.policies)+len(o.policyBindings) != 0 || slices.ContainsFunc(o.configMaps, func(c corev1.ConfigMap) bool { return c.Name != "plugd" }) {
				t.Errorf("%d policies, %d bindings, ConfigMaps %+v", len(o.policies), len(o.policyBindings), o.configMaps)
			}
			if !strings.Contains(notes, "WARNING: no admission policy confines plugd's ServiceAccount") || !strings.Contains(notes, tc.warns) {
				t.Errorf("NOTES.txt does not warn (%q):\n%s", tc.warns, notes)
			}
		})
	}
}
