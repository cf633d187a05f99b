// Command plugd is the plugin manager daemon (internal/daemon), and the
// cluster's caretaker of its Node conditions (plugd caretaker).
package main

import (
	"context"
	"os"

	"github.com/plugd/plugd/cmd/plugd/internal/caretaker"
	"github.com/plugd/plugd/cmd/plugd/internal/daemon"
	"github.com/plugd/plugd/cmd/plugd/internal/demo"
)

func main() {
	cmd := daemon.Command()
	cmd.AddCommand(demo.Command(), caretaker.Command())
	os.Exit(daemon.Execute(context.Background(), cmd, os.Args[1:], os.Stderr))
}
