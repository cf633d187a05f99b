// The files in deploy/ are valid for this daemon: the manifests decode
// strictly into their API types, their flags and configuration are plugd's,
// and the systemd unit's configuration is a commented copy of the defaults.
package daemon_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/yaml"

	"github.com/plugd/plugd/cmd/plugd/internal/caretaker"
	"github.com/plugd/plugd/internal/nodecond"

	"github.com/plugd/plugd/cmd/plugd/internal/daemon"
)

// The deployment files, from this package's directory.
const (
	manifestPath  = "../../../../deploy/kubernetes/daemonset.yaml"
	namespacePath = "../../../../deploy/kubernetes/namespace.yaml"
	taintRBACPath = "../../../../deploy/kubernetes/remove-taint-rbac.yaml"
	unitPath      = "../../../../deploy/systemd/plugd.service"
	configPath    = "../../../../deploy/systemd/config.yaml"
)

// splitDocuments splits a multi-document YAML file on the lines that are
// exactly "---", dropping documents that hold only comments and blank lines
// (the manifest's header comment is one).
func splitDocuments(b []byte) [][]byte {
	var docs [][]byte
	var cur bytes.Buffer
	flush := func() {
		for line := range strings.Lines(cur.String()) {
			if t := strings.TrimSpace(line); t != "" && !strings.HasPrefix(t, "#") {
				docs = append(docs, bytes.Clone(cur.Bytes()))
				break
			}
		}
		cur.Reset()
	}
	for line := range strings.Lines(string(b)) {
		if strings.TrimRight(line, "\r\n") == "---" {
			flush()
			continue
		}
		cur.WriteString(line)
	}
	flush()
	return docs
}

// manifests is what daemonset.yaml holds, each object decoded strictly into
// its Kubernetes type.
type manifests struct {
	namespaces      []corev1.Namespace
	serviceAccounts []corev1.ServiceAccount
	configMaps      []corev1.ConfigMap
	clusterRoles    []rbacv1.ClusterRole
	bindings        []rbacv1.ClusterRoleBinding
	daemonSets      []appsv1.DaemonSet
	networkPolicies []networkingv1.NetworkPolicy
	// The admission policies that confine plugd's and the caretaker's
	// ServiceAccounts, their bindings, and their parameters (ConfigMaps);
	// test/deploy and test/kube check them.
	policies       []admissionv1.ValidatingAdmissionPolicy
	policyBindings []admissionv1.ValidatingAdmissionPolicyBinding
	policyParams   []corev1.ConfigMap
	// caretaker are the objects of plugd caretaker (named
	// plugd-caretaker), kept apart from the node agent's.
	caretaker struct {
		serviceAccounts []corev1.ServiceAccount
		clusterRoles    []rbacv1.ClusterRole
		bindings        []rbacv1.ClusterRoleBinding
		// roles and roleBindings are in plugd's namespace: its pods and its
		// fleet summary's ConfigMap.
		roles        []rbacv1.Role
		roleBindings []rbacv1.RoleBinding
		deployments  []appsv1.Deployment
	}
}

