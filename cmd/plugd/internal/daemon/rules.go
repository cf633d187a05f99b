package daemon

import (
	"fmt"
	"strings"
	"time"
)

// configRule is one rule plugd's configuration is held to at start (by
// LoadConfig's strict decoding and by WithDefaults), named so that a test
// can walk them all: TestConfigRules checks that each example is refused
// for the reason given, and writes the list to test/deploy, whose
// TestSchemaCoversConfigRules holds the Helm chart's values.schema.json to
// it (each rule has a counterpart there, or a reason why JSON Schema cannot
// say it). A rule added to WithDefaults gets its line here.
type configRule struct {
	field   string // the YAML path; [] for each entry of a list
	check   string // what is checked, one word or two: range, enum, required, ...
	example string // a configuration that breaks this rule (and no other before it)
	says    string // what plugd's error says of it
}

// name is the rule's name, as the list in test/deploy writes it.
func (r configRule) name() string { return r.field + " " + r.check }

// configRules are the rules, the numeric settings' ranges (bounds.go)
// included. policy.allowedPeers on Windows (refused: Windows cannot say
// who listens on a socket) is left out: it holds on one platform only.
func configRules() []configRule {
	rules := []configRule{
		{"(any)", "known-field", "workrs: 3\n", "unknown key workrs"},
		{"(any duration)", "syntax", "resyncInterval: 30\n", "a duration is written like"},
		{"mode", "enum", "mode: watch\n", `mode is "watch"`},
		{"registryDir", "not-system", "registryDir: /etc\n", "is a system directory"},
		{"handlers[].type", "required", "handlers: [{handler: accept}]\n", "handlers[0].type is empty"},
		{"handlers[].type", "unique", "handlers: [{type: A, handler: accept}, {type: A, handler: csi}]\n", "has a handler already"},
		{"handlers[].handler", "enum", "handlers: [{type: A, handler: magic}]\n", `handlers[0].handler is "magic"`},
		{"handlers[].hook", "required", "handlers: [{type: A, handler: hook}]\n", "handler hook needs hook"},
		{"handlers[].hook", "only-hook", "handlers: [{type: A, handler: csi, hook: {url: 'http://127.0.0.1/'}}]\n", "hook is set, but the handler is csi"},
		{"handlers[].hook", "valid", "handlers: [{type: A, handler: hook, hook: {}}]\n", "handlers[0]: hook"},
		{"handlers[].gracePeriod", "only-dra-deviceplugin", "handlers: [{type: A, handler: csi, gracePeriod: 1m}]\n", "gracePeriod applies to the dra and deviceplugin handlers"},
		{"status.socket", "outside-registryDir", "registryDir: /run/x/plugins\nstatus: {socket: /run/x/plugins/plugd.sock}\n", "is inside registryDir"},
		{"status.tcp", "host-port", "status: {tcp: nine}\n", "it must be host:port"},
		{"status.tcp", "loopback", "status: {tcp: 0.0.0.0:9090}\n", "not a loopback address"},
		{"policy.allowedPeers[].type", "required", "policy: {allowedPeers: [{uids: [0]}]}\n", "policy.allowedPeers[0].type is empty"},
		{"policy.allowedPeers[].type", "unique", "policy: {allowedPeers: [{type: A, uids: [0]}, {type: A, uids: [1]}]}\n", "has a rule already"},
		{"policy.allowedPeers[]", "not-empty", "policy: {allowedPeers: [{type: A}]}\n", "lists no uids or gids"},
		{"policy.endpointRoots[]", "absolute", "policy: {endpointRoots: [run/x]}\n", "is not an absolute path"},
		{"log.format", "enum", "log: {format: xml}\n", `log.format is "xml"`},
		{"log.level", "enum", "log: {level: loud}\n", `log.level is "loud"`},
		{"kubernetes.nodeName", "required", "kubernetes: {}\n", "kubernetes.nodeName is empty"},
		{"kubernetes.nodeName", "dns-subdomain", "kubernetes: {nodeName: ../x}\n", "is not a Node's name"},
		{"kubernetes.kubelet.address", "host-port", "kubernetes: {nodeName: n, kubelet: {address: kubelet}}\n", "write it as HOST:PORT"},
		{"kubernetes.kubelet.caFile", "absolute", "kubernetes: {nodeName: n, kubelet: {caFile: kubelet.crt}}\n", "kubernetes.kubelet.caFile \"kubelet.crt\" is not an absolute path"},
		{"kubernetes.kubelet.podResourcesSocket", "absolute", "kubernetes: {nodeName: n, kubelet: {podResourcesSocket: kubelet.sock}}\n", "is not an absolute path"},
		{"kubernetes.kubelet.registryDir", "absolute", "kubernetes: {nodeName: n, kubelet: {registryDir: plugins_registry}}\n", "is not an absolute path"},
		{"kubernetes.kubelet", "one-tls", "kubernetes: {nodeName: n, kubelet: {caFile: /ca.crt, insecureSkipTLSVerify: true}}\n", "caFile and insecureSkipTLSVerify are both set"},
		{"kubernetes.removeTaintWhenReady", "key-effect", "kubernetes: {nodeName: n, removeTaintWhenReady: example.com/t}\n", "write it as KEY:EFFECT"},
		{"kubernetes.removeTaintWhenReady", "key", "kubernetes: {nodeName: n, removeTaintWhenReady: 'a b:NoSchedule'}\n", "is not a valid taint key"},
		{"kubernetes.removeTaintWhenReady", "effect", "kubernetes: {nodeName: n, removeTaintWhenReady: 'example.com/t:Sometimes'}\n", "must be NoSchedule, PreferNoSchedule or NoExecute"},
		{"kubernetes.removeTaintWhenReady", "not-kubernetes", "kubernetes: {nodeName: n, removeTaintWhenReady: 'node.kubernetes.io/unschedulable:NoSchedule'}\n", "Kubernetes reserves"},
		{"kubernetes.removeTaintWhenReady", "needs-expect", "kubernetes: {nodeName: n, removeTaintWhenReady: 'example.com/t:NoSchedule'}\n", "expect lists no plugins"},
		{"doctor.procDir", "proc", "doctor: {procDir: /}\n", "doctor.procDir / "},
		{"doctor.kubeletRoots[]", "absolute", "doctor: {kubeletRoots: [var/lib/kubelet]}\n", "doctor.kubeletRoots[0]"},
		{"backoff.max", "not-below-initial", "backoff: {initial: 1m, max: 30s}\n", "backoff.max (30s) is less than backoff.initial"},
	}
	rules = append(rules, expectRules()...)
	for _, s := range countSettings {
		rules = append(rules, configRule{s.field, "range", nest(s.field, fmt.Sprint(s.max+1)), s.field + " is"})
	}
	for _, s := range durationSettings {
		rules = append(rules, configRule{s.field, "range", nest(s.field, belowMin(s.min)), s.field + " is"})
	}
	for _, s := range handlerSettings {
		entry := "{type: A, handler: dra, " + s.field + ": " + belowMin(s.min) + "}"
		if s.field == "hook.timeout" {
			entry = "{type: A, handler: hook, hook: {command: [/bin/true], timeout: " + belowMin(s.min) + "}}"
		}
		rules = append(rules, configRule{"handlers[]." + s.field, "range", "handlers: [" + entry + "]\n", s.field + " is"})
	}
	return rules
}

