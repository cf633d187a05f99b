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
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
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

// Bounds of one list of Nodes: an API server whose list never ends (a
// continue token on every page) or whose pages never stop growing makes
// Cluster stop with ErrListTooLong, not read on until memory or patience
// runs out. No Kubernetes cluster has MaxListNodes Nodes (the largest run
// some 65,000); MaxListPages allows pages half full (a server may answer
// fewer items than asked for); MaxListBytes is MaxListNodes Nodes of 40 KB,
// twice what a kubelet of today reports. Only one page is held at a time
// (kubeconfig.MaxBody bounds it), and the census keeps a few strings per
// node.
const (
	MaxListNodes = 100_000
	MaxListPages = 2 * MaxListNodes / PageSize
	MaxListBytes = MaxListNodes * 40 << 10
)

// ErrListTooLong is the error of a list of Nodes that passed one of the
// bounds above.
var ErrListTooLong = errors.New("the list of Nodes does not end")

// listLimits are the bounds of one list; tests set smaller ones.
type listLimits struct {
	pages, nodes int
	bytes        int64
}

var defaultListLimits = listLimits{pages: MaxListPages, nodes: MaxListNodes, bytes: MaxListBytes}

// Cluster reads the Nodes that match the label selector (empty: all), a
// page at a time, and counts plugd's conditions on them. client is a
// client of the core API group (CoreV1().RESTClient()); it should accept
// protobuf, of which only each Node's name and conditions are decoded.
// The next page is asked for as soon as a page's continue token is read,
// so that the API server prepares it while this page is decoded. A
// condition plugd has not written within maxAge (zero:
// nodecond.MaxHeartbeatAge) counts as not maintained. A list longer than
// MaxListPages, MaxListNodes or MaxListBytes is an error (ErrListTooLong).
func Cluster(ctx context.Context, client rest.Interface, selector string, maxAge time.Duration) (nodecond.ClusterView, error) {
	return cluster(ctx, client, selector, maxAge, defaultListLimits)
}

func cluster(ctx context.Context, client rest.Interface, selector string, maxAge time.Duration, limits listLimits) (nodecond.ClusterView, error) {
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
	var read listRead
	for {
		p := <-next
		if p.err != nil {
			return nodecond.ClusterView{}, fmt.Errorf("listing nodes: %w", p.err)
		}
		read.pages++
		read.bytes += int64(len(p.body))
		cont, err := continueToken(p.body)
		if err != nil {
			return nodecond.ClusterView{}, fmt.Errorf("listing nodes: %w", err)
		}
		if cont != "" && read.within(limits) {
			next = fetch(cont)
		}
		_, n, err := addPage(p.body, p.contentType, &c)
		if err != nil {
			return nodecond.ClusterView{}, fmt.Errorf("listing nodes: %w", err)
		}
		read.nodes += n
		if cont != "" && !read.within(limits) {
			return nodecond.ClusterView{}, read.tooLong(limits)
		}
		if cont == "" {
			v := c.View()
			v.Source, v.AsOf = SourceNodes, c.Now
			return v, nil
		}
	}
}

// listRead is how much of one list has been read.
type listRead struct {
	pages, nodes int
	bytes        int64
}

// within says whether a list read this far may go on.
func (r listRead) within(l listLimits) bool {
	return r.pages < l.pages && r.nodes <= l.nodes && r.bytes <= l.bytes
}

// tooLong is the error of a list that passed a bound: which one, and what
// to do.
func (r listRead) tooLong(l listLimits) error {
	var bound string
	switch {
	case r.nodes > l.nodes:
		bound = fmt.Sprintf("more than %d Nodes", l.nodes)
	case r.bytes > l.bytes:
		bound = fmt.Sprintf("more than %d MiB", l.bytes>>20)
	default:
		bound = fmt.Sprintf("%d pages of at most %d Nodes", l.pages, PageSize)
	}
	return fmt.Errorf("listing nodes: %w after %s (%d pages, %d Nodes, %d MiB read; the server still gives a continue token): "+
		"no cluster has that many; is this a Kubernetes API server? Select fewer nodes with -l if it is one", ErrListTooLong, bound, r.pages, r.nodes, r.bytes>>20)
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

// Format is how a view is printed for people: Wide adds columns (and, to
// the cluster view, each node where a plugin is not ready); NoHeaders
// leaves out the tables' headers and the cluster's count of nodes, for
// scripts (kubectl's --no-headers).
type Format struct {
	Wide, NoHeaders bool
}

// taintsCell is a node's startup taints in a table, "-" for none, cut
// as a reason is: anyone who may update the Node writes them.
func taintsCell(ts []string) string {
	if len(ts) == 0 {
		return "-"
	}
	return printer.ShortCell(strings.Join(ts, ","), nodecond.MaxMessage)
}

// WriteCluster prints v for people: per plugin, on how many nodes it is
// ready; wide adds each node where it is not, and why (the message cut at
// nodecond.MaxMessage bytes: plugd's are no longer, and others' are not
// bounded by the API).
func WriteCluster(w io.Writer, v nodecond.ClusterView, f Format, now time.Time) error {
	if len(v.Plugins) == 0 {
		_, err := fmt.Fprintf(w, "no node has a condition of plugd's (%d nodes): no plugd expects a plugin, or none is connected to Kubernetes\n", v.Nodes)
		return err
	}
	t := printer.Table{Header: []string{"TYPE", "NAME", "READY", "EXPECTED", "CONDITION"}, NoHeader: f.NoHeaders}
	for _, p := range v.Plugins {
		t.Rows = append(t.Rows, []string{printer.Cell(p.Type), printer.Cell(p.Name), strconv.Itoa(p.Ready), strconv.Itoa(p.Expected), printer.Cell(p.Condition)})
	}
	if err := t.Write(w, 0); err != nil {
		return err
	}
	if !f.NoHeaders {
		from := ""
		if v.Source == SourceSummary {
			from = fmt.Sprintf(", as plugd caretaker counted them %s ago (--source=nodes reads every Node now)", printer.Since(v.AsOf, now))
		}
		if _, err := fmt.Fprintf(w, "%d nodes, %d with plugd's conditions%s\n", v.Nodes, v.NodesWithPlugd, from); err != nil {
			return err
		}
	}
	if !f.Wide {
		return nil
	}
	for _, p := range v.Plugins {
		if len(p.NotReady) == 0 {
			continue
		}
		fmt.Fprintf(w, "\n%s %s: not ready on %d of %d nodes\n", printer.Cell(p.Type), printer.Cell(p.Name), len(p.NotReady), p.Expected)
		nt := printer.Table{Header: []string{"NODE", "STATUS", "REASON", "SINCE", "TAINTS", "MESSAGE"}, NoHeader: f.NoHeaders}
		for _, n := range p.NotReady {
			nt.Rows = append(nt.Rows, []string{printer.Cell(n.Node), printer.Cell(n.Status), printer.ShortCell(n.Reason, maxReason), printer.Since(n.Since, now),
				taintsCell(n.Taints), printer.ShortCell(n.Message, nodecond.MaxMessage)})
		}
		if err := nt.Write(w, 0); err != nil {
			return err
		}
	}
	return nil
}
