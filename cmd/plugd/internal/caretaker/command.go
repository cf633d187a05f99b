package caretaker

import (
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/klog/v2"

	"github.com/plugd/plugd/internal/nodecond"
)

// Command is plugd's caretaker mode: plugd caretaker.
func Command() *cobra.Command {
	var cfg Config
	var format, level string
	cmd := &cobra.Command{
		Use:   "caretaker",
		Short: "Mark the Node conditions that plugd no longer maintains Unknown (one per cluster)",
		Long: `plugd caretaker watches every Node, plugd's pods and every CSINode, and marks
Unknown each condition plugd wrote and no longer maintains:

  - reason PlugdNotRunning: plugd's pod on the node (--plugd-namespace,
    --plugd-selector) has not been Ready, or is gone, for --pod-grace, and
    plugd has not written the condition since; or a CSI driver's condition
    says True while the kubelet has dropped the driver from the node's
    CSINode for --csinode-grace, and plugd has not written it since;
  - reason NotMaintained: its heartbeat (lastHeartbeatTime) has not changed
    for --stale-after, on the caretaker's own clock (plugd heartbeats its
    conditions at least every 5 minutes): the last resort where plugd runs
    outside a pod.

Run one per cluster (the chart's Deployment plugd-caretaker); it needs get,
list and watch on nodes, patch on nodes/status, list and watch on csinodes
and on pods in plugd's namespace, and no registry directory.
With --summary-namespace it also keeps the cluster view (plugd's
conditions counted across the Nodes it watches) in the ConfigMap
plugd-fleet there, written at most every 10 seconds and at least every
minute (it needs get, create and patch of that ConfigMap), which kubectl
plugd cluster reads in one request instead of every Node.
SIGTERM or SIGINT stops it.`,
		Args:          cobra.NoArgs,
		SilenceUsage:  true,
		SilenceErrors: true,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var lv slog.Level
			if err := lv.UnmarshalText([]byte(level)); err != nil {
				return fmt.Errorf("--log-level %q: use debug, info, warn or error", level)
			}
			opts := &slog.HandlerOptions{Level: lv}
			var h slog.Handler
			switch format {
			case "text":
				h = slog.NewTextHandler(os.Stderr, opts)
			case "json":
				h = slog.NewJSONHandler(os.Stderr, opts)
			default:
				return fmt.Errorf("--log-format %q: use text or json", format)
			}
			if err := checkFlags(&cfg); err != nil {
				return err
			}
			cfg.Logger = slog.New(h)
			// client-go's own log repeats, at every retry, what the
			// caretaker says once per change: shown at debug level only.
			klog.SetSlogLogger(slog.New(slog.DiscardHandler))
			if lv <= slog.LevelDebug {
				klog.SetSlogLogger(slog.New(h).With("source", "client-go"))
			}
			c, err := New(cfg)
			if err != nil {
				return err
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGINT, syscall.SIGTERM)
			defer stop()
			return c.Run(ctx)
		},
	}
	f := cmd.Flags()
	f.StringVar(&cfg.Kubeconfig, "kubeconfig", "", "kubeconfig file to reach the Kubernetes API with (default: in-cluster)")
	f.DurationVar(&cfg.StaleAfter, "stale-after", nodecond.MaxHeartbeatAge, "mark a condition of plugd's whose heartbeat has not changed for this long (the caretaker's clock); shorter than plugd's heartbeat interval (kubernetes.heartbeatInterval), it marks conditions plugd maintains: for tests")
	f.StringVar(&cfg.PlugdNamespace, "plugd-namespace", "", "the namespace of plugd's DaemonSet pods")
	f.StringVar(&cfg.PlugdSelector, "plugd-selector", "", "the label selector of plugd's DaemonSet pods, such as app.kubernetes.io/name=plugd,app.kubernetes.io/instance=plugd (empty: no pods watched; where plugd runs outside a pod)")
	f.DurationVar(&cfg.PodGrace, "pod-grace", DefaultPodGrace, "mark a node's plugd conditions once its plugd pod has not been Ready, or is gone, for this long, and plugd has not written them since; longer than a rolling update's gap between the old pod and the new one")
	f.DurationVar(&cfg.CSINodeGrace, "csinode-grace", DefaultCSINodeGrace, "mark a CSI driver's True condition once the kubelet has dropped the driver from the node's CSINode for this long, and plugd has not written it since (0: watch no CSINodes)")
	f.StringVar(&cfg.SummaryNamespace, "summary-namespace", "", "keep the cluster view, for kubectl plugd cluster, in the ConfigMap "+nodecond.SummaryName+" of this namespace (the chart's: its release's); empty: none")
	f.StringVar(&format, "log-format", "text", "text or json")
	f.StringVar(&level, "log-level", "info", "debug, info, warn or error")
	return cmd
}

// checkFlags says which of the durations and pod flags in cfg is wrong,
// and turns --csinode-grace 0 into Config's "off".
func checkFlags(cfg *Config) error {
	if cfg.StaleAfter <= 0 {
		return fmt.Errorf("--stale-after %s: give a positive duration, such as %s", cfg.StaleAfter, nodecond.MaxHeartbeatAge)
	}
	if cfg.PodGrace <= 0 {
		return fmt.Errorf("--pod-grace %s: give a positive duration, such as %s (longer than a rolling update's gap between plugd's old pod and its new one)", cfg.PodGrace, DefaultPodGrace)
	}
	if cfg.CSINodeGrace < 0 {
		return fmt.Errorf("--csinode-grace %s: give a positive duration, such as %s, or 0 to watch no CSINodes", cfg.CSINodeGrace, DefaultCSINodeGrace)
	}
	if cfg.CSINodeGrace == 0 {
		cfg.CSINodeGrace = -1 // off, as Config has it
	}
	if cfg.PlugdSelector == "" {
		return nil
	}
	if _, err := labels.Parse(cfg.PlugdSelector); err != nil {
		return fmt.Errorf("--plugd-selector %q: %w: give the labels of plugd's DaemonSet pods, such as app.kubernetes.io/name=plugd", cfg.PlugdSelector, err)
	}
	if cfg.PlugdNamespace == "" {
		return fmt.Errorf("--plugd-selector %q without --plugd-namespace: give the namespace of plugd's DaemonSet", cfg.PlugdSelector)
	}
	return nil
}
