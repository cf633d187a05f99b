package cli

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"

	"github.com/plugd/plugd/internal/kubeconfig"
	"github.com/plugd/plugd/internal/nodecond"
)

var clusterOutputs = []string{"table", "wide", "json", "yaml"}

func (a *app) clusterCommand() *cobra.Command {
	var kubeconfig, kubeContext, output string
	cmd := &cobra.Command{
		Use:   "cluster",
		Short: "Show, from the Kubernetes API, on how many nodes each expected plugin is ready",
		Long: `Read the Node objects from the Kubernetes API server (not plugd) and print, for
every plugin some plugd expects (its expect list), on how many nodes it is
ready out of the nodes that expect it, from the Node conditions plugd keeps.
-o wide also lists each node where it is not ready, with the condition's
reason and message; -o json and -o yaml print it all.

The API server is found as kubectl finds it: --kubeconfig, else $KUBECONFIG,
else ~/.kube/config, else the pod's in-cluster configuration; --context picks
a context. Reading needs permission to list nodes.`,
		Example: `  plugctl cluster
  plugctl cluster -o wide --context prod
  plugctl cluster -o json | jq '.plugins[] | select(.ready < .expected)'`,
		Args: noArgs,
		RunE: runE(func(cmd *cobra.Command, _ []string) error {
			var err error
			if output, err = oneOf("--output", output, clusterOutputs...); err != nil {
				return err
			}
			return a.cluster(cmd.Context(), kubeconfig, kubeContext, output)
		}),
	}
	f := cmd.Flags()
	f.StringVar(&kubeconfig, "kubeconfig", "", "kubeconfig file (default $KUBECONFIG, else ~/.kube/config, else in-cluster)")
	f.StringVar(&kubeContext, "context", "", "the kubeconfig context to use (default its current context)")
	f.StringVarP(&output, "output", "o", "table", "output format: "+strings.Join(clusterOutputs, ", "))
	completeFlag(cmd, "output", fixedCompletions(clusterOutputs...))
	return cmd
}

func (a *app) cluster(ctx context.Context, kubeconfigPath, kubeContext, output string) error {
	rc, err := kubeconfig.RESTConfig(kubeconfig.ClientConfig(kubeconfigPath, kubeContext))
	if err != nil {
		return fmt.Errorf("cannot find the Kubernetes API server: %w; give --kubeconfig (and --context)", err)
	}
	rc.UserAgent = "plugctl/" + cliVersion()
	rc.AcceptContentTypes = "application/vnd.kubernetes.protobuf,application/json" // Nodes are large
	client, err := corev1client.NewForConfig(rc)
	if err != nil {
		return err
	}
	ctx, cancel := a.requestContext(ctx)
	defer cancel()
	// From the API server's cache (resourceVersion 0): one cheap read, however
	// many nodes there are.
	nodes, err := client.Nodes().List(ctx, metav1.ListOptions{ResourceVersion: "0"})
	if err != nil {
		if ctx.Err() != nil {
			return fmt.Errorf("the API server at %s did not answer within %s; --timeout waits longer", rc.Host, a.timeout)
		}
		return fmt.Errorf("listing nodes at %s: %w", rc.Host, err)
	}
	v := nodecond.ClusterView{Nodes: len(nodes.Items), Plugins: nodecond.Summarize(nodes.Items)}
	for _, n := range nodes.Items {
		if slices.ContainsFunc(n.Status.Conditions, nodecond.Owned) {
			v.NodesWithPlugd++
		}
	}
	switch output {
	case "json":
		return writeJSON(a.stdout, v)
	case "yaml":
		return writeYAML(a.stdout, v)
	}
	return writeCluster(a.stdout, v, output == "wide", time.Now())
}

// writeCluster prints v for people.
func writeCluster(w io.Writer, v nodecond.ClusterView, wide bool, now time.Time) error {
	if len(v.Plugins) == 0 {
		_, err := fmt.Fprintf(w, "no node has a condition of plugd's (%d nodes): no plugd expects a plugin, or none is connected to Kubernetes\n", v.Nodes)
		return err
	}
	t := table{header: []string{"TYPE", "NAME", "READY", "EXPECTED", "CONDITION"}}
	for _, p := range v.Plugins {
		t.rows = append(t.rows, []string{cell(p.Type), cell(p.Name), strconv.Itoa(p.Ready), strconv.Itoa(p.Expected), cell(p.Condition)})
	}
	if err := t.write(w, 0); err != nil {
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
		fmt.Fprintf(w, "\n%s %s: not ready on %d of %d nodes\n", cell(p.Type), cell(p.Name), len(p.NotReady), p.Expected)
		nt := table{header: []string{"NODE", "STATUS", "REASON", "SINCE", "MESSAGE"}}
		for _, n := range p.NotReady {
			nt.rows = append(nt.rows, []string{cell(n.Node), cell(n.Status), cell(n.Reason), since(n.Since, now), cell(n.Message)})
		}
		if err := nt.write(w, 0); err != nil {
			return err
		}
	}
	return nil
}
