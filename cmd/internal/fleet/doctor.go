package fleet

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"

	"github.com/plugd/plugd/api"
	"github.com/plugd/plugd/internal/nodecond"
	"github.com/plugd/plugd/internal/textsafe"
)

// DoctorOptions say where plugd runs, for the doctor and the node view to
// find its pod.
type DoctorOptions struct {
	// Namespace is plugd's (the chart's release namespace); default plugd.
	Namespace string
	// PodSelector selects plugd's pods; default app.kubernetes.io/name=plugd.
	PodSelector string
	// ReportTimeout bounds asking plugd's own report through the API
	// server's pod proxy; default 10s.
	ReportTimeout time.Duration
}

// reportPath is plugd's findings on its status API.
const reportPath = "/v1/findings"

// Doctor looks at a node through the API and says what is wrong there,
// most serious first: the kubelet's Ready condition, each of plugd's
// conditions that is not True (with what to do for its reason), whether a
// plugd pod runs on the node and is ready, plugd's Warning events about
// the node, and, where the API server's pod proxy reaches it, plugd's own
// report (what plugctl doctor prints on the node). A Node that cannot be
// read is an error; anything else that cannot be read is a finding.
func Doctor(ctx context.Context, c Clients, node string, o DoctorOptions) ([]api.Finding, error) {
	o = o.withDefaults()
	n, err := c.Core.Nodes().Get(ctx, node, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("reading node %s: %w", node, err)
	}
	var fs []api.Finding
	fs = append(fs, nodeFindings(n)...)
	pod, podFindings := plugdPod(ctx, c, node, o)
	fs = append(fs, podFindings...)
	fs = append(fs, eventFindings(ctx, c, node)...)
	if pod != nil {
		fs = append(fs, reportFindings(ctx, c, pod, o)...)
	}
	slices.SortStableFunc(fs, func(a, b api.Finding) int {
		return slices.Index(api.Severities, b.Severity) - slices.Index(api.Severities, a.Severity)
	})
	return fs, nil
}

// withDefaults is o with its defaults where it says nothing.
func (o DoctorOptions) withDefaults() DoctorOptions {
	o.Namespace = cmp.Or(o.Namespace, "plugd")
	o.PodSelector = cmp.Or(o.PodSelector, "app.kubernetes.io/name=plugd")
	o.ReportTimeout = cmp.Or(o.ReportTimeout, 10*time.Second)
	return o
}

// nodeFindings reads the Node's conditions.
func nodeFindings(n *corev1.Node) []api.Finding {
	var fs []api.Finding
	ready := false
	for _, c := range n.Status.Conditions {
		if c.Type != corev1.NodeReady {
			continue
		}
		ready = c.Status == corev1.ConditionTrue
		if !ready {
			fs = append(fs, api.Finding{Severity: api.SeverityError, Check: "node-not-ready",
				Summary:  "the kubelet does not report the node Ready: plugins cannot register with it",
				Evidence: []string{fmt.Sprintf("Ready %s since %s: %s %s", c.Status, stamp(c.LastTransitionTime.Time), quote(c.Reason), quote(c.Message))},
				Remedy:   "look at the kubelet first: kubectl describe node " + n.Name + "; on the node, journalctl -u kubelet"})
		}
	}
	ps := pluginsOf(n)
	if len(ps) == 0 {
		fs = append(fs, api.Finding{Severity: api.SeverityWarning, Check: "no-conditions",
			Summary: "the node has no condition of plugd's: plugd does not run here, expects no plugin, or cannot write its Node",
			Remedy:  "see below whether plugd's pod runs here; list the plugins the node must have in the chart's expect value"})
	}
	for _, p := range ps {
		if p.Status == string(corev1.ConditionTrue) {
			continue
		}
		fs = append(fs, api.Finding{Severity: api.SeverityError, Check: "plugin-not-ready", Type: p.Type, Name: p.Name,
			Summary:  fmt.Sprintf("expected plugin not ready (%s)", p.Reason),
			Evidence: []string{fmt.Sprintf("condition %s %s since %s", p.Condition, p.Status, stamp(p.Since)), quote(p.Message)},
			Remedy:   remedy(p.Reason, n.Name)})
	}
	for _, t := range n.Spec.Taints {
		if strings.HasPrefix(t.Key, "node.kubernetes.io/") || strings.HasPrefix(t.Key, "node-role.kubernetes.io/") || t.Effect == corev1.TaintEffectPreferNoSchedule {
			continue // Kubernetes' own: the kubelet's and the node lifecycle's
		}
		fs = append(fs, api.Finding{Severity: api.SeverityInfo, Check: "taint",
			Summary: fmt.Sprintf("the node has the taint %s:%s: pods that do not tolerate it stay off", t.Key, t.Effect),
			Evidence: []string{"a startup taint for plugins is removed by plugd (kubernetes.removeTaintWhenReady) or by a NodeReadinessRule " +
				"once every expected plugin is ready; the conditions above say which is not"}})
	}
	return fs
}

