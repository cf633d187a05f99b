package cli

import (
	"bytes"
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"

	"github.com/plugd/plugd/api"
	"github.com/plugd/plugd/cmd/internal/fleet"
	"github.com/plugd/plugd/cmd/internal/printer"
)

func (a *app) clusterCommand() *cobra.Command {
	var selector, output, source string
	var noHeaders bool
	cmd := &cobra.Command{
		Use:   "cluster [-l SELECTOR] [-o table|wide|json|yaml|jsonpath=TEMPLATE] [--no-headers] [--source auto|summary|nodes]",
		Short: "Show on how many nodes each expected plugin is ready",
		Long: `Show, for every plugin that plugd expects on some node, on how many nodes it is
ready out of the nodes that expect it, read from the Node conditions plugd
keeps (one per expected plugin).

Where plugd caretaker keeps its summary of the cluster (the ConfigMap
plugd-fleet of plugd's namespace, -n, default plugd; the chart's caretaker
does), that one object is read, and the answer says how old it is (at most
2 minutes: the caretaker writes it within 10 seconds of a change, and every
minute). Otherwise, and with -l, the Nodes are read, 500 at a time, so that
a large cluster costs a few requests and little memory; --source=nodes
always reads them. Reading needs get on that ConfigMap, or list on nodes.`,
		Example: `  # Every expected plugin, and on how many nodes it is ready
  kubectl plugd cluster

  # Also list the nodes where a plugin is not ready, and why
  kubectl plugd cluster -o wide

  # Only the GPU nodes, in another cluster
  kubectl plugd cluster -l nvidia.com/gpu.present=true --context prod

  # The plugins not ready everywhere, for a script
  kubectl plugd cluster -o json | jq '.plugins[] | select(.ready < .expected)'

  # Each plugin's name and on how many nodes it is ready, without jq
  kubectl plugd cluster -o jsonpath='{range .plugins[*]}{.name}{"\t"}{.ready}{"\n"}{end}'`,
		Args: cobra.NoArgs,
		RunE: runE(func(cmd *cobra.Command, _ []string) error {
			out, err := parseOutput(output, noHeaders)
			if err != nil {
				return err
			}
			if source, err = oneOf("--source", source, fleet.SourceAuto, fleet.SourceSummary, fleet.SourceNodes); err != nil {
				return err
			}
			rc, err := a.restConfig()
			if err != nil {
				return err
			}
			client, err := corev1client.NewForConfig(rc)
			if err != nil {
				return err
			}
			v, fallback, err := fleet.ReadCluster(cmd.Context(), client.RESTClient(), fleet.ClusterOptions{
				Selector: selector, Namespace: a.namespace(), Source: source, Lists: out.format != "table"})
			if err != nil {
				return fmt.Errorf("%s: %w", rc.Host, err)
			}
			if fallback != "" {
				fmt.Fprintf(a.stderr, "kubectl plugd cluster: %s; read every Node instead\n", fallback)
			}
			if done, err := out.machine(a.stdout, v); done {
				return err
			}
			return fleet.WriteCluster(a.stdout, v, out.table(), time.Now())
		}),
	}
	cmd.Flags().StringVarP(&selector, "selector", "l", "", "Selector (label query) to filter nodes on, e.g. -l key1=value1,key2=value2")
	cmd.Flags().StringVar(&source, "source", fleet.SourceAuto, "where to count from: auto (plugd caretaker's summary if there is a recent one, else the Nodes), summary (only it), nodes (every Node, now)")
	viewFlags(cmd, &output, &noHeaders)
	return cmd
}

func (a *app) nodeCommand() *cobra.Command {
	var output string
	var watch, noHeaders bool
	cmd := &cobra.Command{
		Use:   "node NODE [-o table|wide|json|yaml|jsonpath=TEMPLATE] [--no-headers] [-w]",
		Short: "Show one node's expected plugins, and what the kubelet shows of them",
		Long: `Show one node's expected plugins: plugd's condition for each (ready or not, the
reason, since when), then what the kubelet wrote of the node's plugins: the
CSI drivers in its CSINode, the device plugins' resources in its capacity,
and the DRA drivers with ResourceSlices for it; then the Node's taints (but
Kubernetes' own) and who last wrote them (its managedFields).

Where plugd manages a startup taint for an expected plugin, TAINT gives its
state as plugd on the node keeps it (plugctl list's), asked through the API
server's proxy to plugd's pod (found in -n, by app.kubernetes.io/name=plugd):
Present, Removed, Held by the writer that put it back after the startup
window, Restored, Absent; -o wide adds the taint, since when, and how often
plugd removed it again, and by whose re-add.

With --watch, print the view again each time the Node changes.`,
		Example: `  # The plugins of node worker-1
  kubectl plugd node worker-1

  # With each condition's message, and followed as it changes
  kubectl plugd node worker-1 -o wide --watch`,
		Args: exactlyOneNode,
		RunE: runE(func(cmd *cobra.Command, args []string) error {
			out, err := parseOutput(output, noHeaders)
			if err != nil {
				return err
			}
			c, err := a.clients()
			if err != nil {
				return err
			}
			render := func(v fleet.NodeView) ([]byte, error) {
				var b bytes.Buffer
				done, err := out.machine(&b, v)
				if !done {
					err = fleet.WriteNode(&b, v, out.table(), time.Now())
				}
				return b.Bytes(), err
			}
			if !watch {
				v, err := fleet.ReadNode(cmd.Context(), c, args[0], fleet.DoctorOptions{Namespace: a.namespace()})
				if err != nil {
					return err
				}
				b, err := render(v)
				if err != nil {
					return err
				}
				_, err = a.stdout.Write(b)
				return err
			}
			var last []byte
			return fleet.WatchNode(cmd.Context(), c, args[0], fleet.DoctorOptions{Namespace: a.namespace()}, func(v fleet.NodeView) error {
				b, err := render(v)
				if err != nil || bytes.Equal(b, last) {
					return err // the kubelet's heartbeats change nothing shown
				}
				if last != nil && out.format != "json" && out.format != "jsonpath" {
					fmt.Fprintln(a.stdout)
				}
				last = b
				_, err = a.stdout.Write(b)
				return err
			})
		}),
	}
	viewFlags(cmd, &output, &noHeaders)
	cmd.Flags().BoolVarP(&watch, "watch", "w", false, "After printing the view, watch the Node and print it again when it changes.")
	return cmd
}

