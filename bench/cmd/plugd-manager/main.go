// Command plugd-manager is plugd's pluginmanager under test: defaults
// throughout, an accept-everything handler, until SIGTERM.
package main

import (
	"context"
	"flag"
	"time"

	"github.com/plugd/plugd/bench/internal/managers"
	"github.com/plugd/plugd/pluginmanager"
)

type manager struct {
	probeInterval time.Duration
}

func (p *manager) Run(ctx context.Context, dir string) error {
	m, err := pluginmanager.New(pluginmanager.Options{Dir: dir, ProbeInterval: p.probeInterval})
	if err != nil {
		return err
	}
	m.AddHandler(managers.PluginType, pluginmanager.HandlerFuncs{})
	return m.Run(ctx)
}

func main() {
	m := &manager{}
	flag.DurationVar(&m.probeInterval, "probe-interval", 0, "Options.ProbeInterval: 0 for plugd's default (5m), negative for no routine probes (connections are still held and watched)")
	managers.Main(m)
}
