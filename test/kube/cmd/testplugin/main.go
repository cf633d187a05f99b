// Command testplugin is the field's plugins as processes, for the tests
// beside a real kubelet (node-driver-registrar and the hostpath driver
// cannot be had here as modules):
//
//	testplugin registrar --csi-address SOCK --plugin-registration-path DIR --kubelet-registration-path SOCK
//	testplugin csi --endpoint SOCK --name NAME --node-id ID [--topology-key KEY] [--no-validation]
//	testplugin csi-mock --endpoint SOCK [--name NAME] [--attach-limit N] [--enable-topology] [--disable-attach]
//	testplugin dra --registry-dir DIR --plugin-dir DIR --kubeconfig FILE --node-name NODE --node-uid UID [--break incomplete-pool|wrong-node|wrong-driver]
//
// registrar behaves as node-driver-registrar does: it asks the driver its
// name (GetPluginInfo), unlinks a stale DIR/NAME-reg.sock, serves the
// kubelet's Registration service there (k8s.io/kubelet's
// pluginregistration v1), exits with status 1 when told registered=false,
// removes its socket on SIGTERM or SIGINT and leaves it on SIGKILL.
//
// csi is a CSI node plugin (github.com/container-storage-interface/spec):
// Identity, and NodeGetInfo with the node id and, under KEY, the node id
// as its accessible topology, as the hostpath driver reports it;
// NodePublishVolume and NodeUnpublishVolume refuse a request that lacks
// what the spec requires, and publish nothing.
//
// csi-mock is the Kubernetes e2e tests' CSI mock driver (k8s.io/kubernetes
// test/e2e/storage/drivers/csi-test), served as a process (csimock.go).
//
// dra is a DRA driver on k8s.io/dynamic-resource-allocation/kubeletplugin
// that publishes one pool of two devices for its node (dra.go).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
)

func main() {
	log.SetFlags(log.Lmicroseconds)
	if len(os.Args) < 2 {
		log.Fatal("usage: testplugin registrar|csi|csi-mock|dra FLAGS")
	}
	var err error
	switch os.Args[1] {
	case "registrar":
		err = registrar(os.Args[2:])
	case "csi":
		err = driver(os.Args[2:])
	case "csi-mock":
		err = csiMock(os.Args[2:])
	case "dra":
		err = draDriver(os.Args[2:])
	default:
		err = fmt.Errorf("unknown command %q", os.Args[1])
	}
	if err != nil {
		log.Fatal(err)
	}
}

// registration is the kubelet's Registration service, as
// node-driver-registrar serves it.
type registration struct {
	registerapi.UnimplementedRegistrationServer
	name, endpoint string
	exit           chan error
}

func (r *registration) GetInfo(context.Context, *registerapi.InfoRequest) (*registerapi.PluginInfo, error) {
	log.Printf("GetInfo: %s at %s", r.name, r.endpoint)
	return &registerapi.PluginInfo{Type: registerapi.CSIPlugin, Name: r.name, Endpoint: r.endpoint, SupportedVersions: []string{"1.0.0"}}, nil
}

func (r *registration) NotifyRegistrationStatus(_ context.Context, s *registerapi.RegistrationStatus) (*registerapi.RegistrationStatusResponse, error) {
	if !s.PluginRegistered {
		log.Printf("Registration process failed with error: %s, restarting registration container.", s.Error)
		select {
		case r.exit <- errors.New(s.Error):
		default:
		}
	} else {
		log.Printf("registered")
	}
	return &registerapi.RegistrationStatusResponse{}, nil
}

