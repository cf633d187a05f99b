package kubenode

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// Confinement is what plugd found of the admission policies that confine
// its ServiceAccount to its Node (the chart's admission-policy.yaml,
// docs/security.md). RBAC lets plugd's token patch the status of every
// Node; only those policies keep a stolen one to plugd's own conditions.
type Confinement struct {
	// Known says the last probe told: false before the first, or when the
	// API server's answer said nothing of the policies (unreachable, RBAC
	// refused the write, the Node is missing).
	Known bool
	// Confined says a policy refused the probe; otherwise the API server
	// accepted it, and nothing confines plugd's token.
	Confined bool
	// NoClaim says a policy refused it because plugd's token carries no
	// node name: every write plugd makes to its Node is refused too.
	NoClaim bool
	// Message is the API server's answer, At when it was given.
	Message string
	At      time.Time
}

// probeCondition is the condition the probe asks to add to plugd's Node: a
// type that is not plugd's, which the policy refuses, in a dry run, which
// stores nothing even where no policy refuses it.
const probeCondition = "plugd.invalid/AdmissionPolicyProbe"

// How long a probe's answer holds: policies come and go with the
// cluster's administrators, not with plugd, and the doctor (which asks)
// may be run in a loop. An answer that told nothing holds for less.
const (
	confinementInterval = 10 * time.Minute
	confinementRetry    = time.Minute
)

// probeConfinement asks the API server, in a dry run, to add a condition
// that is not plugd's to its Node's status, and reads the answer.
func (n *Node) probeConfinement(ctx context.Context) Confinement {
	patch, err := json.Marshal(map[string]any{"status": map[string]any{"conditions": []corev1.NodeCondition{{
		Type: probeCondition, Status: corev1.ConditionUnknown, Reason: "Probe",
		Message: "plugd: a dry run that admission policies must refuse (docs/security.md); never stored",
	}}}})
	if err != nil {
		return Confinement{Message: err.Error()}
	}
	// The doctor waits for it: a few seconds, not a write's bound.
	wctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	_, err = n.core.Nodes().Patch(wctx, n.cfg.NodeName, types.StrategicMergePatchType, patch,
		metav1.PatchOptions{FieldManager: fieldManager, DryRun: []string{metav1.DryRunAll}}, "status")
	return confinementOf(err, n.clock.Now())
}

// nodeStatusPolicySuffix ends the name of plugd's policy for its Node's
// status: the chart names it <fullname>-node-status.
const nodeStatusPolicySuffix = "-node-status"

// refusingPolicy is the name of the ValidatingAdmissionPolicy that err says
// refused a request ("ValidatingAdmissionPolicy 'NAME' with binding ...
// denied request: ..."), or "" when it names none.
func refusingPolicy(err error) string {
	_, rest, ok := strings.Cut(err.Error(), "ValidatingAdmissionPolicy '")
	if !ok {
		return ""
	}
	name, _, ok := strings.Cut(rest, "'")
	if !ok {
		return ""
	}
	return name
}

// confinementOf reads the answer err to the probe, given at now.
func confinementOf(err error, now time.Time) Confinement {
	c := Confinement{At: now}
	var status apierrors.APIStatus
	switch {
	case err == nil:
		c.Known = true
		c.Message = "the API server accepted (dry run) a change of a Node condition that is not plugd's"
	case errors.As(err, &status) && strings.HasSuffix(refusingPolicy(err), nodeStatusPolicySuffix):
		c.Known, c.Confined = true, true
		c.NoClaim = strings.Contains(err.Error(), "carries no node name")
		c.Message = err.Error()
	case errors.As(err, &status) && refusingPolicy(err) != "":
		// Another policy refused it before plugd's was asked, or plugd's
		// is not installed: the answer says nothing of plugd's.
		c.Message = fmt.Sprintf("the probe was refused by the ValidatingAdmissionPolicy %q, not plugd's (named RELEASE%s), so whether plugd's confines its token is unknown: %s",
			refusingPolicy(err), nodeStatusPolicySuffix, err)
	default:
		c.Message = err.Error()
	}
	return c
}

// Confinement is what the API server answered the last probe, probing
// again (bounded by ctx) when that answer is older than it holds. Only the
// doctor asks: plugd makes no probe of its own accord, so that a quiet
// plugd stays quiet.
func (n *Node) Confinement(ctx context.Context) Confinement {
	n.probeMu.Lock()
	defer n.probeMu.Unlock()
	n.mu.Lock()
	was := n.confinement
	n.mu.Unlock()
	age := n.clock.Since(was.At)
	if !was.At.IsZero() && (was.Known && age < confinementInterval || !was.Known && age < confinementRetry) {
		return was
	}
	c := n.probeConfinement(ctx)
	n.mu.Lock()
	n.confinement = c
	n.mu.Unlock()
	if c.Known && (!was.Known || was.Confined != c.Confined || was.NoClaim != c.NoClaim) {
		switch {
		case c.NoClaim:
			n.log.Error("Kubernetes: plugd's token carries no node name, and the admission policies refuse every write plugd makes to its Node", "node", n.cfg.NodeName, "answer", c.Message)
		case !c.Confined:
			n.log.Warn("Kubernetes: no admission policy confines plugd's ServiceAccount to its own Node (docs/security.md)", "node", n.cfg.NodeName)
		default:
			n.log.Info("Kubernetes: admission policies confine plugd's ServiceAccount to its own Node", "node", n.cfg.NodeName)
		}
	}
	return c
}
