package cli

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/plugd/plugd/api"
	"github.com/plugd/plugd/cmd/internal/printer"
)

var doctorOutputs = []string{"text", "json", "yaml"}

func (a *app) doctorCommand() *cobra.Command {
	var output, minSeverity string
	cmd := &cobra.Command{
		Use:   "doctor",
		Short: "Find what is wrong with the node's plugins, and say what to do",
		Long: `Ask plugd to check the node's plugins and print what it finds, most serious
first: each finding has a severity (error, warning, info), the plugin it is
about, the evidence and a remedy.

plugd checks for stale sockets (nobody listens) with their age and owner;
sockets it may not connect to (their mode and owner against plugd's user);
plugins whose endpoint is dead while their registration socket answers;
versions the kubelet would refuse; DRA drivers advertising a health service
they do not implement; two sockets of one plugin with the old one dead;
socket paths over 107 bytes; registration sockets under other kubelet root
directories (MicroK8s, k0s, k3s, a running kubelet's --root-dir); expected
plugins that are missing; and, connected to Kubernetes, plugins that answer
while the kubelet has not registered them (with the likely causes) and
trouble with the API server.

Exit codes: 0 nothing at warning or above was found (of the findings
--min-severity shows: with error, warnings alone exit 0), 4 a warning or an
error was found, 1 plugd could not be asked.`,
		Example: `  plugctl doctor
  plugctl doctor -o json | jq -r '.findings[] | select(.severity == "error") | .summary'`,
		Args: noArgs,
		RunE: runE(func(cmd *cobra.Command, _ []string) error {
			var err error
			if output, err = oneOf("--output", output, doctorOutputs...); err != nil {
				return err
			}
			if minSeverity, err = oneOf("--min-severity", minSeverity, api.Severities...); err != nil {
				return err
			}
			return a.doctor(cmd.Context(), output, minSeverity)
		}),
	}
	cmd.Flags().StringVarP(&output, "output", "o", "text", "output format: "+strings.Join(doctorOutputs, ", "))
	cmd.Flags().StringVar(&minSeverity, "min-severity", api.SeverityInfo, "print findings of this severity and above: "+strings.Join(api.Severities, ", "))
	completeFlag(cmd, "output", fixedCompletions(doctorOutputs...))
	completeFlag(cmd, "min-severity", fixedCompletions(api.Severities...))
	return cmd
}

func (a *app) doctor(ctx context.Context, output, minSeverity string) error {
	// The checks dial sockets, each with its own deadline; give them room
	// beyond --timeout's default.
	ctx, cancel := context.WithTimeout(ctx, max(a.timeout, doctorWait))
	defer cancel()
	c := a.client()
	fs, err := c.Findings(ctx)
	if err != nil {
		return a.explain(ctx, c, err)
	}
	shown := printer.AtLeast(fs, minSeverity)
	switch output {
	case "json":
		err = printer.JSON(a.stdout, api.FindingList{Findings: shown})
	case "yaml":
		err = printer.YAML(a.stdout, api.FindingList{Findings: shown})
	default:
		err = printer.FindingsAtLeast(a.stdout, "plugd", fs, minSeverity)
	}
	if err != nil {
		return err
	}
	if printer.Serious(shown) {
		return &exitError{code: ExitFindings, err: fmt.Errorf("found %s", printer.CountFindings(shown))}
	}
	return nil
}

// doctorWait bounds a doctor run: plugd's own bound, and a margin.
const doctorWait = 15 * time.Second
