package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"os"
	"os/signal"
	"syscall"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/utils/ptr"
)

// draDriverName is the name the dra test plugin registers and publishes
// under.
const draDriverName = "dra.conformance.plugd.example.com"

// draDriver runs a DRA driver on kubeletplugin that publishes one pool of
// two devices for its node through the API server --kubeconfig names,
// until SIGTERM or SIGINT. --break breaks its slices: incomplete-pool
// writes one slice of a pool that says it has two, as a driver that died
// halfway through publishing leaves it; wrong-node publishes for another
// node than the one it was given; wrong-driver publishes under another
// driver name than it registers.
func draDriver(args []string) error {
	fs := flag.NewFlagSet("dra", flag.ExitOnError)
	regDir := fs.String("registry-dir", "", "the kubelet's plugin registry directory")
	pluginDir := fs.String("plugin-dir", "", "the directory of the driver's DRA socket")
	kubeconfig := fs.String("kubeconfig", "", "the API server to publish ResourceSlices to")
	nodeName := fs.String("node-name", "", "the node the driver runs on")
	nodeUID := fs.String("node-uid", "", "the Node's UID, the owner of its slices")
	brk := fs.String("break", "", "incomplete-pool, wrong-node or wrong-driver")
	fs.Parse(args)
	cfg, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
	if err != nil {
		return err
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	publishFor := *nodeName
	if *brk == "wrong-node" {
		publishFor = *nodeName + "-other"
	}
	ctx := context.Background()
	helper, err := kubeletplugin.Start(ctx, draPrepare{},
		kubeletplugin.DriverName(draDriverName),
		kubeletplugin.KubeClient(client),
		kubeletplugin.NodeName(publishFor),
		kubeletplugin.NodeUID(types.UID(*nodeUID)),
		kubeletplugin.RegistrarDirectoryPath(*regDir),
		kubeletplugin.PluginDataDirectoryPath(*pluginDir))
	if err != nil {
		return err
	}
	defer helper.Stop()
	devices := []resourceapi.Device{{Name: "dev-0"}, {Name: "dev-1"}}
	if *brk == "incomplete-pool" || *brk == "wrong-driver" {
		slice := &resourceapi.ResourceSlice{
			ObjectMeta: metav1.ObjectMeta{GenerateName: *nodeName + "-" + draDriverName + "-"},
			Spec: resourceapi.ResourceSliceSpec{Driver: draDriverName, NodeName: ptr.To(*nodeName), Devices: devices[:1],
				Pool: resourceapi.ResourcePool{Name: *nodeName, Generation: 1, ResourceSliceCount: 2}},
		}
		if *brk == "wrong-driver" {
			slice.Spec.Driver, slice.Spec.Pool.ResourceSliceCount = "other."+draDriverName, 1
		}
		if _, err := client.ResourceV1().ResourceSlices().Create(ctx, slice, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("creating a slice: %w", err)
		}
	} else {
		err := helper.PublishResources(ctx, resourceslice.DriverResources{Pools: map[string]resourceslice.Pool{
			publishFor: {Slices: []resourceslice.Slice{{Devices: devices}}}}})
		if err != nil {
			return err
		}
	}
	log.Printf("DRA driver %s on node %s, registration in %s", draDriverName, *nodeName, *regDir)
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	<-sig
	return nil
}

// draPrepare prepares and unprepares every claim, with nothing to do.
type draPrepare struct{}

func (draPrepare) PrepareResourceClaims(_ context.Context, claims []*resourceapi.ResourceClaim) (map[types.UID]kubeletplugin.PrepareResult, error) {
	result := make(map[types.UID]kubeletplugin.PrepareResult, len(claims))
	for _, c := range claims {
		result[c.UID] = kubeletplugin.PrepareResult{}
	}
	return result, nil
}

func (draPrepare) UnprepareResourceClaims(_ context.Context, claims []kubeletplugin.NamespacedObject) (map[types.UID]error, error) {
	result := make(map[types.UID]error, len(claims))
	for _, c := range claims {
		result[c.UID] = nil
	}
	return result, nil
}

func (draPrepare) HandleError(_ context.Context, err error, msg string) {
	log.Printf("%s: %v", msg, err)
}

// WatchHealthStatus reports nothing: the devices are all as published.
func (draPrepare) WatchHealthStatus(ctx context.Context, _ chan<- kubeletplugin.DeviceHealthReport) error {
	<-ctx.Done()
	return nil
}
