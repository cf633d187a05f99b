package daemon

import (
	"fmt"

	"github.com/spf13/pflag"
)

// LoadArgs is the configuration plugd runs with for these command-line
// arguments (without the program name) and environment: the file --config
// names, the flags over it, and the defaults, as plugd's command reads
// them. The deployment tests check manifests with it.
func LoadArgs(args []string, getenv func(string) string) (Config, error) {
	o := options{getenv: getenv}
	f := pflag.NewFlagSet("plugd", pflag.ContinueOnError)
	o.bind(f)
	if err := f.Parse(args); err != nil {
		return Config{}, err
	}
	if f.NArg() != 0 {
		return Config{}, fmt.Errorf("plugd takes no arguments, only flags; have %q", f.Args())
	}
	return o.load(f)
}