// loadManifests decodes every document of the manifest by its apiVersion and
// kind. A field the type does not have (a typo, a field at the wrong level), a
// duplicate key or a kind this test does not know fails the test: the API
// server would reject or silently drop them.
func loadManifests(t *testing.T, manifestPath string) manifests {
	t.Helper()
	b, err := os.ReadFile(manifestPath)
	if err != nil {
		t.Fatal(err)
	}
	var m manifests
	for i, doc := range splitDocuments(b) {
		var tm metav1.TypeMeta
		if err := yaml.Unmarshal(doc, &tm); err != nil {
			t.Fatalf("%s: document %d: %v", manifestPath, i+1, err)
		}
		var meta struct {
			Metadata metav1.ObjectMeta `json:"metadata"`
		}
		if err := yaml.Unmarshal(doc, &meta); err != nil {
			t.Fatalf("%s: document %d: %v", manifestPath, i+1, err)
		}
		var obj any
		ct := &m.caretaker
		switch kind := tm.APIVersion + " " + tm.Kind; {
		case meta.Metadata.Name == caretakerName && kind == "v1 ServiceAccount":
			ct.serviceAccounts = append(ct.serviceAccounts, corev1.ServiceAccount{})
			obj = &ct.serviceAccounts[len(ct.serviceAccounts)-1]
		case meta.Metadata.Name == caretakerName && kind == "rbac.authorization.k8s.io/v1 ClusterRole":
			ct.clusterRoles = append(ct.clusterRoles, rbacv1.ClusterRole{})
			obj = &ct.clusterRoles[len(ct.clusterRoles)-1]
		case meta.Metadata.Name == caretakerName && kind == "rbac.authorization.k8s.io/v1 ClusterRoleBinding":
			ct.bindings = append(ct.bindings, rbacv1.ClusterRoleBinding{})
			obj = &ct.bindings[len(ct.bindings)-1]
		case meta.Metadata.Name == caretakerName && kind == "rbac.authorization.k8s.io/v1 Role":
			ct.roles = append(ct.roles, rbacv1.Role{})
			obj = &ct.roles[len(ct.roles)-1]
		case meta.Metadata.Name == caretakerName && kind == "rbac.authorization.k8s.io/v1 RoleBinding":
			ct.roleBindings = append(ct.roleBindings, rbacv1.RoleBinding{})
			obj = &ct.roleBindings[len(ct.roleBindings)-1]
		case meta.Metadata.Name == caretakerName && kind == "apps/v1 Deployment":
			ct.deployments = append(ct.deployments, appsv1.Deployment{})
			obj = &ct.deployments[len(ct.deployments)-1]
		case kind == "v1 Namespace":
			m.namespaces = append(m.namespaces, corev1.Namespace{})
			obj = &m.namespaces[len(m.namespaces)-1]
		case kind == "v1 ServiceAccount":
			m.serviceAccounts = append(m.serviceAccounts, corev1.ServiceAccount{})
			obj = &m.serviceAccounts[len(m.serviceAccounts)-1]
		case kind == "v1 ConfigMap" && (strings.HasSuffix(meta.Metadata.Name, "-admission") || strings.HasSuffix(meta.Metadata.Name, "-remove-taint")):
			m.policyParams = append(m.policyParams, corev1.ConfigMap{})
			obj = &m.policyParams[len(m.policyParams)-1]
		case kind == "admissionregistration.k8s.io/v1 ValidatingAdmissionPolicy":
			m.policies = append(m.policies, admissionv1.ValidatingAdmissionPolicy{})
			obj = &m.policies[len(m.policies)-1]
		case kind == "admissionregistration.k8s.io/v1 ValidatingAdmissionPolicyBinding":
			m.policyBindings = append(m.policyBindings, admissionv1.ValidatingAdmissionPolicyBinding{})
			obj = &m.policyBindings[len(m.policyBindings)-1]
		case kind == "v1 ConfigMap":
			m.configMaps = append(m.configMaps, corev1.ConfigMap{})
			obj = &m.configMaps[len(m.configMaps)-1]
		case kind == "rbac.authorization.k8s.io/v1 ClusterRole":
			m.clusterRoles = append(m.clusterRoles, rbacv1.ClusterRole{})
			obj = &m.clusterRoles[len(m.clusterRoles)-1]
		case kind == "rbac.authorization.k8s.io/v1 ClusterRoleBinding":
			m.bindings = append(m.bindings, rbacv1.ClusterRoleBinding{})
			obj = &m.bindings[len(m.bindings)-1]
		case kind == "apps/v1 DaemonSet":
			m.daemonSets = append(m.daemonSets, appsv1.DaemonSet{})
			obj = &m.daemonSets[len(m.daemonSets)-1]
		case kind == "networking.k8s.io/v1 NetworkPolicy":
			m.networkPolicies = append(m.networkPolicies, networkingv1.NetworkPolicy{})
			obj = &m.networkPolicies[len(m.networkPolicies)-1]
		default:
			t.Fatalf("%s: document %d: unknown kind %q of apiVersion %q", manifestPath, i+1, tm.Kind, tm.APIVersion)
		}
		if err := yaml.UnmarshalStrict(doc, obj); err != nil {
			t.Fatalf("%s: document %d (%s): %v", manifestPath, i+1, tm.Kind, err)
		}
		// UnmarshalStrict converts scalars to the Go field's type (9090 to
		// "9090" for an annotation); kubectl does not, and the API server
		// rejects a number where a string belongs. Decode the JSON that
		// kubectl would send, too.
		j, err := yaml.YAMLToJSONStrict(doc)
		if err != nil {
			t.Fatalf("%s: document %d (%s): %v", manifestPath, i+1, tm.Kind, err)
		}
		dec := json.NewDecoder(bytes.NewReader(j))
		dec.DisallowUnknownFields()
		if err := dec.Decode(reflect.New(reflect.TypeOf(obj).Elem()).Interface()); err != nil {
			t.Fatalf("%s: document %d (%s), as kubectl sends it: %v", manifestPath, i+1, tm.Kind, err)
		}
	}
	return m
}

// loadDeployment is what kubectl apply makes of the DaemonSet's manifest
// and the namespace's, which is a file of its own (the Helm chart renders
// the namespace only with namespace.create).
func loadDeployment(t *testing.T) manifests {
	t.Helper()
	m := loadManifests(t, manifestPath)
	ns := loadManifests(t, namespacePath)
	if len(m.namespaces) != 0 || len(ns.namespaces) != 1 || len(ns.serviceAccounts)+len(ns.daemonSets)+len(ns.clusterRoles)+len(ns.configMaps) != 0 {
		t.Fatalf("%s must hold the Namespace, and only it; %s no Namespace", namespacePath, manifestPath)
	}
	if lvl := ns.namespaces[0].Labels["pod-security.kubernetes.io/enforce"]; lvl != "privileged" {
		t.Errorf("Namespace %s enforces Pod Security %q: plugd's hostPath volumes need privileged", ns.namespaces[0].Name, lvl)
	}
	m.namespaces = ns.namespaces
	return m
}

// rules flattens RBAC rules into "group resource verb" triples.
func rules(rs []rbacv1.PolicyRule) []string {
	var out []string
	for _, r := range rs {
		for _, g := range r.APIGroups {
			for _, res := range r.Resources {
				for _, v := range r.Verbs {
					out = append(out, g+" "+res+" "+v)
				}
			}
		}
		if len(r.ResourceNames) > 0 || len(r.NonResourceURLs) > 0 {
			out = append(out, fmt.Sprintf("unexpected %+v", r))
		}
	}
	slices.Sort(out)
	return out
}

// plugdRules is every permission plugd needs, and no more: listing and
// watching its node's Node, CSINode and ResourceSlices (its informers; it
// makes no Get), patching its Node's conditions, recording events, and
// reading the kubelet's /metrics.
var plugdRules = []string{
	" nodes list", " nodes watch", " nodes/metrics get", " nodes/status patch",
	"events.k8s.io events create", "events.k8s.io events patch",
	"resource.k8s.io devicetaintrules list", "resource.k8s.io devicetaintrules watch",
	"resource.k8s.io resourceslices list", "resource.k8s.io resourceslices watch",
	"storage.k8s.io csinodes list", "storage.k8s.io csinodes watch",
}

