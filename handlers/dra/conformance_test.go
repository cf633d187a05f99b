package dra

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/go-logr/logr"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2"

	"github.com/plugd/plugd/internal/testenv"
	"github.com/plugd/plugd/pluginmanager"
	"github.com/plugd/plugd/plugintest"
)

// The DRA handler keeps the contract of a handler, with drivers built on
// k8s.io/dynamic-resource-allocation/kubeletplugin.
func TestConformance(t *testing.T) {
	plugintest.TestHandler(t, plugintest.HandlerCase{
		Type: Type,
		New:  func(*testing.T) pluginmanager.Handler { return New(Options{}) },
		Start: func(t *testing.T, dir, name string) (string, func()) {
			ctx := klog.NewContext(context.Background(), logr.Discard())
			helper, err := kubeletplugin.Start(ctx, testDriver{},
				kubeletplugin.DriverName(name+".example.com"),
				kubeletplugin.KubeClient(fake.NewClientset()),
				kubeletplugin.NodeName("node-1"),
				kubeletplugin.RegistrarDirectoryPath(dir),
				kubeletplugin.PluginDataDirectoryPath(testenv.ShortDir(t, "drap")))
			if err != nil {
				t.Fatal(err)
			}
			return filepath.Join(dir, name+".example.com-reg.sock"), helper.Stop
		},
		Refused: pluginmanager.Plugin{Type: Type, Name: "Not_A_DNS_Name", Endpoint: "/run/dra.sock", Versions: []string{"v1.DRAPlugin"}, Socket: "/run/reg/x.sock"},
	})
}
