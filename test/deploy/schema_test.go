package deploy

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// badValue is a value of the chart's that is refused, and by whom.
type badValue struct {
	// rule is the rule of plugd's configuration it breaks, as
	// testdata/config-rules.txt names it; "" for a rule of the chart's own.
	rule   string
	values string
	// schema is what values.schema.json's error names; "": the schema
	// lets it through (notInSchema says why) and plugd refuses it.
	schema string
	// plugd is what plugd --check-config's error says, given the
	// rendering without the schema; "": plugd never sees the value.
	plugd string
}

// badValues: the schema refuses what plugd refuses where JSON Schema can
// say it, and plugd --check-config on the rendered ConfigMap and flags
// refuses the rest.
var badValues = []badValue{
	// The chart's own.
	{"", "imag: {tag: v1}", "'imag'", ""},
	{"", "image: {tga: v1}", "'tga'", ""},
	{"", "status: {port: 70000}", "/status/port", ""},
	{"", "updateStrategy: {rollingUpdate: {maxSurge: 1}}", "/updateStrategy/rollingUpdate/maxSurge", ""},
	{"", "networkPolicy: {from: []}", "/networkPolicy/from", ""},
	{"", "image: {digest: latest}", "/image/digest", ""},
	{"", "extraArgs: [workers=3]", "/extraArgs/0", ""},
	{"", "serviceAccount: {create: false}", "serviceAccount.name", ""},
	{"", "serviceAccount: {create: false, name: node-agents}", "caretaker.serviceAccountName", ""},
	{"", "caretaker: {replicas: 2}", "'replicas'", ""},
	// plugd caretaker refuses --pod-grace 0 (it would crash-loop); a
	// csiNodeGrace of 0 would turn the sign off but keep its permission.
	{"", "caretaker: {podGrace: 0s}", "/caretaker/podGrace", ""},
	{"", "caretaker: {csiNodeGrace: 0s}", "/caretaker/csiNodeGrace", ""},
	{"", "resources: {limits: {cpu: one}}", "/resources/limits/cpu", ""},
	// The registration SLO: a threshold that is no bucket of plugd's
	// histograms selects no series; an objective of 1 leaves no budget.
	{"", "prometheusRule: {slo: {registrationSeconds: 45}}", "/prometheusRule/slo/registrationSeconds", ""},
	{"", "prometheusRule: {slo: {objective: 1}}", "/prometheusRule/slo/objective", ""},
	{"", "prometheusRule: {slo: {objective: 99}}", "/prometheusRule/slo/objective", ""},
	{"", "prometheusRule: {slo: {objective: 0.5}}", "/prometheusRule/slo/objective", ""},
	{"", "caretaker: {resources: {requests: {memory: [1]}}}", "/caretaker/resources/requests/memory", ""},

	// plugd's, which the schema says too. The first five are issue 37's.
	{"kubernetes.heartbeatInterval range", "kubernetes: {heartbeatInterval: 10m}", "/kubernetes/heartbeatInterval", "kubernetes.heartbeatInterval is 10m0s"},
	{"kubernetes.disagreementGrace range", "kubernetes: {disagreementGrace: 0.5s}", "/kubernetes/disagreementGrace", "kubernetes.disagreementGrace is 500ms"},
	{"expect[] no-spaces", "expect: [{type: CSIPlugin, name: 'csi example'}]", "/expect/0/name", "may not contain spaces"},
	{"expect[].condition not-kubelets", "expect: [{type: CSIPlugin, name: csi.example.com, condition: Ready}]", "/expect/0/condition", "is the kubelet's"},
	{"expect[].minHealthyDevices only-deviceplugin", "expect: [{type: CSIPlugin, name: csi.example.com, minHealthyDevices: 1}]", "/expect/0/type", "minHealthyDevices applies to DevicePlugin"},
	{"expect[].deviceClasses only-draplugin", "expect: [{type: DevicePlugin, name: vendor.example/gpu, deviceClasses: [gpu.example.com]}]", "/expect/0/type", "deviceClasses applies to DRAPlugin"},
	{"expect[].deviceClasses[] dns-subdomain", "expect: [{type: DRAPlugin, name: gpu.example.com, deviceClasses: [GPU_Class]}]", "/expect/0/deviceClasses/0", "is not a DeviceClass name"},
	{"expect[].deviceClasses[] unique", "expect: [{type: DRAPlugin, name: gpu.example.com, deviceClasses: [gpu.example.com, gpu.example.com]}]", "/expect/0/deviceClasses", "is listed twice"},
	{"(any) known-field", "expect: [{type: CSIPlugin, name: x, nmae: x}]", "'nmae'", "nmae"},
	{"(any duration) syntax", "kubernetes: {disagreementGrace: 60}", "/kubernetes/disagreementGrace", "a duration is written like"},
	{"expect[] type-and-name", "expect: [{type: CSIPlugin}]", "/expect/0", ""},
	{"expect[].anyOf not-type", "expect: [{type: DevicePlugin, name: example.com/gpu, anyOf: [{type: DRAPlugin, name: gpu.example.com}]}]", "/expect/0", "and anyOf are both set"},
	{"expect[].anyOf not-empty", "expect: [{type: anyOf, name: gpu.example.com}]", "/expect/0/type", "lists no alternatives"},
	{"expect[].anyOf max-8", "expect: [{name: r.example.com, anyOf: [" + strings.Repeat("{type: DRAPlugin, name: a.example.com}, ", 8) + "{type: DRAPlugin, name: b.example.com}]}]", "/expect/0/anyOf", "at most 8"},
	{"expect[].name anyOf-needs-name", "expect: [{anyOf: [{type: DRAPlugin, name: gpu.example.com}]}]", "/expect/0", "an entry with anyOf needs a name"},
	{"expect[].anyOf[].anyOf not-nested", "expect: [{name: r.example.com, anyOf: [{name: s.example.com, anyOf: [{type: DRAPlugin, name: gpu.example.com}]}]}]", "/expect/0/anyOf/0", "has an anyOf of its own"},
	{"expect[].anyOf[] no-condition-or-taint", "expect: [{name: r.example.com, anyOf: [{type: DRAPlugin, name: gpu.example.com, condition: example.com/X}]}]", "'condition'", "are the entry's, not one alternative's"},
	{"expect[].anyOf[] valid", "expect: [{name: r.example.com, anyOf: [{type: DRAPlugin}]}]", "/expect/0/anyOf/0", "anyOf[0]: type and name are both needed"},
	{"expect[].anyOf[] unique", "expect: [{name: r.example.com, anyOf: [{type: DRAPlugin, name: gpu.example.com}, {type: DRAPlugin, name: gpu.example.com, minHealthyDevices: 0}]}]", "", "is also anyOf[0]"},
	{"expect[].anyOf[] unique-plugin", "expect: [{type: DRAPlugin, name: gpu.example.com}, {name: r.example.com, anyOf: [{type: DRAPlugin, name: gpu.example.com}]}]", "", "is also expect[0]'s"},
	{"expect[] type-and-name", "expect: [{type: CSIPlugin, name: ''}]", "/expect/0/name", "type and name are both needed"},
	{"expect[].minDevices only-draplugin", "expect: [{type: DevicePlugin, name: example.com/gpu, minDevices: 1}]", "/expect/0/type", "minDevices applies to DRAPlugin"},
	{"expect[].minDevices positive", "expect: [{type: DRAPlugin, name: gpu.example.com, minDevices: -1}]", "/expect/0/minDevices", "must be positive"},
	{"expect[].minHealthyDevices positive", "expect: [{type: DevicePlugin, name: example.com/gpu, minHealthyDevices: -1}]", "/expect/0/minHealthyDevices", "must be positive"},
	{"expect[].condition qualified-name", "expect: [{type: CSIPlugin, name: csi.example.com, condition: a/b/c}]", "/expect/0/condition", "is not a valid Node condition type"},
	{"expect[].condition not-node-problem-detectors", "expect: [{type: CSIPlugin, name: csi.example.com, condition: KernelDeadlock}]", "/expect/0/condition", "node-problem-detector's"},
	{"handlers[].type required", "handlers: [{type: '', handler: csi}]", "/handlers/0/type", "handlers[0].type is empty"},
	{"handlers[].handler enum", "handlers: [{type: CSIPlugin, handler: kubelet}]", "/handlers/0/handler", `handlers[0].handler is "kubelet"`},
	{"handlers[].hook required", "handlers: [{type: example.com/X, handler: hook}]", "/handlers/0", "handler hook needs hook"},
	{"handlers[].hook only-hook", "handlers: [{type: CSIPlugin, handler: csi, hook: {url: 'http://127.0.0.1/'}}]", "/handlers/0", "hook is set, but the handler is csi"},
	{"handlers[].hook valid", "handlers: [{type: example.com/X, handler: hook, hook: {}}]", "/handlers/0/hook", "set exactly one of command or url"},
	{"handlers[].gracePeriod only-dra-deviceplugin", "handlers: [{type: CSIPlugin, handler: csi, gracePeriod: 1m}]", "/handlers/0/gracePeriod", "gracePeriod applies to the dra and deviceplugin handlers"},
	{"handlers[].gracePeriod range", "handlers: [{type: DRAPlugin, handler: dra, gracePeriod: 25h}]", "/handlers/0/gracePeriod", "gracePeriod is 25h0m0s"},
	{"handlers[].unhealthyGrace range", "handlers: [{type: CSIPlugin, handler: csi, unhealthyGrace: 5ms}]", "/handlers/0/unhealthyGrace", "unhealthyGrace is 5ms"},
	{"handlers[].probeInterval range", "handlers: [{type: CSIPlugin, handler: csi, probeInterval: 50ms}]", "/handlers/0/probeInterval", "probeInterval is 50ms"},
	{"handlers[].hook.timeout range", "handlers: [{type: example.com/X, handler: hook, hook: {command: [/bin/true], timeout: 11m}}]", "/handlers/0/hook/timeout", "hook.timeout is 11m0s"},
	{"log.format enum", "log: {format: xml}", "/log/format", `log.format is "xml"`},
	{"log.level enum", "log: {level: loud}", "/log/level", `log.level is "loud"`},
	{"liveness.probeInterval range", "liveness: {probeInterval: 50ms}", "/liveness/probeInterval", "liveness.probeInterval is 50ms"},
	{"registryDir not-system", "kubelet: {rootDir: /proc}", "/kubelet/rootDir", "registryDir /proc/plugins_registry is in /proc"},
	{"kubernetes.kubelet.caFile absolute", "kubelet: {servingCertFile: kubelet.crt}", "/kubelet/servingCertFile", `caFile "kubelet.crt" is not an absolute path`},
	{"kubernetes.kubelet.podResourcesSocket absolute", "kubelet: {rootDir: var/lib/kubelet}", "/kubelet/rootDir", "is not an absolute path"},
	{"kubernetes.kubelet one-tls", "kubelet: {servingCertFile: /var/lib/kubelet/pki/kubelet.crt, insecureSkipTLSVerify: true}", "/kubelet/insecureSkipTLSVerify", "caFile and insecureSkipTLSVerify are both set"},
	{"kubernetes.removeTaintWhenReady key-effect", "kubernetes: {removeTaintWhenReady: example.com/taint}", "/kubernetes/removeTaintWhenReady", "write it as KEY:EFFECT"},
	{"kubernetes.removeTaintWhenReady key", "kubernetes: {removeTaintWhenReady: 'a b:NoSchedule'}", "/kubernetes/removeTaintWhenReady", "is not a valid taint key"},
	{"kubernetes.removeTaintWhenReady effect", "kubernetes: {removeTaintWhenReady: 'example.com/t:Sometimes'}", "/kubernetes/removeTaintWhenReady", "must be NoSchedule, PreferNoSchedule or NoExecute"},
	{"kubernetes.removeTaintWhenReady not-kubernetes", "expect: [{type: CSIPlugin, name: csi.example.com}]\nkubernetes: {removeTaintWhenReady: 'node.kubernetes.io/unschedulable:NoSchedule'}", "/kubernetes/removeTaintWhenReady", "Kubernetes reserves"},
	{"kubernetes.startupWindow range", "kubernetes: {startupWindow: 25h}", "/kubernetes/startupWindow", "kubernetes.startupWindow is 25h0m0s"},
	{"expect[].taint key-effect", "expect: [{type: CSIPlugin, name: csi.example.com, taint: example.com/t}]", "/expect/0/taint", "write it as KEY:EFFECT"},
	{"expect[].taint not-kubernetes", "expect: [{type: CSIPlugin, name: csi.example.com, taint: 'node.kubernetes.io/not-ready:NoExecute'}]", "/expect/0/taint", "Kubernetes reserves"},
	{"expect[].taint not-kubernetes", "expect: [{type: CSIPlugin, name: csi.example.com, taint: 'cluster-autoscaler.kubernetes.io/x:NoSchedule'}]", "/expect/0/taint", "Kubernetes reserves"},
	{"expect[].retaint needs-taint", "expect: [{type: CSIPlugin, name: csi.example.com, retaint: true}]", "/expect/0", "retaint is set, but taint is not"},
	{"kubernetes.removeTaintWhenReady needs-expect", "kubernetes: {removeTaintWhenReady: 'example.com/t:NoSchedule'}", "/expect", "expect lists no plugins"},

	// plugd's, which only plugd says (notInSchema says why).
	{"handlers[].type unique", "handlers: [{type: CSIPlugin, handler: csi}, {type: CSIPlugin, handler: accept}]", "", `"CSIPlugin" has a handler already`},
	{"expect[] unique-plugin", "expect: [{type: CSIPlugin, name: csi.example.com}, {type: CSIPlugin, name: csi.example.com, condition: example.com/X}]", "", "is also expect[0]'s"},
	{"expect[].taint one-effect", "expect: [{type: CSIPlugin, name: a.example.com, taint: 'example.com/t:NoSchedule'}, {type: CSIPlugin, name: b.example.com, taint: 'example.com/t:NoExecute'}]", "", "one key, one effect"},
	{"expect[].retaint agree", "expect: [{type: CSIPlugin, name: a.example.com, taint: 'example.com/t:NoSchedule', retaint: true}, {type: CSIPlugin, name: b.example.com, taint: 'example.com/t:NoSchedule'}]", "", "disagree about retaint"},
	{"expect[].taint not-removeTaintWhenReady", "expect: [{type: CSIPlugin, name: a.example.com, taint: 'example.com/t:NoSchedule'}]\nkubernetes: {removeTaintWhenReady: 'example.com/t:NoSchedule'}", "", "name it once"},
	{"expect[].condition unique", "expect: [{type: CSIPlugin, name: a.example.com}, {type: DRAPlugin, name: b.example.com, condition: a.example.com/CSIPluginReady}]", "", "is also expect[0]'s"},
	{"expect[].condition default-valid", "expect: [{type: CSIPlugin, name: -csi.example.com}]", "", "the default condition type"},
	{"workers range", "extraConfig: {workers: 100000}", "", "workers is 100000"},
	{"workers range", "extraArgs: [--workers=100000]", "", "workers is 100000"},
	{"kubernetes.kubelet.resync range", "extraConfig: {kubernetes: {kubelet: {resync: 1s}}}", "", "kubernetes.kubelet.resync is 1s"},
	{"backoff.max not-below-initial", "extraConfig: {backoff: {initial: 1m, max: 30s}}", "", "backoff.max (30s) is less than backoff.initial"},
	{"", "extraArgs: [--no-such-flag]", "", "no-such-flag"},
}

