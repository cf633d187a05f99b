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
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"

	"github.com/plugd/plugd/cmd/internal/printer"
	"github.com/plugd/plugd/internal/nodecond"
)

// PageSize is how many Nodes one request reads. A real Node object is
// around 20 KB (most of it the images the kubelet lists), so a page is
// some 10 MB on the wire, and the reader holds about one page at a time
// however large the cluster: 15,000 Nodes are 30 requests.
const PageSize = 500

// Cluster reads the Nodes that match the label selector (empty: all), a
// page at a time, and counts plugd's conditions on them. client is a
// client of the core API group (CoreV1().RESTClient()); it should accept
// protobuf, of which only each Node's name and conditions are decoded.
// The next page is asked for as soon as a page's continue token is read,
// so that the API server prepares it while this page is decoded. A
// condition plugd has not written within maxAge (zero:
// nodecond.MaxHeartbeatAge) counts as not maintained.
func Cluster(ctx context.Context, client rest.Interface, selector string, maxAge time.Duration) (nodecond.ClusterView, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel() // a page still being fetched when an error ends the read
	fetch := func(cont string) <-chan page {
		ch := make(chan page, 1)
		go func() {
			opts := metav1.ListOptions{LabelSelector: selector, Limit: PageSize, Continue: cont}
			var p page
			p.body, p.err = client.Get().Resource("nodes").VersionedParams(&opts, scheme.ParameterCodec).
				Do(ctx).ContentType(&p.contentType).Raw()
			ch <- p
		}()
		return ch
	}
	c := nodecond.Census{Now: time.Now(), MaxAge: maxAge}
	next := fetch("")
	for {
		p := <-next
		if p.err != nil {
			return nodecond.ClusterView{}, fmt.Errorf("listing nodes: %w", p.err)
		}
		cont, err := continueToken(p.body)
		if err != nil {
			return nodecond.ClusterView{}, fmt.Errorf("listing nodes: %w", err)
		}
		if cont != "" {
			next = fetch(cont)
		}
		if _, err := addPage(p.body, p.contentType, &c); err != nil {
			return nodecond.ClusterView{}, fmt.Errorf("listing nodes: %w", err)
		}
		if cont == "" {
			return c.View(), nil
		}
	}
}

// maxReason bounds a condition's reason as printed: the API checks nothing
// in it (the kubelet's and plugd's are one CamelCase word).
const maxReason = 64

// page is one answer to a list of Nodes.
type page struct {
	body        []byte
	contentType string
	err         error
}

// WriteCluster prints v for people: per plugin, on how many nodes it is
// ready; wide adds each node where it is not, and why (the message cut at
// nodecond.MaxMessage bytes: plugd's are no longer, and others' are not
// bounded by the API).
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
			nt.Rows = append(nt.Rows, []string{printer.Cell(n.Node), printer.Cell(n.Status), printer.ShortCell(n.Reason, maxReason), printer.Since(n.Since, now), printer.ShortCell(n.Message, nodecond.MaxMessage)})
		}
		if err := nt.Write(w, 0); err != nil {
			return err
		}
	}
	return nil
}
