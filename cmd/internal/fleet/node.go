package fleet

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	eventsv1client "k8s.io/client-go/kubernetes/typed/events/v1"
	resourcev1client "k8s.io/client-go/kubernetes/typed/resource/v1"
	storagev1client "k8s.io/client-go/kubernetes/typed/storage/v1"
	"k8s.io/client-go/rest"

	"github.com/plugd/plugd/cmd/internal/printer"
	"github.com/plugd/plugd/internal/kubeconfig"
	"github.com/plugd/plugd/internal/nodecond"
)

// Clients are the API groups the node view and the doctor read. Only the
// typed clients they use, so that a program links no others.
type Clients struct {
	Core     corev1client.CoreV1Interface
	Storage  storagev1client.StorageV1Interface
	Resource resourcev1client.ResourceV1Interface
	Events   eventsv1client.EventsV1Interface
}

// NewClients makes the Clients of rc, bounded as kubeconfig.Bound bounds
// them (what kubeconfig.RESTConfig returns is already).
func NewClients(rc *rest.Config) (Clients, error) {
	rc = rest.CopyConfig(rc)
	kubeconfig.Bound(rc)
	var c Clients
	var err error
	if c.Core, err = corev1client.NewForConfig(rc); err != nil {
		return c, err
	}
	if c.Storage, err = storagev1client.NewForConfig(rc); err != nil {
		return c, err
	}
	if c.Resource, err = resourcev1client.NewForConfig(rc); err != nil {
		return c, err
	}
	c.Events, err = eventsv1client.NewForConfig(rc)
	return c, err
}

// NodeView is one node as plugd and the kubelet show it in the API: what
// kubectl plugd node prints (-o json is this).
type NodeView struct {
	Node string `json:"node"`
	// Ready is the kubelet's Ready condition: True, False or Unknown.
	Ready string `json:"ready"`
	// Plugins are plugd's conditions, one per expected plugin, by type and
	// name.
	Plugins []NodePlugin `json:"plugins"`
	// Kubelet is what the kubelet (and, for DRA, the drivers) wrote about
	// the node's plugins.
	Kubelet KubeletFacts `json:"kubelet"`
	// Unreadable names what could not be read, and why (RBAC, say).
	Unreadable []string `json:"unreadable,omitempty"`
}

// NodePlugin is an expected plugin on a node: plugd's condition for it.
type NodePlugin struct {
	Type      string    `json:"type"`
	Name      string    `json:"name"`
	Condition string    `json:"condition"`
	Status    string    `json:"status"`
	Reason    string    `json:"reason"`
	Message   string    `json:"message"`
	Since     time.Time `json:"since,omitzero"`
	// HeldBy is, for a resource (an expect entry with anyOf) whose
	// condition is True, the plugin that holds it: "DRAPlugin
	// gpu.example.com".
	HeldBy string `json:"heldBy,omitempty"`
}

// KubeletFacts are the node's plugins as the API shows them: the CSI
// drivers in its CSINode, the extended resources in its capacity (device
// plugins') and the DRA drivers with ResourceSlices for it.
type KubeletFacts struct {
	CSIDrivers []CSIDriver `json:"csiDrivers"`
	Devices    []Device    `json:"devices"`
	DRADrivers []string    `json:"draDrivers"`
}

// CSIDriver is an entry of the node's CSINode.
type CSIDriver struct {
	Name   string `json:"name"`
	NodeID string `json:"nodeID"`
}

// Device is an extended resource in the node's status.
type Device struct {
	Resource    string `json:"resource"`
	Capacity    int64  `json:"capacity"`
	Allocatable int64  `json:"allocatable"`
}

// ReadNode reads the view of one node. A Node that does not exist is an
// error; a related object that cannot be read is named in Unreadable.
func ReadNode(ctx context.Context, c Clients, name string) (NodeView, error) {
	n, err := c.Core.Nodes().Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return NodeView{}, fmt.Errorf("reading node %s: %w", name, err)
	}
	return nodeView(ctx, c, n), nil
}

