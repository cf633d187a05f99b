package kubenode

import (
	"errors"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// The probe's answer: accepted (nothing confines plugd), refused by a
// policy (confined; without the node-name claim, refused whole), or
// anything else (unknown: another policy, RBAC, an unreachable API server).
func TestConfinementOf(t *testing.T) {
	now := time.Now()
	nodes := schema.GroupResource{Resource: "nodes"}
	named := func(name, msg string) error {
		err := apierrors.NewForbidden(nodes, "a", errors.New("ValidatingAdmissionPolicy '"+name+"' with binding '"+name+"' denied request: "+msg))
		err.ErrStatus.Code, err.ErrStatus.Reason = 422, "Invalid"
		return err
	}
	policy := func(msg string) error { return named("plugd-node-status", msg) }
	for _, tc := range []struct {
		name                       string
		err                        error
		known, confined, claimless bool
	}{
		{"accepted", nil, true, false, false},
		{"refused by the policy", policy("plugd may change only its own Node conditions"), true, true, false},
		{"refused for want of the claim", policy("plugd's token carries no node name (the claim ...)"), true, true, true},
		{"refused by another policy", named("site-nodes-readonly", "nodes are read-only"), false, false, false},
		{"refused by a policy that failed", named("plugd-events", "expression 'x' resulted in error"), false, false, false},
		{"refused by RBAC", apierrors.NewForbidden(nodes, "a", errors.New("cannot patch resource")), false, false, false},
		{"unreachable", errors.New("connection refused"), false, false, false},
	} {
		c := confinementOf(tc.err, now)
		if c.Known != tc.known || c.Confined != tc.confined || c.NoClaim != tc.claimless || !c.At.Equal(now) || c.Message == "" {
			t.Errorf("%s: %+v", tc.name, c)
		}
	}
	if c := confinementOf(named("site-nodes-readonly", "no"), now); !strings.Contains(c.Message, `"site-nodes-readonly"`) {
		t.Errorf("another policy's refusal does not say which: %s", c.Message)
	}
	if p := classify("patch nodes/status of a", "patch nodes/status", policy("x"), now); p.Reason != ReasonRefusedByPolicy || p.Permission != "" {
		t.Errorf("a write a policy refuses: %+v", p)
	}
}
