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
	m.AddHandler(managers.PluginType, acceptAll{})
	return m.Run(ctx)
}

// acceptAll takes every plugin: the shape of the kubelet-manager's own
// accept-everything handler, so that both managers call the same.
type acceptAll struct{}

func (acceptAll) Validate(context.Context, pluginmanager.Plugin) error { return nil }
func (acceptAll) Register(context.Context, pluginmanager.Plugin) error { return nil }
func (acceptAll) Deregister(context.Context, pluginmanager.Plugin)     {}

func main() {
	m := &manager{}
	flag.DurationVar(&m.probeInterval, "probe-interval", 0, "Options.ProbeInterval: 0 for plugd's default (5m), negative for no routine probes (connections are still held and watched)")
	managers.Main(m)
}