// checkBinding checks that b binds the ClusterRole role to sa.
func checkBinding(t *testing.T, b rbacv1.ClusterRoleBinding, role string, sa corev1.ServiceAccount) {
	t.Helper()
	if b.RoleRef.APIGroup != rbacv1.GroupName || b.RoleRef.Kind != "ClusterRole" || b.RoleRef.Name != role {
		t.Errorf("ClusterRoleBinding %s binds %+v, want ClusterRole %s", b.Name, b.RoleRef, role)
	}
	want := rbacv1.Subject{Kind: rbacv1.ServiceAccountKind, Name: sa.Name, Namespace: sa.Namespace}
	if len(b.Subjects) != 1 || b.Subjects[0] != want {
		t.Errorf("ClusterRoleBinding %s binds %+v, want only %+v", b.Name, b.Subjects, want)
	}
}

// caretakerName names every object of plugd caretaker.
const caretakerName = "plugd-caretaker"

// The caretaker's objects: a Deployment of one plugd caretaker whose args
// it accepts, its own ServiceAccount, a ClusterRole, bound to it, that
// grants reading Nodes and CSINodes and patching Nodes' status, and a Role
// to watch plugd's pods in its namespace, and nothing more.
func TestCaretakerManifest(t *testing.T) {
	m := loadManifests(t, manifestPath)
	ct := m.caretaker
	if len(ct.serviceAccounts) != 1 || len(ct.clusterRoles) != 1 || len(ct.bindings) != 1 || len(ct.deployments) != 1 {
		t.Fatalf("%s: want the caretaker's ServiceAccount, ClusterRole, binding and Deployment; have %d, %d, %d and %d", manifestPath,
			len(ct.serviceAccounts), len(ct.clusterRoles), len(ct.bindings), len(ct.deployments))
	}
	if got, want := rules(ct.clusterRoles[0].Rules), []string{" nodes get", " nodes list", " nodes watch", " nodes/status patch", "storage.k8s.io csinodes list", "storage.k8s.io csinodes watch"}; !slices.Equal(got, want) {
		t.Errorf("ClusterRole %s grants %q; the caretaker needs exactly %q", ct.clusterRoles[0].Name, got, want)
	}
	checkBinding(t, ct.bindings[0], ct.clusterRoles[0].Name, ct.serviceAccounts[0])
	d := ct.deployments[0]
	pod := d.Spec.Template.Spec
	if d.Spec.Replicas == nil || *d.Spec.Replicas != 1 || pod.ServiceAccountName != ct.serviceAccounts[0].Name || len(pod.Containers) != 1 {
		t.Fatalf("Deployment %s: %+v", d.Name, d.Spec)
	}
	args := pod.Containers[0].Args
	if len(args) == 0 || args[0] != "caretaker" {
		t.Fatalf("the caretaker's args %q do not start with the mode, caretaker", args)
	}
	cmd := caretaker.Command()
	if err := cmd.ParseFlags(args[1:]); err != nil || len(cmd.Flags().Args()) != 0 {
		t.Errorf("plugd caretaker would refuse the args %q: %v %q", args, err, cmd.Flags().Args())
	}
	// In its namespace (a Role, not a ClusterRole): plugd's pods, to list
	// and watch, and its fleet summary, one ConfigMap, which it may read,
	// create (by server-side apply, authorized by its name) and patch, and
	// no other.
	if !slices.Contains(args, "--summary-namespace="+d.Namespace) {
		t.Errorf("the caretaker keeps no fleet summary in its namespace %s: %q", d.Namespace, args)
	}
	want := []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"list", "watch"}},
		{APIGroups: []string{""}, Resources: []string{"configmaps"}, ResourceNames: []string{nodecond.SummaryName}, Verbs: []string{"get", "create", "patch"}}}
	if len(ct.roles) != 1 || ct.roles[0].Namespace != d.Namespace || !reflect.DeepEqual(ct.roles[0].Rules, want) {
		t.Fatalf("the caretaker's Role: %+v; want one in %s with %+v", ct.roles, d.Namespace, want)
	}
	sa := ct.serviceAccounts[0]
	if len(ct.roleBindings) != 1 || ct.roleBindings[0].Namespace != d.Namespace || ct.roleBindings[0].RoleRef.Kind != "Role" || ct.roleBindings[0].RoleRef.Name != ct.roles[0].Name ||
		!slices.Equal(ct.roleBindings[0].Subjects, []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: sa.Name, Namespace: sa.Namespace}}) {
		t.Errorf("the caretaker's RoleBinding: %+v", ct.roleBindings)
	}
}

func TestRBAC(t *testing.T) {
	m := loadManifests(t, manifestPath)
	if len(m.clusterRoles) != 1 || len(m.bindings) != 1 {
		t.Fatalf("%s: want one ClusterRole and one ClusterRoleBinding; have %d and %d", manifestPath, len(m.clusterRoles), len(m.bindings))
	}
	if got := rules(m.clusterRoles[0].Rules); !slices.Equal(got, plugdRules) {
		t.Errorf("ClusterRole %s grants %q;\nplugd needs exactly %q", m.clusterRoles[0].Name, got, plugdRules)
	}
	checkBinding(t, m.bindings[0], m.clusterRoles[0].Name, m.serviceAccounts[0])

	taint := loadManifests(t, taintRBACPath)
	if len(taint.clusterRoles) != 1 || len(taint.bindings) != 1 || len(taint.daemonSets)+len(taint.serviceAccounts) != 0 {
		t.Fatalf("%s: want one ClusterRole and its binding only", taintRBACPath)
	}
	if got := rules(taint.clusterRoles[0].Rules); !slices.Equal(got, []string{" nodes patch"}) {
		t.Errorf("%s grants %q; removing a taint needs only patch on nodes", taintRBACPath, got)
	}
	checkBinding(t, taint.bindings[0], taint.clusterRoles[0].Name, m.serviceAccounts[0])
}

