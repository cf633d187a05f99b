package caretaker

import (
	"context"
	"encoding/json"
	"fmt"
	"reflect"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/plugd/plugd/internal/nodecond"
)

// The fleet summary (nodecond.Summary): the caretaker counts the cluster
// view from the Nodes its informer holds (plugd's conditions and their
// owner, all a census reads), and writes it to the ConfigMap
// nodecond.SummaryName at a bounded rate, so that kubectl plugd cluster
// reads one object instead of every Node.
const (
	// summaryEvery is how often the caretaker looks whether the view
	// changed: at most one write per summaryEvery, whatever the churn.
	summaryEvery = 10 * time.Second
	// summaryRefresh is how often it writes the view even when nothing
	// changed: a reader takes a summary older than twice that
	// (fleet.MaxSummaryAge) as left by a caretaker that stopped. The census
	// is counted again then, too: a condition plugd no longer writes
	// becomes not maintained without any event.
	summaryRefresh = time.Minute
	// summaryManager is the field manager of the caretaker's writes of
	// the summary.
	summaryManager = "plugd-caretaker"
)

// lastSummary is what the caretaker last wrote, and when.
type lastSummary struct {
	at   time.Time
	view nodecond.ClusterView
}

// summarize writes the summary every summaryEvery when the Nodes changed,
// and every summaryRefresh regardless, until ctx ends.
func (c *Caretaker) summarize(ctx context.Context) {
	t := c.clock.NewTicker(summaryEvery)
	defer t.Stop()
	var last *lastSummary
	var trouble string
	for {
		next, err := c.writeSummary(ctx, last)
		switch {
		case ctx.Err() != nil:
			return
		case err != nil:
			if msg := summaryTrouble(c.summaryNamespace, err); msg != trouble {
				c.log.Warn("caretaker: cannot write the fleet summary; kubectl plugd cluster reads every Node meanwhile", "err", msg)
				trouble = msg
			}
			c.dirty.Store(true) // try again at the next tick
		default:
			if trouble != "" {
				c.log.Info("caretaker: writing the fleet summary again")
				trouble = ""
			}
			last = next
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C():
		}
	}
}

// writeSummary counts the view and writes it, unless nothing changed since
// last (nil: nothing written yet) and the last write is recent. It returns
// what is written now (last when nothing was).
func (c *Caretaker) writeSummary(ctx context.Context, last *lastSummary) (*lastSummary, error) {
	now := c.clock.Now()
	recent := last != nil && now.Sub(last.at) < summaryRefresh
	if !c.dirty.Swap(false) && recent {
		return last, nil
	}
	census := nodecond.Census{Now: now}
	for _, obj := range c.inf.GetStore().List() {
		if n, ok := obj.(*corev1.Node); ok {
			census.Add(n)
		}
	}
	v := census.View()
	if recent && reflect.DeepEqual(v, last.view) {
		return last, nil
	}
	b, err := summaryApply(c.summaryNamespace, nodecond.Summary{Time: now, View: v})
	if err != nil {
		return last, err
	}
	ctx, cancel := context.WithTimeoutCause(ctx, requestTimeout, fmt.Errorf("the API server did not answer within %s", requestTimeout))
	defer cancel()
	force := true
	_, err = c.summaries.Patch(ctx, nodecond.SummaryName, types.ApplyPatchType, b, metav1.PatchOptions{FieldManager: summaryManager, Force: &force})
	if err != nil {
		if ctx.Err() != nil {
			err = fmt.Errorf("%w (%w)", err, context.Cause(ctx))
		}
		return last, err
	}
	return &lastSummary{at: now, view: v}, nil
}

// summaryApply is the server-side apply of the summary's ConfigMap in
// namespace: one request creates or replaces it.
func summaryApply(namespace string, s nodecond.Summary) ([]byte, error) {
	data, err := nodecond.EncodeSummary(s)
	if err != nil {
		return nil, err
	}
	return json.Marshal(map[string]any{
		"apiVersion": "v1",
		"kind":       "ConfigMap",
		"metadata": map[string]any{
			"name": nodecond.SummaryName, "namespace": namespace,
			"labels": map[string]string{"app.kubernetes.io/name": "plugd-caretaker", "app.kubernetes.io/component": "fleet-summary"},
		},
		"data": map[string]string{nodecond.SummaryKey: string(data)},
	})
}

// summaryTrouble says why the summary cannot be written, and what to do,
// in words that stay the same while the cause does.
func summaryTrouble(namespace string, err error) string {
	if apierrors.IsForbidden(err) {
		return fmt.Sprintf("cannot write the fleet summary: the caretaker lacks create and patch of the ConfigMap %s/%s (the Role plugd-caretaker in deploy/kubernetes grants them; is it bound to the caretaker's ServiceAccount?)",
			namespace, nodecond.SummaryName)
	}
	return explain("write the fleet summary (the ConfigMap "+namespace+"/"+nodecond.SummaryName+")", "", err)
}