// Why a rule of plugd's has no counterpart in values.schema.json.
const (
	setByChart = "the chart sets it itself (a flag or an environment variable of the DaemonSet: --mode, --status-tcp from status.port, " +
		"NODE_NAME and NODE_IP from the pod), never from a value the schema lets through"
	onlyExtra = "no value of the chart sets it: only extraConfig (plugd's own configuration, laid over the chart's) or extraArgs, " +
		"which the schema takes as they are; plugd --check-config refuses it (TestExtraConfigRefusedByPlugd)"
	crossEntry = "two entries of a list may not share it: JSON Schema's uniqueItems compares whole entries, not one field; " +
		"plugd --check-config refuses it (its case in badValues)"
)

// notInSchema are the rules of plugd's that the schema does not say, and why.
var notInSchema = map[string]string{
	"mode enum":                               setByChart,
	"status.socket outside-registryDir":       setByChart,
	"status.tcp host-port":                    setByChart,
	"status.tcp loopback":                     setByChart,
	"kubernetes.nodeName required":            setByChart,
	"kubernetes.nodeName dns-subdomain":       setByChart,
	"kubernetes.kubelet.address host-port":    setByChart,
	"handlers[].type unique":                  crossEntry,
	"expect[] unique-plugin":                  crossEntry,
	"expect[].anyOf[] unique":                 crossEntry,
	"expect[].anyOf[] unique-plugin":          crossEntry,
	"expect[].condition unique":               crossEntry,
	"expect[].taint one-effect":               crossEntry,
	"expect[].retaint agree":                  crossEntry,
	"expect[].taint not-removeTaintWhenReady": crossEntry,
	"expect[].taint needs-kubernetes":         setByChart,
	"expect[].deviceClasses needs-kubernetes": setByChart,
	"expect[].condition default-valid":        "the default condition is NAME/TYPEReady: whether it is a qualified name depends on both fields and the lengths of its parts; plugd --check-config refuses it (its case in badValues)",
	"policy.allowedPeers[].type required":     onlyExtra,
	"policy.allowedPeers[].type unique":       onlyExtra,
	"policy.allowedPeers[] not-empty":         onlyExtra,
	"policy.endpointRoots[] absolute":         onlyExtra,
	"kubernetes.kubelet.registryDir absolute": onlyExtra,
	"doctor.procDir proc":                     onlyExtra,
	"doctor.kubeletRoots[] absolute":          onlyExtra,
	"backoff.max not-below-initial":           onlyExtra,
	"workers range":                           onlyExtra,
	"policy.maxSockets range":                 onlyExtra,
	"resyncInterval range":                    onlyExtra,
	"backoff.initial range":                   onlyExtra,
	"backoff.max range":                       onlyExtra,
	"timeouts.dial range":                     onlyExtra,
	"timeouts.getInfo range":                  onlyExtra,
	"timeouts.notify range":                   onlyExtra,
	"timeouts.handler range":                  onlyExtra,
	"shutdownTimeout range":                   onlyExtra,
	"liveness.unhealthyGrace range":           onlyExtra,
	"policy.removeStaleAfter range":           onlyExtra,
	"kubernetes.kubelet.resync range":         onlyExtra,
}