// plugdArgs loads the configuration plugd would run with, given the
// container's args and env and the ConfigMap its --config names (mounted at
// mountPath), so that a misspelt or removed flag, or a bad configuration,
// fails here rather than in a crash-looping pod.
func plugdArgs(t *testing.T, c corev1.Container, cm *corev1.ConfigMap, mountPath string) daemon.Config {
	t.Helper()
	args := slices.Clone(c.Args)
	for i, a := range args {
		path, ok := strings.CutPrefix(a, "--config=")
		if !ok {
			continue
		}
		rel, err := filepath.Rel(mountPath, path)
		if cm == nil || err != nil || strings.HasPrefix(rel, "..") {
			t.Fatalf("container args: --config=%s is not in the ConfigMap mounted at %s", path, mountPath)
		}
		data, ok := cm.Data[rel]
		if !ok {
			t.Fatalf("--config=%s: the ConfigMap %s has no key %s", path, cm.Name, rel)
		}
		local := filepath.Join(t.TempDir(), "config.yaml")
		if err := os.WriteFile(local, []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
		args[i] = "--config=" + local
	}
	env := map[string]string{}
	for _, e := range c.Env {
		env[e.Name] = e.Value
		if e.ValueFrom != nil && e.ValueFrom.FieldRef != nil {
			// What the field holds stands in for its value; lowercase, so
			// that spec.nodeName passes as a Node's name.
			env[e.Name] = "fieldref." + strings.ToLower(e.ValueFrom.FieldRef.FieldPath)
		}
	}
	cfg, err := daemon.LoadArgs(args, func(k string) string { return env[k] })
	if err != nil {
		t.Fatalf("container args %q: plugd would refuse them: %v", c.Args, err)
	}
	return cfg
}

// within reports whether path is dir or inside it.
func within(path, dir string) bool {
	rel, err := filepath.Rel(dir, path)
	return err == nil && rel != ".." && !strings.HasPrefix(rel, "../")
}

func TestDaemonSet(t *testing.T) {
	m := loadDeployment(t)
	if len(m.namespaces) != 1 || len(m.serviceAccounts) != 1 || len(m.daemonSets) != 1 || len(m.configMaps) != 1 {
		t.Fatalf("%s: want one Namespace, ServiceAccount, ConfigMap and DaemonSet; have %d, %d, %d and %d",
			manifestPath, len(m.namespaces), len(m.serviceAccounts), len(m.configMaps), len(m.daemonSets))
	}
	ns, sa, ds := m.namespaces[0], m.serviceAccounts[0], m.daemonSets[0]

	if ds.Name != "plugd" || ds.Namespace != ns.Name || sa.Namespace != ns.Name {
		t.Errorf("DaemonSet %s/%s and ServiceAccount %s/%s must both be in Namespace %s",
			ds.Namespace, ds.Name, sa.Namespace, sa.Name, ns.Name)
	}
	pod := ds.Spec.Template.Spec
	if pod.ServiceAccountName != sa.Name {
		t.Errorf("the pod runs as ServiceAccount %q, the manifest defines %q", pod.ServiceAccountName, sa.Name)
	}
	sel, err := metav1.LabelSelectorAsSelector(ds.Spec.Selector)
	if err != nil {
		t.Fatalf("spec.selector: %v", err)
	}
	if sel.Empty() || !sel.Matches(labels.Set(ds.Spec.Template.Labels)) {
		t.Errorf("spec.selector %s does not select the pod template's labels %v", sel, ds.Spec.Template.Labels)
	}
	if ru := ds.Spec.UpdateStrategy.RollingUpdate; ru != nil && ru.MaxSurge != nil && ru.MaxSurge.String() != "0" && ru.MaxSurge.String() != "0%" {
		t.Errorf("rollingUpdate.maxSurge is %s: two plugd on one node would both manage the registry directory", ru.MaxSurge)
	}

	if len(pod.Containers) != 1 {
		t.Fatalf("want one container, have %d", len(pod.Containers))
	}
	c := pod.Containers[0]
	if len(c.Command) != 0 {
		t.Fatalf("the container sets command %q: the image's entrypoint is plugd, and the args are its flags", c.Command)
	}
	var cm *corev1.ConfigMap
	configMount := ""
	for _, v := range pod.Volumes {
		if v.ConfigMap == nil {
			continue
		}
		if v.ConfigMap.Name != m.configMaps[0].Name || m.configMaps[0].Namespace != ns.Name {
			t.Errorf("volume %s is ConfigMap %s, the manifest defines %s/%s", v.Name, v.ConfigMap.Name, m.configMaps[0].Namespace, m.configMaps[0].Name)
		}
		cm = &m.configMaps[0]
		for _, vm := range c.VolumeMounts {
			if vm.Name == v.Name {
				configMount = vm.MountPath
			}
		}
	}
	cfg := plugdArgs(t, c, cm, configMount)

	// The Kubernetes side: its own Node, by the downward API, with the
	// ServiceAccount's token.
	if cfg.Kubernetes == nil || cfg.Kubernetes.NodeName != "fieldref.spec.nodename" || cfg.Kubernetes.Kubeconfig != "" {
		t.Errorf("plugd's kubernetes settings are %+v; want in-cluster, with the node name from spec.nodeName", cfg.Kubernetes)
	}
	// The kubelet's own state: its secure port on the node's IP, and its
	// pod-resources socket, on a read-only mount of the host's.
	if k := cfg.Kubernetes; k == nil || k.Kubelet.Address != "fieldref.status.hostip:10250" {
		t.Errorf("plugd reads the kubelet at %+v; want the node's IP (status.hostIP), port 10250", k)
	}
	for _, a := range []*bool{sa.AutomountServiceAccountToken, pod.AutomountServiceAccountToken} {
		if a != nil && !*a {
			t.Errorf("automountServiceAccountToken is false: plugd needs its ServiceAccount's token to read its Node")
		}
	}

	// Volumes by name, and the mount that holds a path.
	hostPaths := map[string]string{}
	for _, v := range pod.Volumes {
		if v.HostPath != nil {
			hostPaths[v.Name] = v.HostPath.Path
		}
	}
	hostMount := func(what, path string, readOnly bool) {
		t.Helper()
		for _, vm := range c.VolumeMounts {
			if !within(path, vm.MountPath) {
				continue
			}
			hp, ok := hostPaths[vm.Name]
			switch {
			case !ok:
				t.Errorf("%s %s is on volume %q, which is not a hostPath", what, path, vm.Name)
			case vm.ReadOnly != readOnly:
				t.Errorf("%s %s is on a mount with readOnly %v, want %v", what, path, vm.ReadOnly, readOnly)
			case hp != vm.MountPath:
				t.Errorf("%s: hostPath %s is mounted at %s; mount it at the same path, so that the paths plugd reports are valid on the node", what, hp, vm.MountPath)
			}
			return
		}
		t.Errorf("%s %s is on no volume mount: it would be in the container's (read-only) filesystem, invisible to the node", what, path)
	}
	if !slices.ContainsFunc(c.Args, func(a string) bool { return strings.HasPrefix(a, "--registry-dir") }) {
		t.Errorf("container args set no --registry-dir; the default is not on a hostPath")
	}
	// On a Kubernetes node the kubelet registers plugins: plugd may only
	// observe its directory, and cannot write to it.
	if cfg.Mode != "observe" || cfg.RegistryDir != "/var/lib/kubelet/plugins_registry" {
		t.Errorf("plugd runs in mode %s on %s; on a kubelet's node it must observe /var/lib/kubelet/plugins_registry", cfg.Mode, cfg.RegistryDir)
	}
	hostMount("--registry-dir", cfg.RegistryDir, true)
	hostMount("--status-socket", cfg.Status.Socket, false)
	if cfg.Kubernetes != nil {
		hostMount("the kubelet's pod-resources socket", cfg.Kubernetes.Kubelet.PodResourcesSocket, true)
	}

	// The status API's TCP port: declared, probed, scraped.
	if cfg.Status.TCP == "" {
		t.Fatal("container args set no --status-tcp: the probes and Prometheus need the status API on TCP")
	}
	host, portStr, err := net.SplitHostPort(cfg.Status.TCP)
	if err != nil {
		t.Fatal(err)
	}
	if ip := net.ParseIP(host); ip != nil && ip.IsLoopback() {
		t.Errorf("--status-tcp=%s is loopback: the kubelet's probes come from outside the pod", cfg.Status.TCP)
	}
	port, err := strconv.Atoi(portStr)
	if err != nil {
		t.Fatalf("--status-tcp=%s: port: %v", cfg.Status.TCP, err)
	}
	var portName string
	declared := false
	for _, p := range c.Ports {
		if int(p.ContainerPort) == port && (p.Protocol == "" || p.Protocol == corev1.ProtocolTCP) {
			declared, portName = true, p.Name
		}
	}
	if !declared {
		t.Errorf("the status port %d (--status-tcp) is not among the container's ports", port)
	}
	resolve := func(p intstr.IntOrString) int {
		if p.Type == intstr.Int {
			return p.IntValue()
		}
		for _, cp := range c.Ports {
			if cp.Name == p.StrVal {
				return int(cp.ContainerPort)
			}
		}
		return -1
	}
	for _, pr := range []struct {
		name, path string
		probe      *corev1.Probe
	}{
		{"readinessProbe", "/readyz", c.ReadinessProbe},
		{"livenessProbe", "/healthz", c.LivenessProbe},
	} {
		switch {
		case pr.probe == nil:
			t.Errorf("%s is missing", pr.name)
		case pr.probe.HTTPGet == nil:
			t.Errorf("%s is not an httpGet", pr.name)
		case pr.probe.HTTPGet.Path != pr.path:
			t.Errorf("%s gets %s, want %s", pr.name, pr.probe.HTTPGet.Path, pr.path)
		case resolve(pr.probe.HTTPGet.Port) != port:
			t.Errorf("%s is on port %s, but plugd serves port %d (%s)", pr.name, pr.probe.HTTPGet.Port.String(), port, portName)
		}
	}
	ann := ds.Spec.Template.Annotations
	if ann["prometheus.io/scrape"] == "true" && ann["prometheus.io/port"] != portStr {
		t.Errorf("prometheus.io/port is %q, but plugd serves /metrics on port %s", ann["prometheus.io/port"], portStr)
	}

	// Root, to reach root-owned sockets, and nothing more.
	sc := c.SecurityContext
	if sc == nil {
		t.Fatal("the container has no securityContext")
	}
	if sc.RunAsUser == nil || *sc.RunAsUser != 0 {
		t.Errorf("securityContext.runAsUser must be 0: plugins' sockets are root-owned")
	}
	if sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
		t.Errorf("securityContext.readOnlyRootFilesystem must be true")
	}
	if sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
		t.Errorf("securityContext.allowPrivilegeEscalation must be false")
	}
	if sc.Privileged != nil && *sc.Privileged {
		t.Errorf("securityContext.privileged must not be set")
	}
	if sc.Capabilities == nil || !slices.Contains(sc.Capabilities.Drop, "ALL") {
		t.Errorf("securityContext.capabilities must drop ALL")
	}

	// On every node, tainted or not.
	if !slices.ContainsFunc(pod.Tolerations, func(tol corev1.Toleration) bool {
		return tol.Operator == corev1.TolerationOpExists && tol.Key == "" && tol.Effect == ""
	}) {
		t.Errorf("no toleration {operator: Exists} without key and effect: plugd would not run on tainted nodes")
	}

	// Room for plugd's own shutdown before the kubelet kills it.
	if g := pod.TerminationGracePeriodSeconds; g == nil || time.Duration(*g)*time.Second <= time.Duration(cfg.ShutdownTimeout) {
		t.Errorf("terminationGracePeriodSeconds must exceed plugd's shutdown timeout %s", cfg.ShutdownTimeout)
	}
}

