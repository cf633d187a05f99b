// Command kubelet-manager is the kubelet's plugin manager under test
// (k8s.io/kubernetes/pkg/kubelet/pluginmanager), built as the kubelet builds
// it, with an accept-everything handler, until SIGTERM.
package main

import (
	"context"
	"errors"
	"time"

	"github.com/plugd/plugd/bench/internal/managers"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/client-go/tools/record"
	kubeletconfig "k8s.io/kubernetes/pkg/kubelet/config"
	"k8s.io/kubernetes/pkg/kubelet/pluginmanager"
)

type manager struct{}

func (manager) Run(ctx context.Context, dir string) error {
	// Events would go to the API server; a recorder without a channel drops them.
	pm := pluginmanager.NewPluginManager(dir, &record.FakeRecorder{})
	pm.AddHandler(managers.PluginType, acceptAll{})

	// Run wants a stop channel besides the context.
	stop := make(chan struct{})
	go func() {
		<-ctx.Done()
		close(stop)
	}()
	alwaysReady := kubeletconfig.NewSourcesReady(func(sets.Set[string]) bool { return true })
	pm.Run(ctx, alwaysReady, stop)
	if ctx.Err() == nil {
		// Run returns early only when its watcher fails to start, which it
		// logs (to stderr) instead of returning.
		return errors.New("the kubelet's plugin manager stopped: its watcher did not start (see the log above)")
	}
	return nil
}

// acceptAll is a kubelet plugin handler that takes every plugin.
type acceptAll struct{}

func (acceptAll) ValidatePlugin(context.Context, string, string, []string) error { return nil }

func (acceptAll) RegisterPlugin(context.Context, string, string, []string, *time.Duration) error {
	return nil
}

func (acceptAll) DeRegisterPlugin(context.Context, string, string) {}

func main() {
	managers.Main(manager{})
}
