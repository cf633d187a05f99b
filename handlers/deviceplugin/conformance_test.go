package deviceplugin_test

import (
	"path/filepath"
	"testing"

	api "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/plugd/plugd/handlers/deviceplugin"
	"github.com/plugd/plugd/plugin"
	"github.com/plugd/plugd/pluginmanager"
	"github.com/plugd/plugd/plugintest"
)

// The device plugin handler keeps the contract of a handler, with device
// plugins serving their devices on their registration socket.
func TestConformance(t *testing.T) {
	plugintest.TestHandler(t, plugintest.HandlerCase{
		Type: deviceplugin.Type,
		New:  func(*testing.T) pluginmanager.Handler { return deviceplugin.New(deviceplugin.Options{}) },
		Start: func(t *testing.T, dir, name string) (string, func()) {
			dp := newDevicePlugin(dev(name+"-0", api.Healthy))
			s, err := plugin.Start(plugin.Config{
				Dir: dir, Socket: name + ".sock", Type: deviceplugin.Type, Name: "example.com/" + name,
				Versions: []string{"v1beta1"}, Services: dp.register,
			})
			if err != nil {
				t.Fatal(err)
			}
			return filepath.Join(dir, name+".sock"), func() { s.Close() }
		},
		Refused: pluginmanager.Plugin{Type: deviceplugin.Type, Name: "gpu", Endpoint: "/run/dp/gpu.sock", Versions: []string{"v1beta1"}, Socket: "/run/reg/gpu.sock"},
	})
}
