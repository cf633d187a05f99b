// Command plugd is the plugin manager daemon. See internal/daemon.
package main

import (
	"fmt"
	"os"

	"github.com/plugd/plugd/cmd/plugd/internal/daemon"
	"github.com/plugd/plugd/cmd/plugd/internal/demo"
)

func main() {
	cmd := daemon.Command()
	cmd.AddCommand(demo.Command())
	if err := cmd.Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "plugd:", err)
		os.Exit(1)
	}
}
