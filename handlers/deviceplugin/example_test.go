package deviceplugin_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"time"

	"google.golang.org/grpc"
	api "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/plugd/plugd/handlers/deviceplugin"
	"github.com/plugd/plugd/plugin"
	"github.com/plugd/plugd/pluginmanager"
)

// gpuPlugin is a device plugin with two GPUs, one of them failing.
type gpuPlugin struct {
	api.UnimplementedDevicePluginServer
}

func (gpuPlugin) GetDevicePluginOptions(context.Context, *api.Empty) (*api.DevicePluginOptions, error) {
	return &api.DevicePluginOptions{}, nil
}

func (gpuPlugin) ListAndWatch(_ *api.Empty, s api.DevicePlugin_ListAndWatchServer) error {
	err := s.Send(&api.ListAndWatchResponse{Devices: []*api.Device{
		{ID: "gpu-0", Health: api.Healthy},
		{ID: "gpu-1", Health: api.Unhealthy},
	}})
	if err != nil {
		return err
	}
	<-s.Context().Done() // a real plugin sends a new list whenever health changes
	return nil
}

// A node agent accepts device plugins; a plugin serves the device plugin API
// on its registration socket, and registers.
func Example() {
	dir, err := os.MkdirTemp("", "plugins") // short: unix socket paths must stay under 108 bytes
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)

	devices := deviceplugin.New(deviceplugin.Options{})
	m, err := pluginmanager.New(pluginmanager.Options{Dir: dir})
	if err != nil {
		log.Fatal(err)
	}
	m.AddHandler(deviceplugin.Type, devices)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- m.Run(ctx) }()

	p, err := plugin.Start(plugin.Config{
		Dir:      dir,
		Type:     deviceplugin.Type,
		Name:     "example.com/gpu",
		Socket:   "gpu.sock",
		Versions: []string{api.Version},
		Services: func(s grpc.ServiceRegistrar) { api.RegisterDevicePluginServer(s, gpuPlugin{}) },
	})
	if err != nil {
		log.Fatal(err)
	}
	// Registered means the handler has the plugin's first device list.
	if err := p.WaitRegistered(ctx); err != nil {
		log.Fatal(err)
	}
	for _, r := range devices.Resources() {
		fmt.Printf("%s: %d devices\n", r.Name, len(r.Devices))
		for _, d := range r.Devices {
			fmt.Printf("  %s %s\n", d.ID, d.Health)
		}
	}

	// Stop the manager, then the handler, which ends the plugin's stream,
	// then the plugin.
	cancel()
	if err := <-done; err != nil {
		log.Fatal(err)
	}
	devices.Close()
	if err := p.Close(); err != nil {
		log.Fatal(err)
	}
	// Output:
	// example.com/gpu: 2 devices
	//   gpu-0 Healthy
	//   gpu-1 Unhealthy
}