// nodeView fills a NodeView from n and the node's other objects.
func nodeView(ctx context.Context, c Clients, n *corev1.Node) NodeView {
	v := NodeView{Node: n.Name, Ready: string(corev1.ConditionUnknown), Plugins: pluginsOf(n),
		Kubelet: KubeletFacts{CSIDrivers: []CSIDriver{}, Devices: []Device{}, DRADrivers: []string{}}}
	for _, cond := range n.Status.Conditions {
		if cond.Type == corev1.NodeReady {
			v.Ready = string(cond.Status)
		}
	}
	for res, q := range n.Status.Capacity {
		if !extended(res) {
			continue
		}
		a := n.Status.Allocatable[res]
		v.Kubelet.Devices = append(v.Kubelet.Devices, Device{Resource: string(res), Capacity: q.Value(), Allocatable: a.Value()})
	}
	slices.SortFunc(v.Kubelet.Devices, func(a, b Device) int { return cmp.Compare(a.Resource, b.Resource) })

	switch csi, err := c.Storage.CSINodes().Get(ctx, n.Name, metav1.GetOptions{}); {
	case apierrors.IsNotFound(err):
	case err != nil:
		v.Unreadable = append(v.Unreadable, "csinodes: "+err.Error())
	default:
		for _, d := range csi.Spec.Drivers {
			v.Kubelet.CSIDrivers = append(v.Kubelet.CSIDrivers, CSIDriver{Name: d.Name, NodeID: d.NodeID})
		}
	}
	slices.SortFunc(v.Kubelet.CSIDrivers, func(a, b CSIDriver) int { return cmp.Compare(a.Name, b.Name) })

	rs, err := c.Resource.ResourceSlices().List(ctx, metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("spec.nodeName", n.Name).String()})
	if err != nil {
		v.Unreadable = append(v.Unreadable, "resourceslices: "+err.Error())
	} else {
		seen := map[string]bool{}
		for _, s := range rs.Items {
			if !seen[s.Spec.Driver] {
				seen[s.Spec.Driver] = true
				v.Kubelet.DRADrivers = append(v.Kubelet.DRADrivers, s.Spec.Driver)
			}
		}
		slices.Sort(v.Kubelet.DRADrivers)
	}
	return v
}

// extended says whether a resource name is an extended resource (a device
// plugin's), not one of Kubernetes' own.
func extended(r corev1.ResourceName) bool {
	s := string(r)
	return strings.Contains(s, "/") && !strings.HasPrefix(s, "kubernetes.io/") && !strings.Contains(s, ".kubernetes.io/") &&
		!strings.HasPrefix(s, "requests.") && !strings.HasPrefix(s, "hugepages-")
}

// pluginsOf are plugd's conditions on n (nodecond.Conditions: in plugd's
// form, and set by plugd as n's managedFields say), sorted by type and name.
func pluginsOf(n *corev1.Node) []NodePlugin {
	ps := []NodePlugin{}
	for _, c := range nodecond.Conditions(n) {
		typ, name, _ := nodecond.Parse(c.Message)
		p := NodePlugin{Type: typ, Name: name, Condition: string(c.Type), Status: string(c.Status),
			Reason: c.Reason, Message: c.Message, Since: c.LastTransitionTime.Time}
		if ht, hn, ok := nodecond.Holder(c.Message); ok && c.Status == corev1.ConditionTrue {
			p.HeldBy = ht + " " + hn
		}
		ps = append(ps, p)
	}
	slices.SortFunc(ps, func(a, b NodePlugin) int { return cmp.Or(cmp.Compare(a.Type, b.Type), cmp.Compare(a.Name, b.Name)) })
	return ps
}

