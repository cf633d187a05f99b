package conformance

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/kubernetes"

	"github.com/plugd/plugd/internal/kubeconfig"
)

// checkResourceSlices waits, until the kit's timeout, for the DRA driver's
// ResourceSlices on the API server --kubeconfig names to be what the
// kubelet and the scheduler can use, and records what it saw last.
func (r *runner) checkResourceSlices(ctx context.Context, info PluginInfo) {
	if r.cfg.Kubeconfig == "" {
		r.skip(checkDRASlices, "give --kubeconfig and --node-name, the API server the driver publishes to and its node, to run this check")
		return
	}
	began := time.Now()
	client, err := kubeClient(r.cfg.Kubeconfig)
	if err != nil {
		r.fail(checkDRASlices, err.Error(), began)
		return
	}
	wctx, cancel := withDeadline(ctx, r.cfg.Timeout, "the driver's ResourceSlices to name it and node "+r.cfg.NodeName+", each pool complete")
	defer cancel()
	seen, err := waitSlices(wctx, client, info.Name, r.cfg.NodeName)
	if err != nil && wctx.Err() != nil {
		err = fmt.Errorf("%w; %w", context.Cause(wctx), err)
		if others := otherDrivers(ctx, client, info.Name, r.cfg.NodeName); others != "" {
			err = fmt.Errorf("%w; the slices of node %s name %s: does the driver publish under another name than it registered?", err, r.cfg.NodeName, others)
		}
	}
	r.check(checkDRASlices, err, seen, began)
}

// kubeClient is a client of the API server the kubeconfig file at path
// names, read as plugd reads every kubeconfig: with a bound on the file and
// on the server's answers.
func kubeClient(path string) (kubernetes.Interface, error) {
	cfg, err := kubeconfig.RESTConfig(kubeconfig.ClientConfig(path, ""))
	if err != nil {
		return nil, fmt.Errorf("--kubeconfig %s: %w", path, err)
	}
	c, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("--kubeconfig %s: %w", path, err)
	}
	return c, nil
}

// waitSlices lists the ResourceSlices of driver, judges them, and while
// they are not right watches them for the next change, until ctx ends. It
// returns what it saw last, and what is wrong with it.
func waitSlices(ctx context.Context, client kubernetes.Interface, driver, node string) (string, error) {
	sel := metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector(resourceapi.ResourceSliceSelectorDriver, driver).String()}
	for {
		list, err := client.ResourceV1().ResourceSlices().List(ctx, sel)
		if err != nil {
			return "", fmt.Errorf("listing the ResourceSlices of %s: %w", driver, err)
		}
		seen, err := judgeSlices(list.Items, driver, node)
		if err == nil {
			return seen, nil
		}
		watch := sel
		watch.ResourceVersion = list.ResourceVersion
		w, werr := client.ResourceV1().ResourceSlices().Watch(ctx, watch)
		if werr != nil {
			return seen, err
		}
		select {
		case <-w.ResultChan():
		case <-ctx.Done():
		}
		w.Stop()
		if ctx.Err() != nil {
			return seen, err
		}
	}
}

// judgeSlices says what is wrong with the ResourceSlices of driver that the
// API server cannot see: a node-local slice for another node than the
// driver's (the kubelet wipes a node's slices by spec.nodeName and
// spec.driver, and never those), a pool whose newest generation lacks
// slices (the scheduler allocates nothing from an incomplete pool). It
// also says what it saw.
func judgeSlices(items []resourceapi.ResourceSlice, driver, node string) (string, error) {
	if len(items) == 0 {
		return "no ResourceSlice", fmt.Errorf("no ResourceSlice names driver %s", driver)
	}
	type pool struct{ generation, count, want int64 }
	pools := map[string]*pool{}
	var problems []string
	devices := 0
	for _, s := range items {
		devices += len(s.Spec.Devices)
		if n := s.Spec.NodeName; n != nil && *n != node {
			problems = append(problems, fmt.Sprintf("ResourceSlice %s is for node %q, not %s, the driver's node", s.Name, quote(*n), node))
		}
		p := pools[s.Spec.Pool.Name]
		switch {
		case p == nil || s.Spec.Pool.Generation > p.generation:
			pools[s.Spec.Pool.Name] = &pool{generation: s.Spec.Pool.Generation, count: 1, want: s.Spec.Pool.ResourceSliceCount}
		case s.Spec.Pool.Generation == p.generation:
			p.count++
			p.want = max(p.want, s.Spec.Pool.ResourceSliceCount)
		}
	}
	names := slices.Sorted(maps.Keys(pools))
	for _, n := range names {
		if p := pools[n]; p.count != p.want {
			problems = append(problems, fmt.Sprintf("pool %q is incomplete: generation %d has %d of the %d slices its resourceSliceCount says", quote(n), p.generation, p.count, p.want))
		}
	}
	seen := fmt.Sprintf("%d ResourceSlice(s) of %s, %d device(s), pools %q, complete", len(items), driver, devices, names)
	if len(problems) > 0 {
		return strings.Join(problems, "; "), errors.New(strings.Join(problems, "; "))
	}
	return seen, nil
}

// otherDrivers names the drivers of the ResourceSlices of node other than
// driver, for a failure's message; "" when there are none or they cannot
// be read.
func otherDrivers(ctx context.Context, client kubernetes.Interface, driver, node string) string {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	list, err := client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector(resourceapi.ResourceSliceSelectorNodeName, node).String()})
	if err != nil {
		return ""
	}
	var others []string
	for _, s := range list.Items {
		if s.Spec.Driver != driver && !slices.Contains(others, s.Spec.Driver) {
			others = append(others, s.Spec.Driver)
		}
	}
	if len(others) == 0 {
		return ""
	}
	return fmt.Sprintf("%q", others)
}
