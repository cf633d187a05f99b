// Command plugd is the plugin manager daemon. See internal/daemon.
package main

import (
	"fmt"
	"os"

	"github.com/plugd/plugd/internal/daemon"
)

func main() {
	if err := daemon.Command().Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "plugd:", err)
		os.Exit(1)
	}
}