// WriteNode prints v for people: plugd's conditions in a table, then what
// the kubelet shows. wide adds each condition's message.
func WriteNode(w io.Writer, v NodeView, f Format, now time.Time) error {
	var b strings.Builder
	fmt.Fprintf(&b, "Node %s: Ready %s\n", printer.Cell(v.Node), printer.Cell(v.Ready))
	if len(v.Plugins) == 0 {
		b.WriteString("no condition of plugd's: plugd does not run here, expects no plugin, or cannot reach the API server\n")
	} else {
		t := printer.Table{Header: []string{"TYPE", "NAME", "READY", "REASON", "SINCE"}, NoHeader: f.NoHeaders}
		// A resource's holder (anyOf) gets a column where one is held.
		held := slices.ContainsFunc(v.Plugins, func(p NodePlugin) bool { return p.HeldBy != "" })
		if held {
			t.Header = append(t.Header, "HELD BY")
		}
		if f.Wide {
			t.Header = append(t.Header, "CONDITION", "MESSAGE")
		}
		for _, p := range v.Plugins {
			row := []string{printer.Cell(p.Type), printer.Cell(p.Name), printer.Cell(p.Status), printer.ShortCell(p.Reason, maxReason), printer.Since(p.Since, now)}
			if held {
				row = append(row, printer.Cell(p.HeldBy))
			}
			if f.Wide {
				row = append(row, printer.Cell(p.Condition), printer.ShortCell(p.Message, nodecond.MaxMessage))
			}
			t.Rows = append(t.Rows, row)
		}
		if err := t.Write(&b, 0); err != nil {
			return err
		}
	}
	b.WriteString("\nThe kubelet shows:\n")
	var csi []string
	for _, d := range v.Kubelet.CSIDrivers {
		csi = append(csi, d.Name)
	}
	var devs []string
	for _, d := range v.Kubelet.Devices {
		devs = append(devs, fmt.Sprintf("%s %d/%d allocatable", d.Resource, d.Allocatable, d.Capacity))
	}
	fmt.Fprintf(&b, "  CSI drivers (CSINode):       %s\n", list(csi, f.Wide))
	fmt.Fprintf(&b, "  device plugins (capacity):   %s\n", list(devs, f.Wide))
	fmt.Fprintf(&b, "  DRA drivers (ResourceSlices): %s\n", list(v.Kubelet.DRADrivers, f.Wide))
	for _, u := range v.Unreadable {
		fmt.Fprintf(&b, "  cannot read %s\n", printer.ShortCell(u, nodecond.MaxMessage))
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// maxListed is how many names of a kind the node view prints before it
// counts the rest: a node may have thousands (a line of 30,000 drivers was
// 840 KB), and -o wide or -o json gives them all.
const maxListed = 10

// list joins cells with commas, "none" for none; beyond maxListed it
// counts the others, unless all is set.
func list(s []string, all bool) string {
	if len(s) == 0 {
		return "none"
	}
	shown := s
	if !all && len(s) > maxListed {
		shown = s[:maxListed]
	}
	out := make([]string, len(shown))
	for i, x := range shown {
		out[i] = printer.Cell(x)
	}
	line := strings.Join(out, ", ")
	if len(shown) < len(s) {
		line += fmt.Sprintf(" and %d more (%d in all; -o wide or -o json lists them)", len(s)-len(shown), len(s))
	}
	return line
}

// WatchNode calls emit with the node's view now and again each time its
// Node object changes, until ctx is done (nil) or the watch cannot go on.
// A watch the API server closes (they last minutes) is opened again.
func WatchNode(ctx context.Context, c Clients, name string, emit func(NodeView) error) error {
	sel := fields.OneTermEqualSelector("metadata.name", name).String()
	for {
		list, err := c.Core.Nodes().List(ctx, metav1.ListOptions{FieldSelector: sel})
		if err != nil {
			return watchErr(ctx, fmt.Errorf("reading node %s: %w", name, err))
		}
		if len(list.Items) == 0 {
			return fmt.Errorf("node %s not found", name)
		}
		if err := emit(nodeView(ctx, c, &list.Items[0])); err != nil {
			return err
		}
		wi, err := c.Core.Nodes().Watch(ctx, metav1.ListOptions{FieldSelector: sel, ResourceVersion: list.ResourceVersion})
		if err != nil {
			return watchErr(ctx, fmt.Errorf("watching node %s: %w", name, err))
		}
		err = func() error {
			defer wi.Stop()
			for {
				select {
				case <-ctx.Done():
					return nil
				case ev, ok := <-wi.ResultChan():
					if !ok {
						return errReopen
					}
					n, isNode := ev.Object.(*corev1.Node)
					if !isNode {
						return errReopen // an error event (an expired resource version): read afresh
					}
					if err := emit(nodeView(ctx, c, n)); err != nil {
						return err
					}
				}
			}
		}()
		if err != errReopen {
			return err
		}
	}
}

// errReopen says a watch ended and is to be opened again.
var errReopen = errors.New("watch ended")

// watchErr is nil once ctx is done (Ctrl-C ends a watch cleanly), else err.
func watchErr(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return nil
	}
	return err
}