// Issue 13, item 1: the status API's TCP port is guarded. A NetworkPolicy
// selects plugd's pods (which are not hostNetwork, where a policy would not
// apply) and admits to them only the status port, only from selected pods;
// egress, which plugd needs for the API server, is left alone. plugd's
// soft memory limit is below the container's.
func TestNetworkPolicy(t *testing.T) {
	m := loadDeployment(t)
	if len(m.daemonSets) != 1 || len(m.namespaces) != 1 {
		t.Fatalf("want one DaemonSet and one Namespace, have %d and %d", len(m.daemonSets), len(m.namespaces))
	}
	ds, ns := m.daemonSets[0], m.namespaces[0].Name
	pod := ds.Spec.Template
	if pod.Spec.HostNetwork {
		t.Errorf("the pod uses the host's network: no NetworkPolicy applies to it, and --status-tcp would be on the node's addresses")
	}
	c := pod.Spec.Containers[0]
	cfg := plugdArgs(t, c, &m.configMaps[0], "/etc/plugd")
	_, port, err := net.SplitHostPort(cfg.Status.TCP)
	if err != nil {
		t.Fatal(err)
	}
	guarded := false
	for _, np := range m.networkPolicies {
		sel, err := metav1.LabelSelectorAsSelector(&np.Spec.PodSelector)
		if err != nil {
			t.Fatalf("NetworkPolicy %s: %v", np.Name, err)
		}
		if np.Namespace != ns || !sel.Matches(labels.Set(pod.Labels)) {
			continue
		}
		guarded = true
		if !slices.Contains(np.Spec.PolicyTypes, networkingv1.PolicyTypeIngress) {
			t.Errorf("NetworkPolicy %s does not restrict ingress", np.Name)
		}
		if slices.Contains(np.Spec.PolicyTypes, networkingv1.PolicyTypeEgress) {
			t.Errorf("NetworkPolicy %s restricts egress: plugd needs the API server", np.Name)
		}
		for i, rule := range np.Spec.Ingress {
			if len(rule.From) == 0 {
				t.Errorf("NetworkPolicy %s ingress[%d] admits every source", np.Name, i)
			}
			for j, peer := range rule.From {
				if peer.IPBlock != nil || peer.PodSelector == nil && peer.NamespaceSelector == nil {
					t.Errorf("NetworkPolicy %s ingress[%d].from[%d] is not a selection of pods: %+v", np.Name, i, j, peer)
				}
				if peer.NamespaceSelector != nil && len(peer.NamespaceSelector.MatchLabels)+len(peer.NamespaceSelector.MatchExpressions) == 0 {
					t.Errorf("NetworkPolicy %s ingress[%d].from[%d] admits every namespace", np.Name, i, j)
				}
			}
			if len(rule.Ports) == 0 {
				t.Errorf("NetworkPolicy %s ingress[%d] admits every port", np.Name, i)
			}
			for _, p := range rule.Ports {
				if p.Port == nil || p.Port.String() != port || p.Protocol != nil && *p.Protocol != corev1.ProtocolTCP {
					t.Errorf("NetworkPolicy %s ingress[%d] admits port %v, not only the status port %s/TCP", np.Name, i, p.Port, port)
				}
			}
		}
	}
	if !guarded {
		t.Errorf("no NetworkPolicy in namespace %s selects plugd's pods: anyone in the cluster reaches the status API on port %s", ns, port)
	}

	limit := c.Resources.Limits.Memory()
	for _, e := range c.Env {
		if e.Name != "GOMEMLIMIT" {
			continue
		}
		soft, err := resource.ParseQuantity(strings.TrimSuffix(e.Value, "B"))
		if err != nil {
			t.Fatalf("GOMEMLIMIT %q: %v", e.Value, err)
		}
		if limit.IsZero() || soft.Cmp(*limit) >= 0 {
			t.Errorf("GOMEMLIMIT %s is not below the memory limit %s", e.Value, limit)
		}
	}
}