func registrar(args []string) error {
	fs := flag.NewFlagSet("registrar", flag.ExitOnError)
	csiAddress := fs.String("csi-address", "", "the driver's CSI socket, as this container sees it")
	regDir := fs.String("plugin-registration-path", "", "the kubelet's plugin registry directory")
	endpoint := fs.String("kubelet-registration-path", "", "the driver's CSI socket on the host, which the kubelet dials")
	fs.Parse(args)
	// Ask the driver its name, as node-driver-registrar does before it
	// registers anything.
	conn, err := grpc.NewClient("unix://"+*csiAddress, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	info, err := csi.NewIdentityClient(conn).GetPluginInfo(ctx, &csi.GetPluginInfoRequest{}, grpc.WaitForReady(true))
	cancel()
	conn.Close()
	if err != nil {
		return fmt.Errorf("GetPluginInfo on %s: %w", *csiAddress, err)
	}
	sock := filepath.Join(*regDir, info.Name+"-reg.sock")
	if err := os.Remove(sock); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	l, err := net.Listen("unix", sock)
	if err != nil {
		return err
	}
	l.(*net.UnixListener).SetUnlinkOnClose(false) // removed on SIGTERM below, as node-driver-registrar does
	r := &registration{name: info.Name, endpoint: *endpoint, exit: make(chan error, 1)}
	s := grpc.NewServer()
	registerapi.RegisterRegistrationServer(s, r)
	go s.Serve(l)
	log.Printf("serving %s for %s", sock, info.Name)
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	select {
	case <-sig:
		s.Stop()
		os.Remove(sock)
		log.Printf("removed %s", sock)
		return nil
	case <-r.exit:
		os.Exit(1) // leaves the socket, as node-driver-registrar's exit does
	}
	return nil
}

// node is a CSI node plugin's Identity and Node services.
type node struct {
	csi.UnimplementedIdentityServer
	csi.UnimplementedNodeServer
	name, nodeID, topologyKey string
	// noValidation answers NodePublishVolume and NodeUnpublishVolume
	// Unimplemented whatever they are sent, as a driver that checks no
	// request does: csi-sanity's node tests fail it.
	noValidation bool
}

// NodePublishVolume refuses a request without a volume id, target path or
// capability, as the CSI spec says (csi-sanity checks it); it publishes
// nothing.
func (d *node) NodePublishVolume(_ context.Context, req *csi.NodePublishVolumeRequest) (*csi.NodePublishVolumeResponse, error) {
	switch {
	case d.noValidation:
	case req.GetVolumeId() == "":
		return nil, status.Error(codes.InvalidArgument, "no volume id")
	case req.GetTargetPath() == "":
		return nil, status.Error(codes.InvalidArgument, "no target path")
	case req.GetVolumeCapability() == nil:
		return nil, status.Error(codes.InvalidArgument, "no volume capability")
	}
	return nil, status.Error(codes.Unimplemented, "this driver publishes no volume")
}

// NodeUnpublishVolume refuses a request without a volume id or target
// path; it unpublishes nothing.
func (d *node) NodeUnpublishVolume(_ context.Context, req *csi.NodeUnpublishVolumeRequest) (*csi.NodeUnpublishVolumeResponse, error) {
	switch {
	case d.noValidation:
	case req.GetVolumeId() == "":
		return nil, status.Error(codes.InvalidArgument, "no volume id")
	case req.GetTargetPath() == "":
		return nil, status.Error(codes.InvalidArgument, "no target path")
	}
	return nil, status.Error(codes.Unimplemented, "this driver publishes no volume")
}

func (d *node) GetPluginInfo(context.Context, *csi.GetPluginInfoRequest) (*csi.GetPluginInfoResponse, error) {
	return &csi.GetPluginInfoResponse{Name: d.name, VendorVersion: "1.0.0"}, nil
}

func (d *node) GetPluginCapabilities(context.Context, *csi.GetPluginCapabilitiesRequest) (*csi.GetPluginCapabilitiesResponse, error) {
	return &csi.GetPluginCapabilitiesResponse{}, nil
}

func (d *node) Probe(context.Context, *csi.ProbeRequest) (*csi.ProbeResponse, error) {
	return &csi.ProbeResponse{}, nil
}

func (d *node) NodeGetCapabilities(context.Context, *csi.NodeGetCapabilitiesRequest) (*csi.NodeGetCapabilitiesResponse, error) {
	return &csi.NodeGetCapabilitiesResponse{}, nil
}

func (d *node) NodeGetInfo(context.Context, *csi.NodeGetInfoRequest) (*csi.NodeGetInfoResponse, error) {
	r := &csi.NodeGetInfoResponse{NodeId: d.nodeID, MaxVolumesPerNode: 16}
	if d.topologyKey != "" {
		r.AccessibleTopology = &csi.Topology{Segments: map[string]string{d.topologyKey: d.nodeID}}
	}
	return r, nil
}

func driver(args []string) error {
	fs := flag.NewFlagSet("csi", flag.ExitOnError)
	endpoint := fs.String("endpoint", "", "the CSI socket to serve")
	d := &node{}
	fs.StringVar(&d.name, "name", "", "the driver's name")
	fs.StringVar(&d.nodeID, "node-id", "", "the node id NodeGetInfo answers")
	fs.StringVar(&d.topologyKey, "topology-key", "", "a topology key whose value is the node id")
	fs.BoolVar(&d.noValidation, "no-validation", false, "answer NodePublishVolume and NodeUnpublishVolume Unimplemented, whatever the request")
	fs.Parse(args)
	os.Remove(*endpoint)
	l, err := net.Listen("unix", *endpoint)
	if err != nil {
		return err
	}
	s := grpc.NewServer()
	csi.RegisterIdentityServer(s, d)
	csi.RegisterNodeServer(s, d)
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	go func() {
		<-sig
		s.Stop()
	}()
	log.Printf("CSI driver %s (node %s) on %s", d.name, d.nodeID, *endpoint)
	return s.Serve(l)
}
