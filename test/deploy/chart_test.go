package deploy

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	"helm.sh/helm/v4/pkg/action"
	"helm.sh/helm/v4/pkg/chart/v2/lint/support"
	admissionv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/yaml"
)

// The values of each rendering kept in the repository. deploy/kubernetes
// is what kubectl users apply; testdata/rendered is what test/kube applies
// to a real API server with a server-side dry run.
var renderings = []struct {
	path, values string
	templates    []string // only these templates' objects (helm template --show-only); none: all
	header       string
}{
	{path: "deploy/kubernetes/daemonset.yaml", header: `# plugd on every node, observing the kubelet's plugins, and plugd-caretaker,
# one per cluster, marking Unknown the conditions of a plugd that stopped:
# the Helm chart charts/plugd rendered with its default values, for
# kubectl apply. Edit the chart, not this file; (cd test/deploy && go test
# . -update) renders it again, and the test fails while the two differ.
#
# Apply: kubectl apply -f deploy/kubernetes/namespace.yaml -f deploy/kubernetes/daemonset.yaml
# Look:  kubectl plugd cluster          # the kubectl plugin, from anywhere with a kubeconfig
#        kubectl plugd doctor NODE
#        kubectl -n plugd exec POD -- plugctl --socket /run/plugd/plugd.sock list
#
# The admission policies (Kubernetes 1.30 and later) let plugd write only
# the conditions the ConfigMap plugd-admission lists: when you add to
# expect in the ConfigMap plugd, add each condition type there too.
`},
	{path: "deploy/kubernetes/namespace.yaml", values: "namespace: {create: true}", templates: []string{"namespace.yaml"}, header: `# The namespace of deploy/kubernetes/daemonset.yaml, with the Pod Security
# level plugd's hostPath volumes need: the chart's namespace.create.
# Rendered from charts/plugd; do not edit.
`},
	{path: "deploy/kubernetes/remove-taint-rbac.yaml", values: "kubernetes: {removeTaintWhenReady: example.com/plugins-not-ready:NoSchedule}\nexpect: [{type: CSIPlugin, name: csi.example.com}]",
		templates: []string{"remove-taint-rbac.yaml"}, header: `# Only for kubernetes.removeTaintWhenReady (set it in the ConfigMap of
# daemonset.yaml): the permission to remove the startup taint, which the
# chart grants when the value is set, and the taint the admission policy
# plugd-node lets plugd add or remove (ConfigMap plugd-remove-taint: set it
# to the same KEY:EFFECT). Rendered from charts/plugd; do not edit.
#
# Apply: kubectl apply -f deploy/kubernetes/remove-taint-rbac.yaml
`},
	{path: "test/deploy/testdata/rendered/full.yaml", values: fullValues},
	{path: "test/deploy/testdata/rendered/minimal.yaml", values: minimalValues},
	// The kubelet's TLS, each way on its own (they exclude each other): the
	// DaemonSet's mounts and the ConfigMap, which test/kube applies.
	{path: "test/deploy/testdata/rendered/kubelet-serving-cert.yaml", values: servingCertValues, templates: []string{"configmap.yaml", "daemonset.yaml"}},
	{path: "test/deploy/testdata/rendered/kubelet-insecure.yaml", values: insecureValues, templates: []string{"configmap.yaml", "daemonset.yaml"}},
}

// The kubelet's TLS: verified with its self-signed serving certificate, or
// not verified.
const (
	servingCertValues = "kubelet: {servingCertFile: /var/lib/kubelet/pki/kubelet.crt}"
	insecureValues    = "kubelet: {insecureSkipTLSVerify: true}"
)

// fullValues turns every option on.
const fullValues = `
namespace: {create: true}
image: {digest: "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef", pullPolicy: Always}
imagePullSecrets: [{name: registry}]
expect:
  - {type: CSIPlugin, name: csi.example.com}
  - {type: DevicePlugin, name: vendor.example/gpu, minHealthyDevices: 2}
  - {type: DRAPlugin, name: gpu.example.com, condition: example.com/GPUDriverReady}
kubernetes: {removeTaintWhenReady: "example.com/plugins-not-ready:NoSchedule", disagreementGrace: 30s}
log: {format: text, level: debug}
liveness: {probeInterval: 1m}
extraConfig: {resyncInterval: 1m, doctor: {procDir: none}}
rbac: {extraRules: [{apiGroups: [storage.k8s.io], resources: [csidrivers], verbs: [list, watch]}]}
kubelet: {rootDir: /var/lib/k0s/kubelet, servingCertFile: /var/lib/k0s/kubelet/pki/kubelet.crt}
extraArgs: [--workers=64]
extraEnv: [{name: GODEBUG, value: "madvdontneed=1"}]
extraVolumes: [{name: machine-id, hostPath: {path: /etc/machine-id, type: File}}]
extraVolumeMounts: [{name: machine-id, mountPath: /etc/machine-id, readOnly: true}]
nodeSelector: {kubernetes.io/os: linux}
affinity: {nodeAffinity: {requiredDuringSchedulingIgnoredDuringExecution: {nodeSelectorTerms: [{matchExpressions: [{key: example.com/no-plugd, operator: DoesNotExist}]}]}}}
podAnnotations: {example.com/team: storage}
podLabels: {example.com/team: storage}
status: {port: 9191}
networkPolicy: {from: [{namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: observability}}}]}
serviceMonitor: {enabled: true, interval: 15s, labels: {release: prometheus}}
prometheusRule: {enabled: true, labels: {release: prometheus}}
caretaker: {nodeSelector: {node-role.kubernetes.io/control-plane: ""}, tolerations: [{key: node-role.kubernetes.io/control-plane, operator: Exists, effect: NoSchedule}], priorityClassName: system-cluster-critical, extraArgs: [--log-level=debug]}
`