// loadConfig decodes the example configuration strictly, as plugd does.
func loadConfig(t *testing.T) daemon.Config {
	t.Helper()
	b, err := os.ReadFile(configPath)
	if err != nil {
		t.Fatal(err)
	}
	var cfg daemon.Config
	if err := yaml.UnmarshalStrict(b, &cfg); err != nil {
		t.Fatalf("%s: %v", configPath, err)
	}
	return cfg
}

func TestExampleConfig(t *testing.T) {
	cfg := loadConfig(t)
	full, err := cfg.WithDefaults()
	if err != nil {
		t.Fatalf("%s: plugd would refuse it: %v", configPath, err)
	}

	// Every field is written out: the example is the reference.
	b, err := os.ReadFile(configPath)
	if err != nil {
		t.Fatal(err)
	}
	var raw map[string]any
	if err := yaml.Unmarshal(b, &raw); err != nil {
		t.Fatal(err)
	}
	for _, field := range jsonFields(reflect.TypeFor[daemon.Config](), "") {
		if field == "kubernetes" {
			continue // present means on: shown commented out, checked below
		}
		if !hasPath(raw, field) {
			t.Errorf("%s does not show field %s", configPath, field)
		}
	}
	for _, field := range append([]string{"kubernetes"}, jsonFields(reflect.TypeFor[daemon.KubernetesConfig](), "")...) {
		// A nested field (kubelet.address) is shown under its section.
		if !regexp.MustCompile(`(?m)^#\s+` + field[strings.LastIndex(field, ".")+1:] + `:`).Match(b) {
			t.Errorf("%s does not show field kubernetes.%s in its commented kubernetes section", configPath, field)
		}
	}

	// And every value is the default, so that the file means the same as no
	// file. The paths are the defaults for root, which plugd.service runs as.
	def, err := daemon.Config{}.WithDefaults()
	if err != nil {
		t.Fatal(err)
	}
	if cfg.RegistryDir != "/run/plugd/plugins" || cfg.Status.Socket != "/run/plugd/plugd.sock" {
		t.Errorf("registryDir %s and status.socket %s are not root's defaults, /run/plugd/plugins and /run/plugd/plugd.sock", cfg.RegistryDir, cfg.Status.Socket)
	}
	def.RegistryDir, def.Status.Socket = full.RegistryDir, full.Status.Socket
	// The manager's defaults are not exported; plugd's flags document them.
	for field, flag := range map[string]string{
		"workers": "workers", "resyncInterval": "resync-interval",
		"backoff.initial": "backoff-initial", "backoff.max": "backoff-max",
		"timeouts.dial": "dial-timeout", "timeouts.getInfo": "get-info-timeout",
		"timeouts.notify": "notify-timeout", "timeouts.handler": "handler-timeout",
		"liveness.probeInterval": "probe-interval", "liveness.unhealthyGrace": "unhealthy-grace",
		"policy.maxSockets": "max-sockets",
	} {
		want := flagDefault(t, flag)
		if got := fmt.Sprint(getPath(raw, field)); !sameValue(got, want) {
			t.Errorf("%s: %s is %s, but its default (plugd --%s) is %s", configPath, field, got, flag, want)
		}
	}
	def.Workers, def.ResyncInterval, def.Backoff, def.Timeouts = full.Workers, full.ResyncInterval, full.Backoff, full.Timeouts
	def.Liveness, def.Policy.MaxSockets = full.Liveness, full.Policy.MaxSockets
	// An empty list in the file is the same as none.
	if len(full.Policy.EndpointRoots) == 0 && len(full.Policy.AllowedPeers) == 0 {
		def.Policy.EndpointRoots, def.Policy.AllowedPeers = full.Policy.EndpointRoots, full.Policy.AllowedPeers
	}
	if !reflect.DeepEqual(full, def) {
		t.Errorf("%s differs from the defaults:\n file:     %+v\n defaults: %+v", configPath, full, def)
	}
}

