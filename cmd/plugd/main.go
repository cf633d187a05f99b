// Command plugd is the plugin manager daemon (internal/daemon), the
// cluster's caretaker of its Node conditions (plugd caretaker), and the
// conformance kit for plugin authors (plugd conformance).
package main

import (
	"context"
	"os"

	"github.com/plugd/plugd/cmd/plugd/internal/caretaker"
	"github.com/plugd/plugd/cmd/plugd/internal/conformance"
	"github.com/plugd/plugd/cmd/plugd/internal/daemon"
	"github.com/plugd/plugd/cmd/plugd/internal/demo"
)

func main() {
	cmd := daemon.Command()
	cmd.AddCommand(demo.Command(), caretaker.Command(), conformance.Command())
	os.Exit(daemon.Execute(context.Background(), cmd, os.Args[1:], os.Stderr))
}