// expectRules are the rules of expect's entries.
func expectRules() []configRule {
	return []configRule{
		{"expect[]", "type-and-name", "expect: [{type: CSIPlugin}]\n", "type and name are both needed"},
		{"expect[]", "no-spaces", "expect: [{type: CSIPlugin, name: 'a b'}]\n", "may not contain spaces, colons or control characters"},
		{"expect[].minHealthyDevices", "positive", "expect: [{type: DevicePlugin, name: example.com/gpu, minHealthyDevices: -1}]\n", "must be positive"},
		{"expect[].minHealthyDevices", "only-deviceplugin", "expect: [{type: CSIPlugin, name: a.example.com, minHealthyDevices: 2}]\n", "minHealthyDevices applies to DevicePlugin"},
		{"expect[].minDevices", "positive", "expect: [{type: DRAPlugin, name: gpu.example.com, minDevices: -1}]\n", "must be positive"},
		{"expect[].minDevices", "only-draplugin", "expect: [{type: DevicePlugin, name: example.com/gpu, minDevices: 2}]\n", "minDevices applies to DRAPlugin"},
		{"expect[].deviceClasses", "only-draplugin", "expect: [{type: CSIPlugin, name: a.example.com, deviceClasses: [gpu.example.com]}]\nkubernetes: {nodeName: n}\n", "deviceClasses applies to DRAPlugin"},
		{"expect[].deviceClasses[]", "dns-subdomain", "expect: [{type: DRAPlugin, name: gpu.example.com, deviceClasses: [GPU_Class]}]\nkubernetes: {nodeName: n}\n", "is not a DeviceClass name"},
		{"expect[].deviceClasses[]", "unique", "expect: [{type: DRAPlugin, name: gpu.example.com, deviceClasses: [gpu.example.com, gpu.example.com]}]\nkubernetes: {nodeName: n}\n", "is listed twice"},
		{"expect[].deviceClasses", "needs-kubernetes", "expect: [{type: DRAPlugin, name: gpu.example.com, deviceClasses: [gpu.example.com]}]\n", "deviceClasses is set, but kubernetes is not"},
		{"expect[].condition", "default-valid", "expect: [{type: CSIPlugin, name: -a}]\n", "the default condition type"},
		{"expect[].condition", "qualified-name", "expect: [{type: CSIPlugin, name: a.example.com, condition: 'a/b/c'}]\n", "is not a valid Node condition type"},
		{"expect[].condition", "not-kubelets", "expect: [{type: CSIPlugin, name: a.example.com, condition: Ready}]\n", "is the kubelet's"},
		{"expect[].condition", "not-node-problem-detectors", "expect: [{type: CSIPlugin, name: a.example.com, condition: KernelDeadlock}]\n", "node-problem-detector's"},
		{"expect[]", "unique-plugin", "expect: [{type: CSIPlugin, name: a.example.com}, {type: CSIPlugin, name: a.example.com, condition: example.com/X}]\n", "is also expect[0]'s"},
		{"expect[].condition", "unique", "expect: [{type: CSIPlugin, name: a.example.com}, {type: DRAPlugin, name: b.example.com, condition: a.example.com/CSIPluginReady}]\n", "is also expect[0]'s"},
		{"expect[].anyOf", "not-type", "expect: [{type: DevicePlugin, name: example.com/gpu, anyOf: [{type: DRAPlugin, name: gpu.example.com}]}]\n", "and anyOf are both set"},
		{"expect[].anyOf", "not-empty", "expect: [{type: anyOf, name: gpu.example.com}]\n", "lists no alternatives"},
		{"expect[].anyOf", "max-8", "expect: [{name: r.example.com, anyOf: [" + strings.Repeat("{type: DRAPlugin, name: a.example.com}, ", 8) + "{type: DRAPlugin, name: a.example.com}]}]\n", "at most 8"},
		{"expect[].name", "anyOf-needs-name", "expect: [{anyOf: [{type: DRAPlugin, name: gpu.example.com}]}]\n", "an entry with anyOf needs a name"},
		{"expect[].anyOf[].anyOf", "not-nested", "expect: [{name: r.example.com, anyOf: [{name: s.example.com, anyOf: [{type: DRAPlugin, name: gpu.example.com}]}]}]\n", "has an anyOf of its own"},
		{"expect[].anyOf[]", "no-condition-or-taint", "expect: [{name: r.example.com, anyOf: [{type: DRAPlugin, name: gpu.example.com, condition: example.com/X}]}]\n", "are the entry's, not one alternative's"},
		{"expect[].anyOf[]", "valid", "expect: [{name: r.example.com, anyOf: [{type: DRAPlugin}]}]\n", "anyOf[0]: type and name are both needed"},
		{"expect[].anyOf[]", "unique", "expect: [{name: r.example.com, anyOf: [{type: DRAPlugin, name: gpu.example.com}, {type: DRAPlugin, name: gpu.example.com}]}]\n", "is also anyOf[0]"},
		{"expect[].anyOf[]", "unique-plugin", "expect: [{type: DRAPlugin, name: gpu.example.com}, {name: r.example.com, anyOf: [{type: DRAPlugin, name: gpu.example.com}]}]\n", "expect[1].anyOf[0]: plugin DRAPlugin gpu.example.com is also expect[0]'s"},
		{"expect[].taint", "key-effect", "expect: [{type: CSIPlugin, name: a.example.com, taint: a.example.com/not-ready}]\nkubernetes: {nodeName: n}\n", "write it as KEY:EFFECT"},
		{"expect[].taint", "not-kubernetes", "expect: [{type: CSIPlugin, name: a.example.com, taint: 'node.kubernetes.io/not-ready:NoExecute'}]\nkubernetes: {nodeName: n}\n", "Kubernetes reserves"},
		{"expect[].taint", "needs-kubernetes", "expect: [{type: CSIPlugin, name: a.example.com, taint: 'a.example.com/not-ready:NoExecute'}]\n", "taint is set, but kubernetes is not"},
		{"expect[].retaint", "needs-taint", "expect: [{type: CSIPlugin, name: a.example.com, retaint: true}]\n", "retaint is set, but taint is not"},
		{"expect[].taint", "one-effect", "expect: [{type: CSIPlugin, name: a.example.com, taint: 'example.com/t:NoSchedule'}, {type: CSIPlugin, name: b.example.com, taint: 'example.com/t:NoExecute'}]\nkubernetes: {nodeName: n}\n", "one key, one effect"},
		{"expect[].retaint", "agree", "expect: [{type: CSIPlugin, name: a.example.com, taint: 'example.com/t:NoSchedule', retaint: true}, {type: CSIPlugin, name: b.example.com, taint: 'example.com/t:NoSchedule'}]\nkubernetes: {nodeName: n}\n", "disagree about retaint"},
		{"expect[].taint", "not-removeTaintWhenReady", "expect: [{type: CSIPlugin, name: a.example.com, taint: 'example.com/t:NoSchedule'}]\nkubernetes: {nodeName: n, removeTaintWhenReady: 'example.com/t:NoSchedule'}\n", "name it once"},
	}
}

// belowMin is a duration under min, as YAML: half of it.
func belowMin(min time.Duration) string { return (min / 2).String() }

// nest is field (a dotted path) set to value, as flow YAML; a kubernetes
// section gets the nodeName it needs.
func nest(field, value string) string {
	parts := strings.Split(field, ".")
	s := value
	for i := len(parts) - 1; i >= 0; i-- {
		extra := ""
		if i == 1 && parts[0] == "kubernetes" {
			extra = ", nodeName: n"
		}
		s = "{" + parts[i] + ": " + s + extra + "}"
	}
	return strings.TrimSuffix(strings.TrimPrefix(s, "{"), "}") + "\n"
}