// remedy says what to do about an expected plugin that is not ready, by the
// reason of plugd's condition.
func remedy(reason, node string) string {
	pods := "kubectl get pods -A -o wide --field-selector spec.nodeName=" + node
	switch reason {
	case "SocketMissing":
		return "the plugin's node pod is not running here, or puts its registration socket in another directory than the kubelet's: " + pods
	case "NotAnswering":
		return "its socket is there but its process does not answer: look at the plugin pod's logs and restarts: " + pods
	case "KubeletNotRegistered":
		return "the plugin answers but the kubelet has not registered it: look at the kubelet's log for the plugin's name (journalctl -u kubelet), then restart the plugin's pod"
	case "TopologyConflict":
		return "the kubelet refuses the CSI driver: the topology it reports collides with the Node's label (the condition's message names both values); remove the stale label (kubectl label node " + node + " KEY-) if the driver's new value is right, or give the driver its old node id back, then restart the driver's pod"
	case "NodeIDMismatch":
		return "the CSINode entry is from another registration: restart the driver's pod so node-driver-registrar registers it again"
	case "NoResourceSlices":
		return "the DRA driver has published no ResourceSlices for the node: look at the driver's log and its permission to write resourceslices"
	case "NoHealthyDevices":
		return "the device plugin reports fewer healthy devices than the node must have: look at the device plugin's log and the devices"
	}
	return "kubectl plugd node " + node + " -o wide shows the condition's message"
}

// plugdPod finds the plugd pod on the node and says whether it is ready.
func plugdPod(ctx context.Context, c Clients, node string, o DoctorOptions) (*corev1.Pod, []api.Finding) {
	pods, err := c.Core.Pods(o.Namespace).List(ctx, metav1.ListOptions{LabelSelector: o.PodSelector,
		FieldSelector: fields.OneTermEqualSelector("spec.nodeName", node).String()})
	if err != nil {
		return nil, []api.Finding{unreadable("pods in namespace "+o.Namespace, err)}
	}
	if len(pods.Items) == 0 {
		return nil, []api.Finding{{Severity: api.SeverityError, Check: "plugd-not-running",
			Summary:  fmt.Sprintf("no plugd pod (%s) in namespace %s runs on the node", o.PodSelector, o.Namespace),
			Evidence: []string{"without plugd nobody keeps the node's plugin conditions: they say what they said last"},
			Remedy:   fmt.Sprintf("kubectl -n %s describe daemonset -l %s (its nodeSelector, affinity and tolerations); -n names another namespace", o.Namespace, o.PodSelector)}}
	}
	p := &pods.Items[0]
	for _, cs := range p.Status.ContainerStatuses {
		if cs.Ready {
			continue
		}
		ev := []string{fmt.Sprintf("pod %s/%s, phase %s, container %s restarted %d times", p.Namespace, p.Name, p.Status.Phase, cs.Name, cs.RestartCount)}
		if w := cs.State.Waiting; w != nil {
			ev = append(ev, "waiting: "+quote(w.Reason)+" "+quote(w.Message))
		}
		if t := cs.LastTerminationState.Terminated; t != nil {
			ev = append(ev, fmt.Sprintf("last exit %d (%s) %s", t.ExitCode, quote(t.Reason), quote(t.Message)))
		}
		return p, []api.Finding{{Severity: api.SeverityError, Check: "plugd-not-ready",
			Summary: "plugd's pod on the node is not ready", Evidence: ev,
			Remedy: fmt.Sprintf("kubectl -n %s logs %s --previous", p.Namespace, p.Name)}}
	}
	if len(p.Status.ContainerStatuses) == 0 {
		return p, []api.Finding{{Severity: api.SeverityWarning, Check: "plugd-not-ready",
			Summary:  "plugd's pod on the node has not started",
			Evidence: []string{fmt.Sprintf("pod %s/%s, phase %s", p.Namespace, p.Name, p.Status.Phase)},
			Remedy:   fmt.Sprintf("kubectl -n %s describe pod %s", p.Namespace, p.Name)}}
	}
	return p, nil
}