// goodValues are values plugd takes, which the schema takes too.
var goodValues = []string{
	"expect: [{type: CSIPlugin, name: ebs.csi.aws.com, taint: 'ebs.csi.aws.com/agent-not-ready:NoExecute'}, {type: CSIPlugin, name: efs.csi.aws.com, taint: 'efs.csi.aws.com/agent-not-ready:NoExecute', retaint: true}, {type: DevicePlugin, name: example.com/gpu, retaint: false}]\nkubernetes: {removeTaintWhenReady: 'example.com/plugins-not-ready:NoSchedule', startupWindow: 5m}",
	"prometheusRule: {enabled: true, slo: {registrationSeconds: 0.5, objective: 0.999}}",
	"resources: {limits: {cpu: 1}}",
	"resources: {requests: {cpu: 0.5, memory: 64Mi}, limits: {cpu: '2', memory: 1e9}}\ncaretaker: {resources: {limits: {cpu: 1}}}",
	"liveness: {probeInterval: -1s}",
	"liveness: {probeInterval: 100ms}",
	"handlers: [{type: CSIPlugin, handler: csi, unhealthyGrace: -1s, probeInterval: -1s, gracePeriod: 0s}]",
	"handlers: [{type: DRAPlugin, handler: dra, gracePeriod: 24h, unhealthyGrace: 10ms, probeInterval: 24h}]",
	"handlers: [{type: example.com/X, handler: hook, hook: {command: [/bin/true], timeout: 10m, events: [validate], env: [A=b]}}]",
	"handlers: [{type: example.com/X, handler: hook, hook: {url: 'https://hooks.example.com/plugd'}}]",
	"kubernetes: {heartbeatInterval: 1m, disagreementGrace: 1s}",
	"kubernetes: {heartbeatInterval: 90s, disagreementGrace: 24h}",
	"kubernetes: {heartbeatInterval: 5m0s, disagreementGrace: 1m30s}",
	"kubernetes: {heartbeatInterval: 4.5m, disagreementGrace: 0s}",
	"expect: [{type: DevicePlugin, name: vendor.example/gpu, minHealthyDevices: 2}, {type: CSIPlugin, name: csi.example.com, condition: example.com/StorageReady}]",
	"expect: [{type: DRAPlugin, name: gpu.example.com, deviceClasses: [gpu.example.com, fast.gpu.example.com]}, {type: CSIPlugin, name: csi.example.com, deviceClasses: []}]",
	"expect: [{type: CSIPlugin, name: csi.example.com}]\nkubernetes: {removeTaintWhenReady: 'dedicated:NoSchedule'}",
	"expect: [{name: gpu.example.com, taint: 'example.com/gpu-not-ready:NoSchedule', retaint: true, anyOf: [{type: DevicePlugin, name: example.com/gpu, minHealthyDevices: 2}, {type: DRAPlugin, name: gpu.example.com}]}]\nkubernetes: {removeTaintWhenReady: 'example.com/plugins-not-ready:NoSchedule'}",
	"expect: [{name: example.com/gpu, condition: example.com/GPUReady, anyOf: [{type: DevicePlugin, name: example.com/gpu}]}]",
	"expect: [{type: CSIPlugin, name: a.example.com, taint: 'startup-taint.cluster-autoscaler.kubernetes.io/a-not-ready:NoSchedule'}, {type: CSIPlugin, name: secrets-store.csi.k8s.io, taint: 'secrets-store.csi.k8s.io/agent-not-ready:NoExecute'}]\nkubernetes: {removeTaintWhenReady: 'readiness.k8s.io/plugins-not-ready:NoSchedule'}",
	"expect: [{type: CSIPlugin, name: csi.example.com}]\nkubernetes: {removeTaintWhenReady: 'example.com/plugins-not-ready:NoExecute'}",
	"kubelet: {servingCertFile: /var/lib/kubelet/pki/kubelet.crt, insecureSkipTLSVerify: false}",
}

