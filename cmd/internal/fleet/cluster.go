// Package fleet reads, through the Kubernetes API, what plugd reports in
// its Node conditions: across the cluster (plugctl cluster and kubectl plugd
// cluster), on one node (kubectl plugd node), and what is wrong there
// (kubectl plugd doctor). It lives in cmd/internal because it is the private
// code of two programs, plugctl and kubectl-plugd, which print the same
// answers the same way; it is no library of the module (those are in
// internal/ and below the top level), and only programs under cmd/ may
// import it.
package fleet

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"

	"github.com/plugd/plugd/cmd/internal/printer"
	"github.com/plugd/plugd/internal/nodecond"
)

// PageSize is how many Nodes one request reads. A real Node object is
// around 20 KB (most of it the images the kubelet lists), so a page is
// some 10 MB on the wire, and the reader holds about one page at a time
// however large the cluster: 15,000 Nodes are 30 requests.
const PageSize = 500

// Cluster reads the Nodes that match the label selector (empty: all), a
// page at a time, and counts plugd's conditions on them.
func Cluster(ctx context.Context, client corev1client.NodesGetter, selector string) (nodecond.ClusterView, error) {
	var c nodecond.Census
	opts := metav1.ListOptions{LabelSelector: selector, Limit: PageSize}
	for {
		page, err := client.Nodes().List(ctx, opts)
		if err != nil {
			return nodecond.ClusterView{}, fmt.Errorf("listing nodes: %w", err)
		}
		for i := range page.Items {
			c.Add(&page.Items[i])
		}
		if page.Continue == "" {
			return c.View(), nil
		}
		opts.Continue = page.Continue
	}
}

// WriteCluster prints v for people: per plugin, on how many nodes it is
// ready; wide adds each node where it is not, and why.
func WriteCluster(w io.Writer, v nodecond.ClusterView, wide bool, now time.Time) error {
	if len(v.Plugins) == 0 {
		_, err := fmt.Fprintf(w, "no node has a condition of plugd's (%d nodes): no plugd expects a plugin, or none is connected to Kubernetes\n", v.Nodes)
		return err
	}
	t := printer.Table{Header: []string{"TYPE", "NAME", "READY", "EXPECTED", "CONDITION"}}
	for _, p := range v.Plugins {
		t.Rows = append(t.Rows, []string{printer.Cell(p.Type), printer.Cell(p.Name), strconv.Itoa(p.Ready), strconv.Itoa(p.Expected), printer.Cell(p.Condition)})
	}
	if err := t.Write(w, 0); err != nil {
		return err
	}
	if _, err := fmt.Fprintf(w, "%d nodes, %d with plugd's conditions\n", v.Nodes, v.NodesWithPlugd); err != nil {
		return err
	}
	if !wide {
		return nil
	}
	for _, p := range v.Plugins {
		if len(p.NotReady) == 0 {
			continue
		}
		fmt.Fprintf(w, "\n%s %s: not ready on %d of %d nodes\n", printer.Cell(p.Type), printer.Cell(p.Name), len(p.NotReady), p.Expected)
		nt := printer.Table{Header: []string{"NODE", "STATUS", "REASON", "SINCE", "MESSAGE"}}
		for _, n := range p.NotReady {
			nt.Rows = append(nt.Rows, []string{printer.Cell(n.Node), printer.Cell(n.Status), printer.Cell(n.Reason), printer.Since(n.Since, now), printer.Cell(n.Message)})
		}
		if err := nt.Write(w, 0); err != nil {
			return err
		}
	}
	return nil
}