// eventFindings are plugd's Warning events about the node (they expire
// after an hour, by default).
func eventFindings(ctx context.Context, c Clients, node string) []api.Finding {
	evs, err := c.Events.Events(metav1.NamespaceAll).List(ctx, metav1.ListOptions{FieldSelector: fields.AndSelectors(
		fields.OneTermEqualSelector("regarding.kind", "Node"),
		fields.OneTermEqualSelector("regarding.name", node),
	).String()})
	if err != nil {
		return []api.Finding{unreadable("events", err)}
	}
	var fs []api.Finding
	for _, e := range evs.Items {
		if e.Type != corev1.EventTypeWarning || e.ReportingController != "plugd" {
			continue
		}
		last, count := e.EventTime.Time, int32(1)
		if e.Series != nil {
			last, count = e.Series.LastObservedTime.Time, e.Series.Count
		}
		typ, name, _ := strings.Cut(strings.TrimPrefix(e.Action, "Check "), " ")
		fs = append(fs, api.Finding{Severity: api.SeverityWarning, Check: "event-" + e.Reason, Type: typ, Name: name,
			Summary:  e.Note,
			Evidence: []string{fmt.Sprintf("event %s, %d times, last %s", e.Reason, count, stamp(last))}})
	}
	return fs
}

// reportFindings asks plugd on the node for its own findings, through the
// API server's proxy to its pod's status port.
func reportFindings(ctx context.Context, c Clients, pod *corev1.Pod, o DoctorOptions) []api.Finding {
	port := statusPort(pod)
	exec := fmt.Sprintf("kubectl -n %s exec %s -- plugctl --socket /run/plugd/plugd.sock doctor", pod.Namespace, pod.Name)
	if port == "" {
		return []api.Finding{{Severity: api.SeverityInfo, Check: "report-unreachable",
			Summary: "plugd's pod declares no port named status: its own report was not asked", Remedy: exec}}
	}
	ctx, cancel := context.WithTimeout(ctx, o.ReportTimeout)
	defer cancel()
	b, err := c.Core.Pods(pod.Namespace).ProxyGet("http", pod.Name, port, reportPath, nil).DoRaw(ctx)
	if err != nil {
		return []api.Finding{{Severity: api.SeverityInfo, Check: "report-unreachable",
			Summary:  "plugd's own report could not be read through the API server's pod proxy",
			Evidence: []string{fmt.Sprintf("GET pods/%s/proxy%s on port %s: %v", pod.Name, reportPath, port, short(err))},
			Remedy:   "read it on the node: " + exec + " (the chart's NetworkPolicy admits only what networkPolicy.from selects, which may leave the API server out)"}}
	}
	var l api.FindingList
	if err := json.Unmarshal(b, &l); err != nil {
		return []api.Finding{{Severity: api.SeverityInfo, Check: "report-unreachable",
			Summary: "plugd's report through the pod proxy is not what plugd answers", Evidence: []string{short(err).Error()}, Remedy: exec}}
	}
	return l.Findings
}

// statusPort is the port of pod's status API (the port named status), or
// empty.
func statusPort(pod *corev1.Pod) string {
	for _, ct := range pod.Spec.Containers {
		for _, p := range ct.Ports {
			if p.Name == "status" {
				return fmt.Sprint(p.ContainerPort)
			}
		}
	}
	return ""
}

// unreadable is the finding for an object the doctor may not or cannot read.
func unreadable(what string, err error) api.Finding {
	remedy := "check that the API server answers"
	if apierrors.IsForbidden(err) {
		remedy = "you may not read them: ask for that permission, or run the doctor as someone who has it"
	}
	return api.Finding{Severity: api.SeverityInfo, Check: "unreadable", Summary: "cannot read " + what,
		Evidence: []string{short(err).Error()}, Remedy: remedy}
}

// short cuts an error's text (a proxied error can carry a whole page).
func short(err error) error {
	s := err.Error()
	if len(s) > 300 {
		return fmt.Errorf("%s...", s[:300])
	}
	return err
}

// quote is text of an API object (a condition's message, a pod's status)
// in a finding, escaped and cut at nodecond.MaxMessage bytes: the API does
// not bound it, and findings are printed and served as JSON.
func quote(s string) string { return textsafe.Shorten(s, nodecond.MaxMessage) }

// stamp is t as RFC 3339, or "unknown".
func stamp(t time.Time) string {
	if t.IsZero() {
		return "unknown"
	}
	return t.UTC().Format(time.RFC3339)
}