var doctorOutputs = []string{"text", "json", "yaml"}

func (a *app) doctorCommand() *cobra.Command {
	var output, minSeverity string
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:   "doctor NODE [-o text|json|yaml]",
		Short: "Find what is wrong with a node's plugins, and say what to do",
		Long: `Look at a node through the API and print what is wrong there, most serious
first, each finding with its evidence and a remedy: the kubelet's Ready
condition; each expected plugin that is not ready (plugd's condition, its
reason and message); whether plugd's pod runs on the node and is ready; the
Warning events plugd recorded about the node; and plugd's own report (what
plugctl doctor prints on the node: stale sockets, refused versions, sockets
under another kubelet root...), asked through the API server's proxy to
plugd's pod where that reaches it.

plugd's pod is looked for in the namespace -n (default plugd), by the label
app.kubernetes.io/name=plugd. Exit status 4 when something at warning or
above is found among the findings --min-severity shows; 0 otherwise.`,
		Example: `  # What is wrong on node worker-1
  kubectl plugd doctor worker-1

  # Only the errors, as JSON
  kubectl plugd doctor worker-1 --min-severity error -o json`,
		Args: exactlyOneNode,
		RunE: runE(func(cmd *cobra.Command, args []string) error {
			var err error
			if output, err = oneOf("--output", output, doctorOutputs...); err != nil {
				return err
			}
			if minSeverity, err = oneOf("--min-severity", minSeverity, api.Severities...); err != nil {
				return err
			}
			c, err := a.clients()
			if err != nil {
				return err
			}
			fs, err := fleet.Doctor(cmd.Context(), c, args[0], fleet.DoctorOptions{Namespace: a.namespace(), ReportTimeout: timeout})
			if err != nil {
				return err
			}
			shown := printer.AtLeast(fs, minSeverity)
			switch output {
			case "json":
				err = printer.JSON(a.stdout, api.FindingList{Findings: shown})
			case "yaml":
				err = printer.YAML(a.stdout, api.FindingList{Findings: shown})
			default:
				err = printer.FindingsAtLeast(a.stdout, "kubectl plugd doctor", fs, minSeverity)
			}
			if err != nil {
				return err
			}
			if printer.Serious(shown) {
				return &exitError{code: ExitFindings, err: fmt.Errorf("found %s on node %s", printer.CountFindings(shown), args[0])}
			}
			return nil
		}),
	}
	cmd.Flags().StringVarP(&output, "output", "o", "text", "Output format. One of: ("+strings.Join(doctorOutputs, ", ")+").")
	cmd.Flags().StringVar(&minSeverity, "min-severity", api.SeverityInfo, "Print findings of this severity and above. One of: ("+strings.Join(api.Severities, ", ")+").")
	cmd.Flags().DurationVar(&timeout, "report-timeout", 10*time.Second, "How long to wait for plugd's own report through the API server's pod proxy.")
	return cmd
}

// clients are the API groups the node view and the doctor read.
func (a *app) clients() (fleet.Clients, error) {
	rc, err := a.restConfig()
	if err != nil {
		return fleet.Clients{}, err
	}
	return fleet.NewClients(rc)
}

// viewFlags are the output flags of a view, as kubectl's: -o and
// --no-headers.
func viewFlags(cmd *cobra.Command, output *string, noHeaders *bool) {
	cmd.Flags().StringVarP(output, "output", "o", "table", "Output format. One of: ("+strings.Join(viewOutputs, ", ")+"). See JSONPath template [https://kubernetes.io/docs/reference/kubectl/jsonpath/].")
	cmd.Flags().BoolVar(noHeaders, "no-headers", false, "When using the table or wide output format, don't print headers (nor the cluster view's count of nodes).")
}