// Both ways: a bad value is refused by the schema (naming it) and, where
// plugd sees it, by plugd too when the schema is skipped; a value only
// plugd refuses passes the schema and fails plugd --check-config; and
// each good value passes both.
func TestBadValues(t *testing.T) {
	for _, tc := range badValues {
		_, _, err := render(t, tc.values)
		switch {
		case tc.schema == "" && err != nil:
			t.Errorf("values %q: the schema refuses them (%v); badValues says only plugd does", tc.values, err)
		case tc.schema != "" && (err == nil || !strings.Contains(err.Error(), tc.schema)):
			t.Errorf("values %q: %v; want an error naming %s", tc.values, err, tc.schema)
		}
		if tc.plugd == "" {
			continue
		}
		m, err := renderUnchecked(t, tc.values)
		if err != nil {
			t.Errorf("values %q without the schema: %v", tc.values, err)
			continue
		}
		if _, err := runConfig(t, decode(t, m)); err == nil || !strings.Contains(err.Error(), tc.plugd) {
			t.Errorf("values %q: plugd --check-config says %v; want %q", tc.values, err, tc.plugd)
		}
	}
	for _, values := range goodValues {
		m, _, err := render(t, values)
		if err != nil {
			t.Errorf("values %q: the schema refuses them: %v", values, err)
			continue
		}
		if _, err := runConfig(t, decode(t, m)); err != nil {
			t.Errorf("values %q: %v", values, err)
		}
	}
}

