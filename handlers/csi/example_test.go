package csi_test

import (
	"context"
	"fmt"
	"log"
	"net"
	"os"
	"path/filepath"
	"time"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"

	"github.com/plugd/plugd/handlers/csi"
	"github.com/plugd/plugd/plugin"
	"github.com/plugd/plugd/pluginmanager"
)

// A manager with the CSI handler registers a driver that node-driver-registrar
// announces, and records what the driver said about the node.
func Example() {
	registry, err := os.MkdirTemp("", "registry")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(registry)
	driverDir, err := os.MkdirTemp("", "driver")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(driverDir)

	// The CSI driver serves Identity and Node on its own socket.
	endpoint := filepath.Join(driverDir, "csi.sock")
	l, err := net.Listen("unix", endpoint)
	if err != nil {
		log.Fatal(err)
	}
	srv := grpc.NewServer()
	csipb.RegisterIdentityServer(srv, exampleDriver{})
	csipb.RegisterNodeServer(srv, exampleDriver{})
	served := make(chan error, 1)
	go func() { served <- srv.Serve(l) }()

	h := csi.New(csi.Options{})
	m, err := pluginmanager.New(pluginmanager.Options{Dir: registry})
	if err != nil {
		log.Fatal(err)
	}
	m.AddHandler(csi.Type, h)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	ran := make(chan error, 1)
	go func() { ran <- m.Run(ctx) }()

	// node-driver-registrar announces the driver; the plugin SDK plays its part here.
	registrar, err := plugin.Start(plugin.Config{
		Dir: registry, Socket: "csi.example.com-reg.sock",
		Type: csi.Type, Name: "csi.example.com", Endpoint: endpoint, Versions: []string{"1.0.0"},
	})
	if err != nil {
		log.Fatal(err)
	}
	if err := registrar.WaitRegistered(ctx); err != nil {
		log.Fatal(err)
	}
	for _, d := range h.Drivers() {
		fmt.Println(d.Name, "CSI", d.Active.Version, "node", d.Active.NodeID, "max volumes", d.Active.MaxVolumes, d.Active.Topology)
	}

	registrar.Close()
	cancel()
	if err := <-ran; err != nil {
		log.Fatal(err)
	}
	h.Close() // once the manager has stopped: the handler stops watching endpoints
	srv.Stop()
	<-served
	// Output:
	// csi.example.com CSI 1.0.0 node node-1 max volumes 16 map[topology.example.com/zone:z1]
}

// exampleDriver is the least a CSI node plugin answers.
type exampleDriver struct {
	csipb.UnimplementedIdentityServer
	csipb.UnimplementedNodeServer
}

func (exampleDriver) GetPluginInfo(context.Context, *csipb.GetPluginInfoRequest) (*csipb.GetPluginInfoResponse, error) {
	return &csipb.GetPluginInfoResponse{Name: "csi.example.com", VendorVersion: "1.0.0"}, nil
}

func (exampleDriver) Probe(context.Context, *csipb.ProbeRequest) (*csipb.ProbeResponse, error) {
	return &csipb.ProbeResponse{}, nil
}

func (exampleDriver) NodeGetCapabilities(context.Context, *csipb.NodeGetCapabilitiesRequest) (*csipb.NodeGetCapabilitiesResponse, error) {
	return &csipb.NodeGetCapabilitiesResponse{}, nil
}

func (exampleDriver) NodeGetInfo(context.Context, *csipb.NodeGetInfoRequest) (*csipb.NodeGetInfoResponse, error) {
	return &csipb.NodeGetInfoResponse{
		NodeId:             "node-1",
		MaxVolumesPerNode:  16,
		AccessibleTopology: &csipb.Topology{Segments: map[string]string{"topology.example.com/zone": "z1"}},
	}, nil
}