// jsonFields lists the dotted JSON names of every leaf field of a struct type.
func jsonFields(typ reflect.Type, prefix string) []string {
	var out []string
	for f := range typ.Fields() {
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name == "" || name == "-" {
			continue
		}
		if f.Type.Kind() == reflect.Struct {
			out = append(out, jsonFields(f.Type, prefix+name+".")...)
			continue
		}
		out = append(out, prefix+name)
	}
	return out
}

func getPath(m map[string]any, dotted string) any {
	var v any = m
	for k := range strings.SplitSeq(dotted, ".") {
		mm, ok := v.(map[string]any)
		if !ok {
			return nil
		}
		if v, ok = mm[k]; !ok {
			return nil
		}
	}
	return v
}

func hasPath(m map[string]any, dotted string) bool {
	parent, leaf := "", dotted
	if i := strings.LastIndex(dotted, "."); i >= 0 {
		parent, leaf = dotted[:i], dotted[i+1:]
	}
	pm := m
	if parent != "" {
		var ok bool
		if pm, ok = getPath(m, parent).(map[string]any); !ok {
			return false
		}
	}
	_, ok := pm[leaf]
	return ok
}

// flagDefault is the "(default X)" of a plugd flag's help.
func flagDefault(t *testing.T, name string) string {
	t.Helper()
	f := daemon.Command().Flags().Lookup(name)
	if f == nil {
		t.Fatalf("plugd has no flag --%s", name)
	}
	m := regexp.MustCompile(`\(default ([^)\s]+)\)`).FindStringSubmatch(f.Usage)
	if m == nil {
		t.Fatalf("plugd --%s does not document its default: %q", name, f.Usage)
	}
	return m[1]
}

// sameValue compares two numbers or two durations written differently
// ("2m" and "2m0s").
func sameValue(a, b string) bool {
	if a == b {
		return true
	}
	da, errA := time.ParseDuration(a)
	db, errB := time.ParseDuration(b)
	return errA == nil && errB == nil && da == db
}

// unit is a systemd unit file: its settings by section and key, in order,
// and its comments.
type unit struct {
	settings map[string]map[string][]string
	comments []string
}