// Every rule of plugd's configuration (testdata/config-rules.txt, written
// from cmd/plugd/internal/daemon/rules.go) has a counterpart in the schema
// (a case of badValues that the schema refuses) or a reason in
// notInSchema; and both lists name only rules that exist.
func TestSchemaCoversConfigRules(t *testing.T) {
	rules := map[string]bool{}
	for _, r := range configRules(t) {
		rules[r.name] = true
	}
	inSchema := map[string]bool{}
	for _, tc := range badValues {
		if tc.rule != "" && !rules[tc.rule] {
			t.Errorf("badValues names the rule %q, which plugd does not have", tc.rule)
		}
		if tc.schema != "" {
			inSchema[tc.rule] = true
		}
	}
	for r := range notInSchema {
		if !rules[r] {
			t.Errorf("notInSchema names the rule %q, which plugd does not have", r)
		}
		if inSchema[r] {
			t.Errorf("the rule %q has a counterpart in the schema and a reason in notInSchema", r)
		}
	}
	for r := range rules {
		if !inSchema[r] && notInSchema[r] == "" {
			t.Errorf("plugd's rule %q has no counterpart in values.schema.json (a badValues case the schema refuses) and no reason in notInSchema", r)
		}
	}
}

// configRule is a line of testdata/config-rules.txt: a rule of plugd's
// configuration, a configuration that breaks it, and what plugd says then.
type configRule struct{ name, example, says string }

