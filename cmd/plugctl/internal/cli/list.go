package cli

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/plugd/plugd/api"
	"github.com/plugd/plugd/cmd/internal/printer"
)

// states are the plugin states plugd reports, as the API spells them.
var states = api.States()

// Output formats.
var (
	listOutputs = []string{"table", "wide", "json", "yaml"}
	getOutputs  = []string{"yaml", "json"}
)

func (a *app) listCommand() *cobra.Command {
	var (
		f      api.Filter
		output string
	)
	cmd := &cobra.Command{
		Use:     "list",
		Aliases: []string{"ls"},
		Short:   "List the plugins plugd knows, with their state",
		Long: `List every registration socket plugd found, sorted by ID.

The table shows ID (the socket's path inside the registry directory, what
'plugctl get' takes), TYPE, NAME, STATE, AGE (since the plugin registered, or
else since its socket was found) and ERROR (the last failure, cut to fit the
terminal). With plugd connected to Kubernetes, KUBELET follows STATE: what the
API shows the kubelet made of the plugin (Registered, NotRegistered, Unknown;
-o wide adds the reason). Where plugd removes a startup taint for an expected
plugin, TAINT follows: its state (Present, Removed, Held by the writer that
put it back after the startup window, Restored, Absent); -o wide adds the
taint, since when, and how often plugd removed it again. -o wide adds ENDPOINT, VERSIONS, ATTEMPTS, NEXT RETRY and NEWEST
(the newest of several sockets of one plugin) and prints errors whole. -o json
and -o yaml print the API's PluginList.

States: ` + strings.Join(states, ", ") + `.`,
		Example: `  plugctl list
  plugctl list --type CSIPlugin --state Failed -o wide
  plugctl list -o json | jq -r '.plugins[] | select(.state != "Registered") | .id'`,
		Args: noArgs,
		RunE: runE(func(cmd *cobra.Command, _ []string) error {
			var err error
			if output, err = oneOf("--output", output, listOutputs...); err != nil {
				return err
			}
			if f.State != "" {
				if f.State, err = oneOf("--state", f.State, states...); err != nil {
					return err
				}
			}
			return a.list(cmd.Context(), f, output)
		}),
	}
	fl := cmd.Flags()
	fl.StringVar(&f.Type, "type", "", "only plugins of this type, e.g. CSIPlugin")
	fl.StringVar(&f.Name, "name", "", "only plugins of this name")
	fl.StringVar(&f.State, "state", "", "only plugins in this state ("+strings.Join(states, ", ")+")")
	fl.StringVarP(&output, "output", "o", "table", "output format: "+strings.Join(listOutputs, ", "))
	completeFlag(cmd, "type", a.completePlugins(func(p api.Plugin) string { return p.Type }))
	completeFlag(cmd, "name", a.completePlugins(func(p api.Plugin) string { return p.Name }))
	completeFlag(cmd, "state", fixedCompletions(states...))
	completeFlag(cmd, "output", fixedCompletions(listOutputs...))
	return cmd
}

func (a *app) list(ctx context.Context, f api.Filter, output string) error {
	ctx, cancel := a.requestContext(ctx)
	defer cancel()
	c := a.client()
	plugins, err := c.Plugins(ctx, f)
	if err != nil {
		return a.explain(ctx, c, err)
	}
	switch output {
	case "json":
		return printer.JSON(a.stdout, api.PluginList{Plugins: nonNil(plugins)})
	case "yaml":
		return printer.YAML(a.stdout, api.PluginList{Plugins: nonNil(plugins)})
	}
	if len(plugins) == 0 {
		// An empty table would leave people wondering whether plugctl
		// looked in the right place; say where plugd looks instead.
		fmt.Fprintln(a.stderr, emptyListHint(f, a.registryDir(ctx, c)))
		return nil
	}
	t := pluginTable(plugins, output == "wide", time.Now())
	width := printer.Width(a.stdout, a.getenv)
	if output == "wide" {
		width = 0
	}
	return t.Write(a.stdout, width)
}

// registryDir asks plugd which directory it watches, or returns "" if it will
// not say.
func (a *app) registryDir(ctx context.Context, c *api.Client) string {
	v, err := c.Version(ctx)
	if err != nil {
		return ""
	}
	return v.RegistryDir
}

func emptyListHint(f api.Filter, dir string) string {
	msg := "no plugins"
	if sel := filterString(f); sel != "" {
		msg = "no plugins match " + sel + " ('plugctl list' shows all)"
	}
	if dir != "" {
		msg += "; plugd watches " + dir
	}
	return msg
}

