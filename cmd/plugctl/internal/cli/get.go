package cli

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"

	"github.com/plugd/plugd/api"
	"github.com/plugd/plugd/cmd/internal/printer"
)

func (a *app) getCommand() *cobra.Command {
	var output string
	cmd := &cobra.Command{
		Use:   "get ID",
		Short: "Show everything plugd knows of one plugin",
		Long: `Show one plugin: its type, name, endpoint, versions, state, the step its last
attempt failed at and why, attempts, next retry, and when it was found and
registered. With plugd connected to Kubernetes, also what the kubelet made of
it (kubelet) and the startup taints that wait for it (taints: each one's
state, since when, the re-adds plugd removed again and who made them, the
writer that holds one plugd leaves).

ID is the plugin's socket path inside plugd's registry directory, as the ID
column of 'plugctl list' shows it (e.g. csi.example.com-reg.sock or
vendor/gpu.sock). Shell completion offers the IDs plugd knows.`,
		Example: `  plugctl get csi.example.com-reg.sock
  plugctl get vendor/gpu.sock -o json | jq .lastError`,
		Args:              exactlyOneID,
		ValidArgsFunction: a.completeIDs,
		RunE: runE(func(cmd *cobra.Command, args []string) error {
			var err error
			if output, err = oneOf("--output", output, getOutputs...); err != nil {
				return err
			}
			return a.get(cmd.Context(), args[0], output)
		}),
	}
	cmd.Flags().StringVarP(&output, "output", "o", "yaml", "output format: "+strings.Join(getOutputs, ", "))
	completeFlag(cmd, "output", fixedCompletions(getOutputs...))
	return cmd
}

func exactlyOneID(_ *cobra.Command, args []string) error {
	switch len(args) {
	case 1:
		return nil
	case 0:
		return usageErrorf("get needs the ID of a plugin; 'plugctl list' shows them")
	}
	return usageErrorf("get takes one plugin ID, but got %d: %q", len(args), args)
}

func (a *app) get(ctx context.Context, id, output string) error {
	ctx, cancel := a.requestContext(ctx)
	defer cancel()
	c := a.client()
	p, err := c.Plugin(ctx, id)
	if errors.Is(err, api.ErrNotFound) {
		return notFound(id, guessIDs(ctx, c, id))
	}
	if err != nil {
		return a.explain(ctx, c, err)
	}
	if output == "json" {
		return printer.JSON(a.stdout, p)
	}
	return printer.YAML(a.stdout, p)
}

func notFound(id string, guesses []string) error {
	msg := fmt.Sprintf("plugd knows no plugin with ID %q; run 'plugctl list' to see the IDs (an ID is a socket's path inside the registry directory)", id)
	if len(guesses) > 0 {
		msg += fmt.Sprintf("; did you mean %s?", strings.Join(guesses, " or "))
	}
	return errors.New(msg)
}

// guessIDs finds the plugins someone who typed id probably meant: people
// paste the socket's full path, or type the plugin's name, or leave out
// ".sock". It is a courtesy, so errors just mean no guesses.
func guessIDs(ctx context.Context, c *api.Client, id string) []string {
	plugins, err := c.Plugins(ctx, api.Filter{})
	if err != nil {
		return nil
	}
	var out []string
	for _, p := range plugins {
		if p.Socket == id || p.Name == id || p.ID == id+".sock" || filepath.Base(p.ID) == id {
			out = append(out, p.ID)
		}
	}
	return out
}

// completeIDs offers the IDs plugd knows, each described by its type, name
// and state.
func (a *app) completeIDs(cmd *cobra.Command, args []string, toComplete string) ([]cobra.Completion, cobra.ShellCompDirective) {
	if len(args) > 0 {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	plugins, err := a.completionPlugins(cmd)
	if err != nil {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	var out []cobra.Completion
	for _, p := range plugins {
		if strings.HasPrefix(p.ID, toComplete) {
			out = append(out, cobra.CompletionWithDesc(p.ID, strings.Join(strings.Fields(p.Type+" "+p.Name+" "+p.State), " ")))
		}
	}
	return out, cobra.ShellCompDirectiveNoFileComp
}
