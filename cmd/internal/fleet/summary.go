package fleet

import (
	"context"
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/rest"

	"github.com/plugd/plugd/internal/nodecond"
)

// MaxSummaryAge is how old plugd caretaker's summary may be and still be
// read: it writes one at least every minute, so an older one is left by a
// caretaker that stopped (or cannot write).
const MaxSummaryAge = 2 * time.Minute

// Where a cluster view is counted from (ClusterOptions.Source).
const (
	// SourceAuto reads plugd caretaker's summary where it is usable, and
	// every Node where it is not.
	SourceAuto = "auto"
	// SourceSummary reads the summary only: no summary is an error.
	SourceSummary = "summary"
	// SourceNodes reads every Node, now.
	SourceNodes = "nodes"
)

// ClusterOptions say what ReadCluster counts, and from where.
type ClusterOptions struct {
	// Selector selects the Nodes (empty: all). The summary counts all
	// Nodes: with a selector, the Nodes are read.
	Selector string
	// Namespace is where plugd caretaker keeps its summary.
	Namespace string
	// Source is SourceAuto (also when empty), SourceSummary or SourceNodes.
	Source string
	// Lists says the answer must hold each node where a plugin is not
	// ready (-o wide, json): a summary too large to hold them (Complete
	// false) is then not usable.
	Lists bool
}

// ReadCluster is the cluster view from plugd caretaker's summary, one small
// object, where it is usable (SourceAuto, SourceSummary), or counted from
// every Node (Cluster). The view's Source and AsOf say which, and how old.
// fallback says why the Nodes were read when the summary was asked for
// and found unusable (empty when it was used, or when there is none:
// no caretaker writes one).
func ReadCluster(ctx context.Context, client rest.Interface, o ClusterOptions) (v nodecond.ClusterView, fallback string, err error) {
	if o.Source == SourceSummary || o.Source != SourceNodes && o.Selector == "" {
		s, err := readSummary(ctx, client, o.Namespace)
		why := summaryUnusable(s, err, o, time.Now())
		switch {
		case why == nil:
			v := s.View
			v.Source, v.AsOf = SourceSummary, s.Time
			return v, "", nil
		case o.Source == SourceSummary:
			return nodecond.ClusterView{}, "", why
		case !apierrors.IsNotFound(err):
			fallback = why.Error()
		}
	}
	v, err = Cluster(ctx, client, o.Selector, 0)
	return v, fallback, err
}

// readSummary reads plugd caretaker's summary in namespace.
func readSummary(ctx context.Context, client rest.Interface, namespace string) (nodecond.Summary, error) {
	var cm corev1.ConfigMap
	err := client.Get().Namespace(namespace).Resource("configmaps").Name(nodecond.SummaryName).Do(ctx).Into(&cm)
	if err != nil {
		return nodecond.Summary{}, err
	}
	return nodecond.DecodeSummary([]byte(cm.Data[nodecond.SummaryKey]))
}

// errNoSummary wraps the reasons a summary is not usable.
var errNoSummary = errors.New("no usable summary of plugd caretaker's")

// summaryUnusable says why s (read with err) cannot answer o at now, or
// nil if it can.
func summaryUnusable(s nodecond.Summary, err error, o ClusterOptions, now time.Time) error {
	where := fmt.Sprintf("the ConfigMap %s/%s", o.Namespace, nodecond.SummaryName)
	switch {
	case o.Selector != "":
		return fmt.Errorf("%w: it counts every node, and -l selects some", errNoSummary)
	case apierrors.IsNotFound(err):
		return fmt.Errorf("%w: %s does not exist (is plugd caretaker running there, with --summary-namespace? -n names plugd's namespace)", errNoSummary, where)
	case apierrors.IsForbidden(err):
		return fmt.Errorf("%w: reading %s is forbidden (get configmaps there): %v", errNoSummary, where, err)
	case err != nil:
		return fmt.Errorf("%w: reading %s: %v", errNoSummary, where, err)
	case now.Sub(s.Time) > MaxSummaryAge:
		return fmt.Errorf("%w: %s was counted at %s, %s ago: plugd caretaker writes it every minute; is it running?", errNoSummary, where,
			s.Time.UTC().Format(time.RFC3339), now.Sub(s.Time).Round(time.Second))
	case o.Lists && !s.Complete:
		return fmt.Errorf("%w: %s has the counts only (the nodes where plugins are not ready did not fit), and this output lists them", errNoSummary, where)
	}
	return nil
}