// minimalValues turns every option off.
const minimalValues = `
serviceAccount: {create: false, name: node-agents}
rbac: {create: false}
networkPolicy: {enabled: false}
scrapeAnnotations: false
priorityClassName: ""
tolerations: []
goMemLimit: ""
caretaker: {enabled: false}
admissionPolicy: {enabled: false}
`

// The generated files are the chart's renderings, byte for byte, and the
// chart's copy of the mixin's rules is the mixin's.
func TestGenerated(t *testing.T) {
	// First the chart's copy of the rules, which a rendering holds.
	rules, err := os.ReadFile(filepath.Join(repo, "deploy", "monitoring", "rules.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	golden(t, "charts/plugd/files/rules.yaml", string(rules))
	for _, r := range renderings {
		m, _ := mustRender(t, r.values)
		if len(r.templates) > 0 {
			m = showOnly(m, r.templates...)
		}
		if m == "" {
			t.Fatalf("%s: the chart renders nothing with %q", r.path, r.values)
		}
		golden(t, r.path, r.header+m)
	}
}

// helm lint --strict passes for every rendering's values.
func TestLint(t *testing.T) {
	for _, r := range renderings {
		vals := map[string]any{}
		if err := yaml.Unmarshal([]byte(r.values), &vals); err != nil {
			t.Fatal(err)
		}
		l := action.NewLint()
		l.Strict = true
		l.Namespace = namespace
		res := l.Run([]string{chartDir}, vals)
		for _, m := range res.Messages {
			if m.Severity >= support.WarningSev {
				t.Errorf("helm lint --strict with the values of %s: %s", r.path, m)
			}
		}
		for _, err := range res.Errors {
			t.Errorf("helm lint --strict with the values of %s: %v", r.path, err)
		}
	}
}

// objects is a rendering, each object decoded strictly into its API type.
type objects struct {
	namespaces      []corev1.Namespace
	serviceAccounts []corev1.ServiceAccount
	configMaps      []corev1.ConfigMap
	services        []corev1.Service
	clusterRoles    []rbacv1.ClusterRole
	bindings        []rbacv1.ClusterRoleBinding
	roles           []rbacv1.Role
	roleBindings    []rbacv1.RoleBinding
	daemonSets      []appsv1.DaemonSet
	deployments     []appsv1.Deployment
	networkPolicies []networkingv1.NetworkPolicy
	serviceMonitors []monitoringv1.ServiceMonitor
	prometheusRules []monitoringv1.PrometheusRule
	policies        []admissionv1.ValidatingAdmissionPolicy
	policyBindings  []admissionv1.ValidatingAdmissionPolicyBinding
}

// decode decodes every document of manifest by its apiVersion and kind,
// strictly: a field the type lacks, a duplicate key, a number where a
// string belongs (as kubectl would send it) or an unknown kind fails.
func decode(t *testing.T, manifest string) objects {
	t.Helper()
	var o objects
	for i, doc := range strings.Split(manifest, "\n---\n") {
		var tm metav1.TypeMeta
		if err := yaml.Unmarshal([]byte(doc), &tm); err != nil {
			t.Fatalf("document %d: %v", i+1, err)
		}
		if tm.Kind == "" {
			continue
		}
		var obj any
		add := func(list any) any {
			v := reflect.ValueOf(list).Elem()
			v.Set(reflect.Append(v, reflect.Zero(v.Type().Elem())))
			return v.Index(v.Len() - 1).Addr().Interface()
		}
		switch tm.APIVersion + " " + tm.Kind {
		case "v1 Namespace":
			obj = add(&o.namespaces)
		case "v1 ServiceAccount":
			obj = add(&o.serviceAccounts)
		case "v1 ConfigMap":
			obj = add(&o.configMaps)
		case "v1 Service":
			obj = add(&o.services)
		case "rbac.authorization.k8s.io/v1 ClusterRole":
			obj = add(&o.clusterRoles)
		case "rbac.authorization.k8s.io/v1 ClusterRoleBinding":
			obj = add(&o.bindings)
		case "rbac.authorization.k8s.io/v1 Role":
			obj = add(&o.roles)
		case "rbac.authorization.k8s.io/v1 RoleBinding":
			obj = add(&o.roleBindings)
		case "apps/v1 DaemonSet":
			obj = add(&o.daemonSets)
		case "apps/v1 Deployment":
			obj = add(&o.deployments)
		case "networking.k8s.io/v1 NetworkPolicy":
			obj = add(&o.networkPolicies)
		case "monitoring.coreos.com/v1 ServiceMonitor":
			obj = add(&o.serviceMonitors)
		case "monitoring.coreos.com/v1 PrometheusRule":
			obj = add(&o.prometheusRules)
		case "admissionregistration.k8s.io/v1 ValidatingAdmissionPolicy":
			obj = add(&o.policies)
		case "admissionregistration.k8s.io/v1 ValidatingAdmissionPolicyBinding":
			obj = add(&o.policyBindings)
		default:
			t.Fatalf("document %d: unknown kind %q of apiVersion %q", i+1, tm.Kind, tm.APIVersion)
		}
		if err := yaml.UnmarshalStrict([]byte(doc), obj); err != nil {
			t.Fatalf("document %d (%s): %v", i+1, tm.Kind, err)
		}
		j, err := yaml.YAMLToJSONStrict([]byte(doc))
		if err != nil {
			t.Fatalf("document %d (%s): %v", i+1, tm.Kind, err)
		}
		dec := json.NewDecoder(bytes.NewReader(j))
		dec.DisallowUnknownFields()
		if err := dec.Decode(reflect.New(reflect.TypeOf(obj).Elem()).Interface()); err != nil {
			t.Fatalf("document %d (%s), as kubectl sends it: %v", i+1, tm.Kind, err)
		}
	}
	return o
}

// runConfig is what plugd runs with in the DaemonSet's container: its args
// with --config pointing at the ConfigMap's config.yaml, and its env.
func runConfig(t *testing.T, o objects) (map[string]any, error) {
	t.Helper()
	// plugd's is the ConfigMap with a config.yaml; the others are the
	// admission policies' parameters.
	configs := slices.DeleteFunc(slices.Clone(o.configMaps), func(c corev1.ConfigMap) bool { _, ok := c.Data["config.yaml"]; return !ok })
	if len(o.daemonSets) != 1 || len(configs) != 1 {
		t.Fatalf("want one DaemonSet and one ConfigMap of plugd's, have %d and %d", len(o.daemonSets), len(configs))
	}
	c := o.daemonSets[0].Spec.Template.Spec.Containers[0]
	local := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(local, []byte(configs[0].Data["config.yaml"]), 0o600); err != nil {
		t.Fatal(err)
	}
	args := slices.Clone(c.Args)
	for i, a := range args {
		if strings.HasPrefix(a, "--config=") {
			args[i] = "--config=" + local
		}
	}
	env := map[string]string{}
	for _, e := range c.Env {
		env[e.Name] = e.Value
		if e.ValueFrom != nil && e.ValueFrom.FieldRef != nil {
			// What the field holds stands in for its value, lowercase so
			// that spec.nodeName passes as a Node's name.
			env[e.Name] = "fieldref." + strings.ToLower(e.ValueFrom.FieldRef.FieldPath)
		}
	}
	out, err := checkConfig(t, args, env)
	if err != nil {
		return nil, err
	}
	cfg := map[string]any{}
	if err := yaml.Unmarshal([]byte(out), &cfg); err != nil {
		t.Fatal(err)
	}
	return cfg, nil
}

// get is the value at a dotted path of a decoded YAML map.
func get(m map[string]any, path string) any {
	var v any = m
	for k := range strings.SplitSeq(path, ".") {
		mm, ok := v.(map[string]any)
		if !ok {
			return nil
		}
		v = mm[k]
	}
	return v
}

// Every rendering decodes strictly, plugd accepts its configuration and
// flags, and each option does what its value says.
func TestRenderings(t *testing.T) {
	t.Run("the caretaker's graces set; the CSINode sign off", func(t *testing.T) {
		m, _ := mustRender(t, `caretaker: {podGrace: 90s, csiNodeGrace: ""}`)
		o := decode(t, m)
		args := o.deployments[0].Spec.Template.Spec.Containers[0].Args
		if !slices.Contains(args, "--pod-grace=90s") || !slices.Contains(args, "--csinode-grace=0s") {
			t.Errorf("the caretaker's args: %q", args)
		}
		for _, r := range clusterRole(o, "plugd-caretaker").Rules {
			if slices.Contains(r.Resources, "csinodes") {
				t.Errorf("the caretaker may read CSINodes it does not watch: %+v", r)
			}
		}
	})
	t.Run("defaults", func(t *testing.T) {
		m, notes := mustRender(t, "")
		o := decode(t, m)
		if len(o.namespaces)+len(o.serviceMonitors)+len(o.prometheusRules)+len(o.services) != 0 {
			t.Errorf("the defaults render a Namespace, Service, ServiceMonitor or PrometheusRule: %d %d %d %d", len(o.namespaces), len(o.services), len(o.serviceMonitors), len(o.prometheusRules))
		}
		if len(o.clusterRoles) != 2 || len(o.networkPolicies) != 1 {
			t.Errorf("the defaults render %d ClusterRoles (want 2, plugd's and the caretaker's: no taint removal) and %d NetworkPolicies", len(o.clusterRoles), len(o.networkPolicies))
		}
		checkCaretaker(t, o)
		// plugd's ClusterRole is what it uses: informers list and watch
		// (plugd gets no object by name), one PATCH of its Node's status,
		// events, and the kubelet's /metrics (nodes/metrics, the kubelet's
		// SubjectAccessReview asks for get).
		want := []rbacv1.PolicyRule{
			{APIGroups: []string{""}, Resources: []string{"nodes"}, Verbs: []string{"list", "watch"}},
			{APIGroups: []string{""}, Resources: []string{"nodes/status"}, Verbs: []string{"patch"}},
			{APIGroups: []string{"storage.k8s.io"}, Resources: []string{"csinodes"}, Verbs: []string{"list", "watch"}},
			{APIGroups: []string{"resource.k8s.io"}, Resources: []string{"resourceslices", "devicetaintrules"}, Verbs: []string{"list", "watch"}},
			{APIGroups: []string{"events.k8s.io"}, Resources: []string{"events"}, Verbs: []string{"create", "patch"}},
			{APIGroups: []string{""}, Resources: []string{"nodes/metrics"}, Verbs: []string{"get"}},
		}
		if r := clusterRole(o, "plugd").Rules; !reflect.DeepEqual(r, want) {
			t.Errorf("plugd's ClusterRole:\n  got  %+v\n  want %+v", r, want)
		}
		cfg, err := runConfig(t, o)
		if err != nil {
			t.Fatal(err)
		}
		for path, want := range map[string]any{"mode": "observe", "registryDir": "/var/lib/kubelet/plugins_registry",
			"kubernetes.nodeName": "fieldref.spec.nodename", "log.format": "json", "status.tcp": "0.0.0.0:9090"} {
			if got := get(cfg, path); got != want {
				t.Errorf("plugd runs with %s %v, want %v", path, got, want)
			}
		}
		if hs, _ := get(cfg, "handlers").([]any); len(hs) != 3 {
			t.Errorf("plugd runs with handlers %v", hs)
		}
		if ds := o.daemonSets[0]; ds.Spec.Template.Spec.Containers[0].Image != "ghcr.io/plugd/plugd:"+loadChart(t).Metadata.AppVersion {
			t.Errorf("image %s is not the chart's appVersion", ds.Spec.Template.Spec.Containers[0].Image)
		}
		for _, want := range []string{"kubectl plugd cluster -o wide", "kubectl plugd doctor NODE", "expect is empty", "go build ./cmd/kubectl-plugd"} {
			if !strings.Contains(notes, want) {
				t.Errorf("NOTES.txt does not say %q:\n%s", want, notes)
			}
		}
		// Only what exists: the plugin is in no krew index yet.
		if strings.Contains(notes, "krew") {
			t.Errorf("NOTES.txt names krew, where plugd is not yet:\n%s", notes)
		}
	})

	t.Run("deviceClasses: plugd may read DeviceClasses, only then", func(t *testing.T) {
		readsClasses := func(o objects) bool {
			return slices.ContainsFunc(clusterRole(o, "plugd").Rules, func(p rbacv1.PolicyRule) bool {
				return slices.Equal(p.APIGroups, []string{"resource.k8s.io"}) && slices.Equal(p.Resources, []string{"deviceclasses"}) && slices.Equal(p.Verbs, []string{"list", "watch"})
			})
		}
		for values, want := range map[string]bool{
			"expect: [{type: DRAPlugin, name: gpu.example.com, deviceClasses: [gpu.example.com]}]":                                   true,
			"extraConfig: {expect: [{type: DRAPlugin, name: gpu.example.com, deviceClasses: [gpu.example.com]}]}":                    true,
			"expect: [{type: DRAPlugin, name: gpu.example.com}]":                                                                     false,
			"expect: [{name: gpu.example.com, anyOf: [{type: DRAPlugin, name: gpu.example.com, deviceClasses: [gpu.example.com]}]}]": true,
			"expect: [{type: DRAPlugin, name: gpu.example.com, deviceClasses: [gpu.example.com]}]\nextraConfig: {expect: []}":        false,
		} {
			m, _ := mustRender(t, values)
			o := decode(t, m)
			if got := readsClasses(o); got != want {
				t.Errorf("values %q: plugd may list and watch deviceclasses: %v, want %v", values, got, want)
			}
			if _, err := runConfig(t, o); err != nil {
				t.Errorf("values %q: %v", values, err)
			}
		}
	})

	t.Run("full", func(t *testing.T) {
		m, notes := mustRender(t, fullValues)
		o := decode(t, m)
		if len(o.namespaces) != 1 || o.namespaces[0].Labels["pod-security.kubernetes.io/enforce"] != "privileged" {
			t.Errorf("namespace.create: %+v", o.namespaces)
		}
		if len(o.clusterRoles) != 3 || len(o.bindings) != 3 {
			t.Fatalf("with removeTaintWhenReady: %d ClusterRoles and %d bindings, want 3 and 3 (plugd's, the taint's, the caretaker's)", len(o.clusterRoles), len(o.bindings))
		}
		if r := clusterRole(o, "plugd-remove-taint"); r.Name != "plugd-remove-taint" || len(r.Rules) != 1 || !slices.Equal(r.Rules[0].Verbs, []string{"patch"}) || !slices.Equal(r.Rules[0].Resources, []string{"nodes"}) {
			t.Errorf("the taint's ClusterRole: %+v", r)
		}
		if r := clusterRole(o, "plugd").Rules; !slices.ContainsFunc(r, func(p rbacv1.PolicyRule) bool { return slices.Equal(p.Resources, []string{"csidrivers"}) }) {
			t.Errorf("rbac.extraRules are not in the ClusterRole: %+v", r)
		}
		cfg, err := runConfig(t, o)
		if err != nil {
			t.Fatal(err)
		}
		for path, want := range map[string]any{"registryDir": "/var/lib/k0s/kubelet/plugins_registry", "log.format": "text", "log.level": "debug",
			"liveness.probeInterval": "1m0s", "resyncInterval": "1m0s", "workers": float64(64), "status.tcp": "0.0.0.0:9191",
			"kubernetes.removeTaintWhenReady": "example.com/plugins-not-ready:NoSchedule", "kubernetes.disagreementGrace": "30s", "doctor.procDir": "none"} {
			if got := get(cfg, path); got != want {
				t.Errorf("plugd runs with %s %v (%T), want %v", path, got, got, want)
			}
		}
		if ex, _ := get(cfg, "expect").([]any); len(ex) != 3 {
			t.Errorf("plugd runs with expect %v", ex)
		}
		pod := o.daemonSets[0].Spec.Template.Spec
		c := pod.Containers[0]
		if !strings.HasSuffix(c.Image, "@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef") || c.ImagePullPolicy != corev1.PullAlways {
			t.Errorf("image %s, pull policy %s", c.Image, c.ImagePullPolicy)
		}
		if c.Ports[0].ContainerPort != 9191 || c.ReadinessProbe.HTTPGet.Port.StrVal != "status" {
			t.Errorf("status.port: ports %+v", c.Ports)
		}
		if pod.NodeSelector["kubernetes.io/os"] != "linux" || pod.Affinity == nil || len(pod.ImagePullSecrets) != 1 ||
			!slices.ContainsFunc(pod.Volumes, func(v corev1.Volume) bool { return v.Name == "machine-id" }) ||
			!slices.ContainsFunc(c.VolumeMounts, func(v corev1.VolumeMount) bool { return v.Name == "machine-id" && v.ReadOnly }) {
			t.Errorf("the pod lacks a value: %+v", pod)
		}
		checkServingCert(t, o, "/var/lib/k0s/kubelet/pki/kubelet.crt")
		if np := o.networkPolicies[0]; np.Spec.Ingress[0].Ports[0].Port.IntValue() != 9191 ||
			np.Spec.Ingress[0].From[0].NamespaceSelector.MatchLabels["kubernetes.io/metadata.name"] != "observability" {
			t.Errorf("NetworkPolicy: %+v", np.Spec)
		}
		if len(o.serviceMonitors) != 1 || len(o.services) != 1 || o.serviceMonitors[0].Labels["release"] != "prometheus" ||
			o.serviceMonitors[0].Spec.Endpoints[0].Port != o.services[0].Spec.Ports[0].Name {
			t.Errorf("serviceMonitor: %+v %+v", o.serviceMonitors, o.services)
		}
		if ct := checkCaretaker(t, o); ct.NodeSelector["node-role.kubernetes.io/control-plane"] != "" || len(ct.Tolerations) != 1 ||
			ct.PriorityClassName != "system-cluster-critical" || !slices.Contains(ct.Containers[0].Args, "--log-level=debug") || len(ct.ImagePullSecrets) != 1 {
			t.Errorf("the caretaker's pod lacks a value: %+v", ct)
		}
		if len(o.prometheusRules) != 1 || len(o.prometheusRules[0].Spec.Groups) == 0 {
			t.Errorf("prometheusRule: %+v", o.prometheusRules)
		}
		for _, want := range []string{"csi.example.com/CSIPluginReady", "vendor.example/gpu-DevicePluginReady", "example.com/GPUDriverReady",
			"removes the taint example.com/plugins-not-ready:NoSchedule", "go build ./cmd/kubectl-plugd"} {
			if !strings.Contains(notes, want) {
				t.Errorf("NOTES.txt does not say %q:\n%s", want, notes)
			}
		}
	})

	t.Run("minimal", func(t *testing.T) {
		m, _ := mustRender(t, minimalValues)
		o := decode(t, m)
		if len(o.serviceAccounts)+len(o.clusterRoles)+len(o.bindings)+len(o.networkPolicies)+len(o.deployments)+len(o.policies)+len(o.policyBindings) != 0 {
			t.Errorf("with everything off: %d ServiceAccounts, %d ClusterRoles, %d bindings, %d NetworkPolicies, %d Deployments, %d admission policies, %d of their bindings",
				len(o.serviceAccounts), len(o.clusterRoles), len(o.bindings), len(o.networkPolicies), len(o.deployments), len(o.policies), len(o.policyBindings))
		}
		pod := o.daemonSets[0].Spec.Template.Spec
		if pod.ServiceAccountName != "node-agents" || pod.PriorityClassName != "" || len(pod.Tolerations) != 0 ||
			slices.ContainsFunc(pod.Containers[0].Env, func(e corev1.EnvVar) bool { return e.Name == "GOMEMLIMIT" }) {
			t.Errorf("pod: %+v", pod)
		}
		if _, err := runConfig(t, o); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("kubelet serving certificate", func(t *testing.T) {
		m, _ := mustRender(t, servingCertValues)
		checkServingCert(t, decode(t, m), "/var/lib/kubelet/pki/kubelet.crt")
	})

	t.Run("kubelet not verified", func(t *testing.T) {
		m, _ := mustRender(t, insecureValues)
		o := decode(t, m)
		cfg, err := runConfig(t, o)
		if err != nil {
			t.Fatal(err)
		}
		if got := get(cfg, "kubernetes.kubelet.insecureSkipTLSVerify"); got != true {
			t.Errorf("plugd runs with kubernetes.kubelet.insecureSkipTLSVerify %v", got)
		}
		if got := get(cfg, "kubernetes.kubelet.caFile"); got != nil {
			t.Errorf("plugd runs with kubernetes.kubelet.caFile %v", got)
		}
		if pod := o.daemonSets[0].Spec.Template.Spec; slices.ContainsFunc(pod.Volumes, func(v corev1.Volume) bool { return v.Name == "kubelet-cert" }) {
			t.Errorf("a kubelet certificate mounted while not verifying: %+v", pod.Volumes)
		}
	})

	// The chart's monitoring toggles, each on its own: the ServiceMonitor
	// (and the Service it selects) without the rules, the rules without it.
	t.Run("serviceMonitor alone", func(t *testing.T) {
		m, _ := mustRender(t, "serviceMonitor: {enabled: true}")
		o := decode(t, m)
		if len(o.serviceMonitors) != 1 || len(o.services) != 1 || len(o.prometheusRules) != 0 ||
			o.serviceMonitors[0].Spec.Endpoints[0].Port != o.services[0].Spec.Ports[0].Name {
			t.Errorf("serviceMonitor alone: %d ServiceMonitors, %d Services, %d PrometheusRules", len(o.serviceMonitors), len(o.services), len(o.prometheusRules))
		}
		if _, err := runConfig(t, o); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("prometheusRule alone", func(t *testing.T) {
		m, _ := mustRender(t, "prometheusRule: {enabled: true}")
		o := decode(t, m)
		if len(o.prometheusRules) != 1 || len(o.serviceMonitors)+len(o.services) != 0 {
			t.Fatalf("prometheusRule alone: %d PrometheusRules, %d ServiceMonitors, %d Services", len(o.prometheusRules), len(o.serviceMonitors), len(o.services))
		}
		var alerts int
		for _, g := range o.prometheusRules[0].Spec.Groups {
			for _, r := range g.Rules {
				if r.Alert != "" {
					alerts++
				}
			}
		}
		if want := len(alertNames(t)); alerts != want {
			t.Errorf("the PrometheusRule has %d alerts; deploy/monitoring/rules.yaml has %d", alerts, want)
		}
		if _, err := runConfig(t, o); err != nil {
			t.Fatal(err)
		}
	})

	// Under another name, the alerts on kube-state-metrics name this
	// release's DaemonSet and caretaker Deployment, not "plugd": an alert
	// on a series that never exists would never fire.
	t.Run("prometheusRule under another name", func(t *testing.T) {
		m, _ := mustRender(t, "prometheusRule: {enabled: true}\nserviceMonitor: {enabled: true}\nfullnameOverride: node-plugins\nnameOverride: node-plugins")
		o := decode(t, m)
		// The series keep job="plugd", which every rule and the dashboard
		// select, whatever the chart's names.
		if len(o.serviceMonitors) != 1 || o.serviceMonitors[0].Spec.JobLabel != "" || !slices.ContainsFunc(o.serviceMonitors[0].Spec.Endpoints[0].RelabelConfigs,
			func(r monitoringv1.RelabelConfig) bool {
				return r.TargetLabel == "job" && len(r.SourceLabels) == 0 && r.Replacement != nil && *r.Replacement == "plugd"
			}) {
			t.Errorf("serviceMonitor under another name: %+v", o.serviceMonitors)
		}
		if len(o.prometheusRules) != 1 || len(o.daemonSets) != 1 || len(o.deployments) != 1 {
			t.Fatalf("%d PrometheusRules, %d DaemonSets, %d Deployments", len(o.prometheusRules), len(o.daemonSets), len(o.deployments))
		}
		exprs := map[string]string{}
		for _, g := range o.prometheusRules[0].Spec.Groups {
			for _, r := range g.Rules {
				exprs[r.Alert] = r.Expr.String()
			}
		}
		for alert, want := range map[string]string{
			"PlugdNotRunningOnNodes":   `daemonset="` + o.daemonSets[0].Name + `"`,
			"PlugdCaretakerNotRunning": `deployment="` + o.deployments[0].Name + `"`,
		} {
			if e, ok := exprs[alert]; !ok || !strings.Contains(e, want) || strings.Contains(e, `"plugd"`) || strings.Contains(e, `"plugd-caretaker"`) {
				t.Errorf("%s: %q; want it to select %s", alert, e, want)
			}
		}
	})

	// The registration SLO's threshold and objective from the values reach
	// every rule of the SLO: no 30 s or 99% of the file's is left.
	t.Run("prometheusRule's SLO", func(t *testing.T) {
		m, _ := mustRender(t, "prometheusRule: {enabled: true, slo: {registrationSeconds: 60, objective: 0.995}}")
		o := decode(t, m)
		if len(o.prometheusRules) != 1 {
			t.Fatalf("%d PrometheusRules", len(o.prometheusRules))
		}
		var slo int
		for _, g := range o.prometheusRules[0].Spec.Groups {
			for _, r := range g.Rules {
				text := r.Expr.String() + fmt.Sprint(r.Labels, r.Annotations)
				if !strings.Contains(r.Record+r.Alert, "registration_slo") && !strings.HasPrefix(r.Alert, "PlugdRegistrationSLO") {
					continue
				}
				slo++
				for _, old := range []string{`le="30"`, "0.99)", "within 30 s"} {
					if strings.Contains(text, old) {
						t.Errorf("%s%s: still has %s: %s", r.Record, r.Alert, old, text)
					}
				}
				var want []string
				switch {
				case r.Alert != "":
					want = []string{"(1 - 0.995)", "within 60 s"}
				case r.Record == "plugd:registration_slo:objective":
					want = []string{"vector(0.995)", "threshold_seconds:60"}
				default:
					want = []string{`le="60"`}
				}
				for _, w := range want {
					if !strings.Contains(text, w) {
						t.Errorf("%s%s: no %s: %s", r.Record, r.Alert, w, text)
					}
				}
			}
		}
		if slo != 10 {
			t.Errorf("%d rules of the SLO; the mixin has 10 (the objective, 7 windows, 2 alerts)", slo)
		}
	})

	// A value the schema lets through but plugd refuses is caught by plugd
	// --check-config, naming the field.
	t.Run("refused by plugd", func(t *testing.T) {
		m, _ := mustRender(t, "extraConfig: {workers: 100000}")
		if _, err := runConfig(t, decode(t, m)); err == nil || !strings.Contains(err.Error(), "workers") {
			t.Errorf("plugd accepts workers 100000: %v", err)
		}
		m, _ = mustRender(t, "extraArgs: [--no-such-flag]")
		if _, err := runConfig(t, decode(t, m)); err == nil || !strings.Contains(err.Error(), "no-such-flag") {
			t.Errorf("plugd accepts --no-such-flag: %v", err)
		}
	})
}

// checkServingCert checks a rendering with kubelet.servingCertFile set to
// file: plugd verifies the kubelet with that file, mounted alone and
// read-only at its own path (the kubelet's pki directory, which holds its
// keys, is not mounted).
func checkServingCert(t *testing.T, o objects, file string) {
	t.Helper()
	cfg, err := runConfig(t, o)
	if err != nil {
		t.Fatal(err)
	}
	if got := get(cfg, "kubernetes.kubelet.caFile"); got != file {
		t.Errorf("plugd runs with kubernetes.kubelet.caFile %v, want %s", got, file)
	}
	if got := get(cfg, "kubernetes.kubelet.insecureSkipTLSVerify"); got != nil && got != false {
		t.Errorf("plugd runs with kubernetes.kubelet.insecureSkipTLSVerify %v", got)
	}
	pod := o.daemonSets[0].Spec.Template.Spec
	i := slices.IndexFunc(pod.Volumes, func(v corev1.Volume) bool { return v.HostPath != nil && v.HostPath.Path == file })
	if i < 0 || pod.Volumes[i].HostPath.Type == nil || *pod.Volumes[i].HostPath.Type != corev1.HostPathFile {
		t.Fatalf("the certificate %s is not a hostPath volume of type File: %+v", file, pod.Volumes)
	}
	if !slices.ContainsFunc(pod.Containers[0].VolumeMounts, func(m corev1.VolumeMount) bool {
		return m.Name == pod.Volumes[i].Name && m.MountPath == file && m.ReadOnly
	}) {
		t.Errorf("the certificate is not mounted read-only at %s: %+v", file, pod.Containers[0].VolumeMounts)
	}
	for _, v := range pod.Volumes {
		if v.HostPath != nil && strings.HasSuffix(strings.TrimSuffix(v.HostPath.Path, "/"), "/pki") {
			t.Errorf("the kubelet's pki directory is mounted: %+v", v)
		}
	}
}

// alertNames are the alerts of deploy/monitoring/rules.yaml.
func alertNames(t *testing.T) []string {
	t.Helper()
	var out []string
	for _, g := range parseRules(t).Groups {
		for _, r := range g.Rules {
			if r.Alert != "" {
				out = append(out, r.Alert)
			}
		}
	}
	return out
}

// clusterRole is the ClusterRole named name (zero if none).
func clusterRole(o objects, name string) rbacv1.ClusterRole {
	for _, r := range o.clusterRoles {
		if r.Name == name {
			return r
		}
	}
	return rbacv1.ClusterRole{}
}

// checkCaretaker checks the caretaker's objects: one replica of plugd
// caretaker, in the node agent's image, not root, with a ServiceAccount of
// its own bound to a ClusterRole that reads Nodes and CSINodes and patches
// Nodes' status, and nothing more; no selector of the node agent's picks
// its pod. It returns its pod.
func checkCaretaker(t *testing.T, o objects) corev1.PodSpec {
	t.Helper()
	if len(o.deployments) != 1 {
		t.Fatalf("%d Deployments, want the caretaker's", len(o.deployments))
	}
	d := o.deployments[0]
	pod := d.Spec.Template.Spec
	c := pod.Containers[0]
	ds := o.daemonSets[0]
	if d.Name != "plugd-caretaker" || d.Spec.Replicas == nil || *d.Spec.Replicas != 1 || len(pod.Containers) != 1 ||
		c.Image != ds.Spec.Template.Spec.Containers[0].Image || len(c.Args) == 0 || c.Args[0] != "caretaker" || len(pod.Volumes) != 0 {
		t.Errorf("the caretaker's Deployment: %+v", d)
	}
	sc, psc := c.SecurityContext, pod.SecurityContext
	if sc == nil || psc == nil || psc.RunAsNonRoot == nil || !*psc.RunAsNonRoot || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem ||
		sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation || sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) {
		t.Errorf("the caretaker's container is not hardened: %+v %+v", psc, sc)
	}
	sel := metav1.LabelSelector{MatchLabels: ds.Spec.Selector.MatchLabels}
	if s, _ := metav1.LabelSelectorAsSelector(&sel); s.Matches(labels.Set(d.Spec.Template.Labels)) {
		t.Errorf("the DaemonSet's selector %v picks the caretaker's pod %v", ds.Spec.Selector, d.Spec.Template.Labels)
	}
	r := clusterRole(o, "plugd-caretaker")
	want := []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"nodes"}, Verbs: []string{"get", "list", "watch"}},
		{APIGroups: []string{""}, Resources: []string{"nodes/status"}, Verbs: []string{"patch"}},
		{APIGroups: []string{"storage.k8s.io"}, Resources: []string{"csinodes"}, Verbs: []string{"list", "watch"}},
	}
	if !reflect.DeepEqual(r.Rules, want) {
		t.Errorf("the caretaker's ClusterRole: %+v", r.Rules)
	}
	checkCaretakerPods(t, o, d, ds)
	bound := slices.ContainsFunc(o.bindings, func(b rbacv1.ClusterRoleBinding) bool {
		return b.RoleRef.Name == r.Name && len(b.Subjects) == 1 && b.Subjects[0].Name == pod.ServiceAccountName
	})
	if !bound || pod.ServiceAccountName == ds.Spec.Template.Spec.ServiceAccountName {
		t.Errorf("the caretaker runs as %q, bound to its ClusterRole: %v", pod.ServiceAccountName, bound)
	}
	// The fleet summary: it writes one ConfigMap of its namespace, and
	// may touch no other.
	if !slices.Contains(c.Args, "--summary-namespace="+d.Namespace) {
		t.Errorf("the caretaker keeps no fleet summary in its namespace %s: %v", d.Namespace, c.Args)
	}
	// One Role in its namespace: plugd's pods (checkCaretakerPods) and
	// that ConfigMap.
	wantRole := []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"list", "watch"}},
		{APIGroups: []string{""}, Resources: []string{"configmaps"}, ResourceNames: []string{"plugd-fleet"}, Verbs: []string{"get", "create", "patch"}}}
	if len(o.roles) != 1 || o.roles[0].Namespace != d.Namespace || !reflect.DeepEqual(o.roles[0].Rules, wantRole) {
		t.Errorf("the caretaker's Role: %+v", o.roles)
	} else if len(o.roleBindings) != 1 || o.roleBindings[0].RoleRef.Name != o.roles[0].Name || len(o.roleBindings[0].Subjects) != 1 ||
		o.roleBindings[0].Subjects[0].Name != pod.ServiceAccountName || o.roleBindings[0].Namespace != d.Namespace {
		t.Errorf("the caretaker's RoleBinding: %+v", o.roleBindings)
	}
	return pod
}

