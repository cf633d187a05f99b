package cli

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/plugd/plugd/api"
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

Exit codes: 0 nothing at warning or above, 4 a warning or an error was found,
1 plugd could not be asked.`,
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
	shown := []api.Finding{}
	for _, f := range fs {
		if severityAtLeast(f.Severity, minSeverity) {
			shown = append(shown, f)
		}
	}
	switch output {
	case "json":
		err = writeJSON(a.stdout, api.FindingList{Findings: shown})
	case "yaml":
		err = writeYAML(a.stdout, api.FindingList{Findings: shown})
	default:
		err = writeFindings(a.stdout, shown)
	}
	if err != nil {
		return err
	}
	if slices.ContainsFunc(fs, func(f api.Finding) bool { return severityAtLeast(f.Severity, api.SeverityWarning) }) {
		return &exitError{code: ExitFindings, err: fmt.Errorf("found %s", countFindings(fs))}
	}
	return nil
}

// doctorWait bounds a doctor run: plugd's own bound, and a margin.
const doctorWait = 15 * time.Second

func severityAtLeast(s, min string) bool {
	return slices.Index(api.Severities, s) >= slices.Index(api.Severities, min)
}

// writeFindings prints findings for people: a heading line each, then the
// summary, evidence and remedy, indented.
func writeFindings(w io.Writer, fs []api.Finding) error {
	var b strings.Builder
	if len(fs) == 0 {
		b.WriteString("plugd found nothing wrong\n")
	}
	for i, f := range fs {
		if i > 0 {
			b.WriteString("\n")
		}
		head := []string{text(strings.ToUpper(f.Severity)), text(f.Check)}
		if f.Type != "" {
			head = append(head, text(f.Type+" "+f.Name))
		}
		if f.Socket != "" {
			head = append(head, text(f.Socket))
		}
		fmt.Fprintf(&b, "%s\n  %s\n", strings.Join(head, "  "), text(f.Summary))
		for _, e := range f.Evidence {
			fmt.Fprintf(&b, "  - %s\n", text(e))
		}
		if f.Remedy != "" {
			fmt.Fprintf(&b, "  remedy: %s\n", text(f.Remedy))
		}
	}
	if len(fs) > 0 {
		fmt.Fprintf(&b, "\n%s\n", countFindings(fs))
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// text is s on one line, safe for a terminal.
func text(s string) string {
	if s == "" {
		return ""
	}
	return cell(s)
}

// countFindings says how many findings there are of each severity.
func countFindings(fs []api.Finding) string {
	var parts []string
	for _, sev := range slices.Backward(api.Severities) {
		n := 0
		for _, f := range fs {
			if f.Severity == sev {
				n++
			}
		}
		if n > 0 {
			parts = append(parts, fmt.Sprintf("%d %s", n, plural(n, sev)))
		}
	}
	return strings.Join(parts, ", ")
}

func plural(n int, s string) string {
	if n == 1 {
		return s
	}
	return s + "s"
}
