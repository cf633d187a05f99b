package dra_test

import (
	"context"
	"fmt"

	"github.com/plugd/plugd/handlers/dra"
	"github.com/plugd/plugd/pluginmanager"
)

// A driver is checked before it is registered; one that speaks no DRA service
// the handler knows is rejected, and the manager passes the reason on to it.
func Example() {
	h := dra.New(dra.Options{})
	defer h.Close()
	// In a program: m.AddHandler(dra.Type, h) on a pluginmanager.Manager.

	err := h.Validate(context.Background(), pluginmanager.Plugin{
		Type:     dra.Type,
		Name:     "gpu.example.com",
		Endpoint: "/var/lib/kubelet/plugins/gpu.example.com/dra.sock",
		Versions: []string{"v2.DRAPlugin", "v1.DRAResourceHealth"},
		Socket:   "/var/lib/kubelet/plugins_registry/gpu.example.com-reg.sock",
	})
	fmt.Println(err)

	fmt.Println(len(h.Drivers()), "drivers")
	// Output:
	// driver "gpu.example.com" offers none of the DRA services supported (v1.DRAPlugin, v1beta1.DRAPlugin); it offers ["v2.DRAPlugin" "v1.DRAResourceHealth"]
	// 0 drivers
}