// checkCaretakerPods checks that the caretaker d watches the pods of the
// DaemonSet ds and no others (its --plugd-namespace and --plugd-selector),
// may list and watch pods in that namespace alone (a Role bound to its
// ServiceAccount, no more), and has the shipped graces, whose sum with a
// dead container's report stays under the minute of issue 32.
func checkCaretakerPods(t *testing.T, o objects, d appsv1.Deployment, ds appsv1.DaemonSet) {
	t.Helper()
	flags := map[string]string{}
	for _, a := range d.Spec.Template.Spec.Containers[0].Args {
		if k, v, ok := strings.Cut(a, "="); ok {
			flags[k] = v
		}
	}
	sel, err := labels.Parse(flags["--plugd-selector"])
	if err != nil || flags["--plugd-namespace"] != ds.Namespace || !sel.Matches(labels.Set(ds.Spec.Template.Labels)) ||
		sel.Matches(labels.Set(d.Spec.Template.Labels)) {
		t.Errorf("the caretaker watches pods %q in %q (%v); the DaemonSet's are %v in %q", flags["--plugd-selector"], flags["--plugd-namespace"], err,
			ds.Spec.Template.Labels, ds.Namespace)
	}
	if flags["--pod-grace"] != "40s" || flags["--csinode-grace"] != "10s" {
		t.Errorf("the caretaker's graces: --pod-grace=%s --csinode-grace=%s, want 40s and 10s", flags["--pod-grace"], flags["--csinode-grace"])
	}
	if len(o.roles) != 1 || len(o.roleBindings) != 1 {
		t.Fatalf("%d Roles and %d RoleBindings, want the caretaker's", len(o.roles), len(o.roleBindings))
	}
	r, b := o.roles[0], o.roleBindings[0]
	pods := []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"list", "watch"}}}
	if r.Namespace != ds.Namespace || !slices.ContainsFunc(r.Rules, func(pr rbacv1.PolicyRule) bool { return reflect.DeepEqual([]rbacv1.PolicyRule{pr}, pods) }) ||
		slices.ContainsFunc(r.Rules, func(pr rbacv1.PolicyRule) bool {
			return slices.Contains(pr.Resources, "pods") && !reflect.DeepEqual([]rbacv1.PolicyRule{pr}, pods)
		}) {
		t.Errorf("the caretaker's Role: %s %+v", r.Namespace, r.Rules)
	}
	if b.Namespace != ds.Namespace || b.RoleRef.Kind != "Role" || b.RoleRef.Name != r.Name || len(b.Subjects) != 1 ||
		b.Subjects[0].Name != d.Spec.Template.Spec.ServiceAccountName {
		t.Errorf("the caretaker's RoleBinding: %+v", b)
	}
}
