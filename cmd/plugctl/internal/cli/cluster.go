package cli

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"

	"github.com/plugd/plugd/cmd/internal/fleet"
	"github.com/plugd/plugd/cmd/internal/printer"
	"github.com/plugd/plugd/cmd/internal/version"
	"github.com/plugd/plugd/internal/kubeconfig"
	"github.com/plugd/plugd/internal/nodecond"
)

var clusterOutputs = []string{"table", "wide", "json", "yaml"}

func (a *app) clusterCommand() *cobra.Command {
	var kubeconfig, kubeContext, selector, output string
	var staleAfter time.Duration
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
a context; -l counts only the nodes with the labels it selects. Reading
needs permission to list nodes; they are read 500 at a time, so that a
cluster of 15,000 nodes takes seconds and little memory. A condition plugd
has not written for 11 minutes (--stale-after; plugd rewrites its
conditions every 5 at least) is not ready, as Unknown/NotMaintained: its
plugd no longer runs. kubectl plugd cluster is the same command as a
kubectl plugin.`,
		Example: `  plugctl cluster
  plugctl cluster -o wide --context prod
  plugctl cluster -o json | jq '.plugins[] | select(.ready < .expected)'`,
		Args: noArgs,
		RunE: runE(func(cmd *cobra.Command, _ []string) error {
			var err error
			if output, err = oneOf("--output", output, clusterOutputs...); err != nil {
				return err
			}
			return a.cluster(cmd.Context(), kubeconfig, kubeContext, selector, output, staleAfter)
		}),
	}
	f := cmd.Flags()
	f.StringVar(&kubeconfig, "kubeconfig", "", "kubeconfig file (default $KUBECONFIG, else ~/.kube/config, else in-cluster)")
	f.StringVar(&kubeContext, "context", "", "the kubeconfig context to use (default its current context)")
	f.StringVarP(&selector, "selector", "l", "", "only the nodes with these labels, e.g. -l node-role.kubernetes.io/worker")
	f.StringVarP(&output, "output", "o", "table", "output format: "+strings.Join(clusterOutputs, ", "))
	f.DurationVar(&staleAfter, "stale-after", nodecond.MaxHeartbeatAge, "a condition plugd has not written for this long is not maintained: not ready, whatever it says")
	completeFlag(cmd, "output", fixedCompletions(clusterOutputs...))
	return cmd
}

func (a *app) cluster(ctx context.Context, kubeconfigPath, kubeContext, selector, output string, staleAfter time.Duration) error {
	rc, err := kubeconfig.RESTConfig(kubeconfig.ClientConfig(kubeconfigPath, kubeContext))
	if err != nil {
		return fmt.Errorf("cannot find the Kubernetes API server: %w; give --kubeconfig (and --context)", err)
	}
	rc.UserAgent = "plugctl/" + version.String()
	rc.ContentType = "application/vnd.kubernetes.protobuf" // Nodes are large
	rc.AcceptContentTypes = "application/vnd.kubernetes.protobuf,application/json"
	client, err := corev1client.NewForConfig(rc)
	if err != nil {
		return err
	}
	ctx, cancel := a.requestContext(ctx)
	defer cancel()
	v, err := fleet.Cluster(ctx, client.RESTClient(), selector, staleAfter)
	if err != nil {
		if ctx.Err() != nil {
			return fmt.Errorf("the API server at %s did not answer within %s; --timeout waits longer", rc.Host, a.timeout)
		}
		return fmt.Errorf("%s: %w", rc.Host, err)
	}
	switch output {
	case "json":
		return printer.JSON(a.stdout, v)
	case "yaml":
		return printer.YAML(a.stdout, v)
	}
	return fleet.WriteCluster(a.stdout, v, fleet.Format{Wide: output == "wide"}, time.Now())
}
