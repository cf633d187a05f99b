// Command plugctl is the command line of plugd's status API. See internal/cli.
package main

import (
	"os"

	"github.com/plugd/plugd/cmd/plugctl/internal/cli"
)

func main() {
	os.Exit(cli.Main(os.Args[1:], os.Stdout, os.Stderr))
}