func loadUnit(t *testing.T) unit {
	t.Helper()
	b, err := os.ReadFile(unitPath)
	if err != nil {
		t.Fatal(err)
	}
	u := unit{settings: map[string]map[string][]string{}}
	section := ""
	for n, line := range strings.Split(string(b), "\n") {
		line = strings.TrimSpace(line)
		switch {
		case line == "":
		case strings.HasPrefix(line, "#"), strings.HasPrefix(line, ";"):
			u.comments = append(u.comments, line)
		case strings.HasPrefix(line, "[") && strings.HasSuffix(line, "]"):
			section = line[1 : len(line)-1]
			u.settings[section] = map[string][]string{}
		default:
			k, v, ok := strings.Cut(line, "=")
			if !ok || section == "" || strings.HasSuffix(line, `\`) {
				t.Fatalf("%s:%d: not a setting this test understands: %q", unitPath, n+1, line)
			}
			k = strings.TrimSpace(k)
			u.settings[section][k] = append(u.settings[section][k], strings.TrimSpace(v))
		}
	}
	return u
}

// get is the value of a setting that must appear once.
func (u unit) get(t *testing.T, section, key string) string {
	t.Helper()
	vs := u.settings[section][key]
	if len(vs) != 1 {
		t.Fatalf("%s: [%s] %s= appears %d times, want once", unitPath, section, key, len(vs))
	}
	return vs[0]
}

func TestSystemdUnit(t *testing.T) {
	u := loadUnit(t)
	cfg := loadConfig(t)

	// ExecStart runs plugd with the configuration file the comments (and the
	// README) tell you to install.
	exec := strings.Fields(u.get(t, "Service", "ExecStart"))
	if len(exec) == 0 || !filepath.IsAbs(exec[0]) || filepath.Base(exec[0]) != "plugd" {
		t.Fatalf("ExecStart=%s does not run plugd by its absolute path", strings.Join(exec, " "))
	}
	var conf string
	for i, a := range exec {
		if v, ok := strings.CutPrefix(a, "--config="); ok {
			conf = v
		} else if a == "--config" && i+1 < len(exec) {
			conf = exec[i+1]
		}
	}
	if conf == "" {
		t.Fatalf("ExecStart=%s has no --config", strings.Join(exec, " "))
	}
	if !slices.ContainsFunc(u.comments, func(c string) bool { return strings.Contains(c, conf) }) {
		t.Errorf("ExecStart reads %s, which the unit's comments never mention", conf)
	}
	if b, err := os.ReadFile(configPath); err != nil || !strings.Contains(string(b), conf) {
		t.Errorf("%s does not say it is installed as %s", configPath, conf)
	}

	reload := strings.Fields(u.get(t, "Service", "ExecReload"))
	if len(reload) == 0 || filepath.Base(reload[0]) != "kill" ||
		!slices.Contains(reload, "$MAINPID") ||
		!(slices.Contains(reload, "-HUP") || slices.Contains(reload, "-SIGHUP") || slices.Index(reload, "-s") >= 0 && slices.Contains(reload, "HUP")) {
		t.Errorf("ExecReload=%s does not send SIGHUP to $MAINPID", strings.Join(reload, " "))
	}
	if r := u.get(t, "Service", "Restart"); r != "on-failure" {
		t.Errorf("Restart=%s, want on-failure", r)
	}

	// systemd kills plugd only after plugd's own shutdown deadline.
	full, err := cfg.WithDefaults()
	if err != nil {
		t.Fatal(err)
	}
	if stop := systemdSeconds(t, u.get(t, "Service", "TimeoutStopSec")); stop <= time.Duration(full.ShutdownTimeout) {
		t.Errorf("TimeoutStopSec=%s does not exceed shutdownTimeout %s", stop, full.ShutdownTimeout)
	}

	// Under ProtectSystem=strict, plugd can write only its RuntimeDirectory
	// and ReadWritePaths: the example's registry directory and status socket
	// must be among them.
	// The status socket's directory is the RuntimeDirectory, which systemd
	// creates with RuntimeDirectoryMode before plugd starts.
	runtimeDir := filepath.Join("/run", u.get(t, "Service", "RuntimeDirectory"))
	if d := filepath.Dir(cfg.Status.Socket); d != runtimeDir {
		t.Errorf("status.socket %s is not in the RuntimeDirectory %s", cfg.Status.Socket, runtimeDir)
	}
	if u.get(t, "Service", "ProtectSystem") == "strict" {
		writable := []string{runtimeDir}
		for _, v := range u.settings["Service"]["ReadWritePaths"] {
			for p := range strings.FieldsSeq(v) {
				writable = append(writable, strings.TrimLeft(p, "-+"))
			}
		}
		for what, p := range map[string]string{"registryDir": cfg.RegistryDir, "status.socket": filepath.Dir(cfg.Status.Socket)} {
			if !slices.ContainsFunc(writable, func(dir string) bool { return within(p, dir) }) {
				t.Errorf("%s %s is not writable under ProtectSystem=strict (writable: %v)", what, p, writable)
			}
		}
	}

	// Nothing may stop root from connecting to other users' sockets.
	if usr := u.settings["Service"]["User"]; len(usr) > 0 && usr[0] != "root" && usr[0] != "0" {
		t.Errorf("User=%s: plugd must run as root to reach plugins' sockets", usr[0])
	}
	if pu := u.settings["Service"]["PrivateUsers"]; len(pu) > 0 && pu[0] != "no" && pu[0] != "false" {
		t.Errorf("PrivateUsers=%s makes root nobody on the host's files", pu[0])
	}
	if caps, ok := u.settings["Service"]["CapabilityBoundingSet"]; ok && !strings.Contains(strings.Join(caps, " "), "CAP_DAC_OVERRIDE") {
		t.Errorf("CapabilityBoundingSet=%s lacks CAP_DAC_OVERRIDE, needed for sockets of other users", caps)
	}
	if af, ok := u.settings["Service"]["RestrictAddressFamilies"]; ok && !slices.Contains(strings.Fields(strings.Join(af, " ")), "AF_UNIX") {
		t.Errorf("RestrictAddressFamilies=%s lacks AF_UNIX", af)
	}
}

// systemdSeconds parses a systemd time span as this unit writes it: a bare
// number of seconds, or a Go-style duration such as 15s or 1m30s.
func systemdSeconds(t *testing.T, s string) time.Duration {
	t.Helper()
	if n, err := strconv.Atoi(s); err == nil {
		return time.Duration(n) * time.Second
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		t.Fatalf("time span %q: write it as seconds (15s) so that this test can read it", s)
	}
	return d
}
