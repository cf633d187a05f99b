package cli

import (
	"context"
	"fmt"

	"github.com/plugd/plugd/cmd/internal/version"
	"github.com/spf13/cobra"
)

func (a *app) versionCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print plugctl's version and plugd's",
		Long: `Print plugctl's version, then the version of the plugd it talks to and the
registry directory that plugd watches. If plugd cannot be reached, plugctl's
version is still printed, and the exit code is 1.`,
		Args: noArgs,
		RunE: runE(func(cmd *cobra.Command, _ []string) error {
			return a.version(cmd.Context())
		}),
	}
}

func (a *app) version(ctx context.Context) error {
	// Print our own version first: it is what a bug report needs even when
	// the daemon is down.
	fmt.Fprintln(a.stdout, version.Line("plugctl"))
	ctx, cancel := a.requestContext(ctx)
	defer cancel()
	c := a.client()
	v, err := c.Version(ctx)
	if err != nil {
		return a.explain(ctx, c, err)
	}
	_, err = fmt.Fprintf(a.stdout, "plugd %s (%s) at %s, watching %s\n", v.Version, v.GoVersion, where(c), v.RegistryDir)
	return err
}
