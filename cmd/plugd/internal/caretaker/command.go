package caretaker

import (
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"
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
		Long: `plugd caretaker watches every Node and marks each condition plugd wrote whose
heartbeat (lastHeartbeatTime) it has not seen change for --stale-after, on
its own clock: Unknown, reason NotMaintained. plugd heartbeats its
conditions at least every 5 minutes, so such a condition is left from a
plugd that no longer runs; the heartbeat is the node's clock, and only its
changes count. Run one per
cluster (the chart's Deployment plugd-caretaker); it needs get, list and
watch on nodes and patch on nodes/status, and no registry directory.
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
			if cfg.StaleAfter <= 0 {
				return fmt.Errorf("--stale-after %s: give a positive duration, such as %s", cfg.StaleAfter, nodecond.MaxHeartbeatAge)
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
	f.StringVar(&cfg.SummaryNamespace, "summary-namespace", "", "keep the cluster view, for kubectl plugd cluster, in the ConfigMap "+nodecond.SummaryName+" of this namespace (the chart's: its release's); empty: none")
	f.StringVar(&format, "log-format", "text", "text or json")
	f.StringVar(&level, "log-level", "info", "debug, info, warn or error")
	return cmd
}