// filterString is f as the flags that set it.
func filterString(f api.Filter) string {
	var parts []string
	for _, kv := range [][2]string{{"--type", f.Type}, {"--name", f.Name}, {"--state", f.State}} {
		if kv[1] != "" {
			parts = append(parts, kv[0]+" "+kv[1])
		}
	}
	return strings.Join(parts, " ")
}

// pluginTable lays plugins out for people. ERROR comes last in both forms so
// that a long error, cut or not, does not push other columns around.
func pluginTable(plugins []api.Plugin, wide bool, now time.Time) printer.Table {
	kube := slices.ContainsFunc(plugins, func(p api.Plugin) bool { return p.Kubelet != nil })
	tainted := slices.ContainsFunc(plugins, func(p api.Plugin) bool { return len(p.Taints) > 0 })
	t := printer.Table{Header: []string{"ID", "TYPE", "NAME", "STATE"}}
	if kube {
		t.Header = append(t.Header, "KUBELET")
	}
	if tainted {
		t.Header = append(t.Header, "TAINT")
	}
	t.Header = append(t.Header, "AGE")
	if wide {
		t.Header = append(t.Header, "ENDPOINT", "VERSIONS", "ATTEMPTS", "NEXT RETRY", "NEWEST")
	}
	t.Header = append(t.Header, "ERROR")
	for _, p := range plugins {
		row := []string{printer.Cell(p.ID), printer.Cell(p.Type), printer.Cell(p.Name), printer.Cell(p.State)}
		if kube {
			row = append(row, kubeletCell(p.Kubelet, wide))
		}
		if tainted {
			row = append(row, printer.Taints(p.Taints, wide, now))
		}
		row = append(row, age(p, now))
		if wide {
			row = append(row, printer.Cell(p.Endpoint), printer.Cell(strings.Join(p.Versions, ",")),
				strconv.Itoa(p.Attempts), printer.Until(p.NextRetry, now), yesOrDash(p.Newest))
		}
		t.Rows = append(t.Rows, append(row, printer.Cell(p.LastError)))
	}
	return t
}

// kubeletCell is a plugin's kubelet view in a table: its state, and in the
// wide form its reason.
func kubeletCell(v *api.KubeletView, wide bool) string {
	switch {
	case v == nil:
		return "-"
	case wide && v.Reason != "":
		return printer.Cell(v.State + "(" + v.Reason + ")")
	}
	return printer.Cell(v.State)
}

// age is how long a plugin has been registered, or if it is not, how long
// ago its socket was found.
func age(p api.Plugin, now time.Time) string {
	if !p.RegisteredSince.IsZero() {
		return printer.Since(p.RegisteredSince, now)
	}
	return printer.Since(p.Discovered, now)
}

func yesOrDash(b bool) string {
	if b {
		return "yes"
	}
	return "-"
}

// nonNil makes an empty list print as [] rather than null.
func nonNil(ps []api.Plugin) []api.Plugin {
	if ps == nil {
		return []api.Plugin{}
	}
	return ps
}

// completeFlag registers shell completion for a flag. Registration fails
// only for a flag that does not exist, which is a bug caught by the tests.
func completeFlag(cmd *cobra.Command, flag string, fn cobra.CompletionFunc) {
	if err := cmd.RegisterFlagCompletionFunc(flag, fn); err != nil {
		panic(err)
	}
}

func fixedCompletions(values ...string) cobra.CompletionFunc {
	return cobra.FixedCompletions(values, cobra.ShellCompDirectiveNoFileComp)
}

// completePlugins completes with the distinct values of field among the
// plugins plugd knows. If plugd cannot be asked, there are no completions:
// a shell must not print errors in the middle of a command line.
func (a *app) completePlugins(field func(api.Plugin) string) cobra.CompletionFunc {
	return func(cmd *cobra.Command, _ []string, toComplete string) ([]cobra.Completion, cobra.ShellCompDirective) {
		plugins, err := a.completionPlugins(cmd)
		if err != nil {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		seen := map[string]bool{}
		var out []cobra.Completion
		for _, p := range plugins {
			if v := field(p); v != "" && !seen[v] && strings.HasPrefix(v, toComplete) {
				seen[v] = true
				out = append(out, v)
			}
		}
		return out, cobra.ShellCompDirectiveNoFileComp
	}
}

// completionPlugins lists plugins for shell completion, within --timeout.
func (a *app) completionPlugins(cmd *cobra.Command) ([]api.Plugin, error) {
	ctx := cmd.Context()
	if ctx == nil {
		ctx = context.Background()
	}
	ctx, cancel := a.requestContext(ctx)
	defer cancel()
	return a.client().Plugins(ctx, api.Filter{})
}
