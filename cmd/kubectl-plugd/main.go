// Command kubectl-plugd is the kubectl plugin of plugd: kubectl plugd
// cluster, node and doctor. Installed on $PATH (or with krew), kubectl runs
// it for "kubectl plugd". See internal/cli.
package main

import (
	"os"

	"github.com/plugd/plugd/cmd/kubectl-plugd/internal/cli"
)

func main() {
	os.Exit(cli.Main(os.Args[1:], os.Stdout, os.Stderr))
}
