package main

import (
	"strings"
	"testing"

	"github.com/spf13/cobra"

	"github.com/plugd/plugd/cmd/plugd/internal/caretaker"
	"github.com/plugd/plugd/cmd/plugd/internal/conformance"
	"github.com/plugd/plugd/cmd/plugd/internal/daemon"
	"github.com/plugd/plugd/cmd/plugd/internal/demo"
)

// Issue 33, item 12: no line of any of plugd's commands' help starts with
// a stray space; indented blocks (two spaces or more) are fine.
func TestHelpHasNoStraySpace(t *testing.T) {
	root := daemon.Command()
	root.AddCommand(demo.Command(), caretaker.Command(), conformance.Command())
	var check func(cmd *cobra.Command)
	check = func(cmd *cobra.Command) {
		for _, text := range []string{cmd.Short, cmd.Long, cmd.Example} {
			for _, line := range strings.Split(text, "\n") {
				if strings.HasPrefix(line, " ") && !strings.HasPrefix(line, "  ") {
					t.Errorf("%s: a line of its help starts with a stray space: %q", cmd.CommandPath(), line)
				}
			}
		}
		for _, sub := range cmd.Commands() {
			check(sub)
		}
	}
	check(root)
}