// configRules reads testdata/config-rules.txt, which
// cmd/plugd/internal/daemon's TestConfigRules writes from its table.
func configRules(t *testing.T) []configRule {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repo, "test", "deploy", "testdata", "config-rules.txt"))
	if err != nil {
		t.Fatal(err)
	}
	var rules []configRule
	for line := range strings.SplitSeq(string(b), "\n") {
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		f := strings.Split(line, "\t")
		if len(f) != 3 {
			t.Fatalf("config-rules.txt: %q is not NAME<tab>EXAMPLE<tab>SAYS", line)
		}
		rules = append(rules, configRule{f[0], f[1], f[2]})
	}
	return rules
}

// A rule only extraConfig reaches is refused through it: its example, laid
// over the chart's configuration as extraConfig, passes the schema and is
// refused by plugd --check-config on the rendered ConfigMap.
func TestExtraConfigRefusedByPlugd(t *testing.T) {
	for _, r := range configRules(t) {
		if notInSchema[r.name] != onlyExtra {
			continue
		}
		values := "extraConfig: " + r.example
		m, _, err := render(t, values)
		if err != nil {
			t.Errorf("rule %q: values %q: the schema refuses them: %v", r.name, values, err)
			continue
		}
		if _, err := runConfig(t, decode(t, m)); err == nil || !strings.Contains(err.Error(), r.says) {
			t.Errorf("rule %q: values %q: plugd --check-config says %v; want %q", r.name, values, err, r.says)
		}
	}
}
