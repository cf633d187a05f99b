package conformance

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/apimachinery/pkg/util/validation"
	drahealthv1 "k8s.io/kubelet/pkg/apis/dra-health/v1"
	drahealthv1alpha1 "k8s.io/kubelet/pkg/apis/dra-health/v1alpha1"
	drav1 "k8s.io/kubelet/pkg/apis/dra/v1"
	drav1beta1 "k8s.io/kubelet/pkg/apis/dra/v1beta1"
)

// call bounds one call to the plugin's endpoint by the kit's timeout.
func (r *runner) call(ctx context.Context, what string) (context.Context, context.CancelFunc) {
	return withDeadline(ctx, r.cfg.Timeout, what+" to answer")
}

// csiSuite checks a CSI driver's Identity and Node services, as the
// kubelet and the registrar call them.
func (r *runner) csiSuite(ctx context.Context, info PluginInfo, ep *grpc.ClientConn) {
	began := time.Now()
	cctx, cancel := r.call(ctx, "GetPluginInfo")
	pi, err := csi.NewIdentityClient(ep).GetPluginInfo(cctx, &csi.GetPluginInfoRequest{})
	cancel()
	switch {
	case err != nil:
		err = fmt.Errorf("GetPluginInfo: %w", err)
	case pi.GetName() != info.Name:
		err = fmt.Errorf("GetPluginInfo names the driver %q; it registered as %q", quote(pi.GetName()), info.Name)
	case pi.GetVendorVersion() == "":
		err = errors.New("GetPluginInfo gives no vendor version")
	}
	r.check(checkCSIPluginInfo, err, fmt.Sprintf("GetPluginInfo: %q, vendor version %q", info.Name, quote(pi.GetVendorVersion())), began)

	began = time.Now()
	cctx, cancel = r.call(ctx, "Probe")
	probe, err := csi.NewIdentityClient(ep).Probe(cctx, &csi.ProbeRequest{})
	cancel()
	if err == nil && probe.GetReady() != nil && !probe.GetReady().GetValue() {
		err = errors.New("Probe answers not ready")
	} else if err != nil {
		err = fmt.Errorf("Probe: %w", err)
	}
	r.check(checkCSIProbe, err, "Probe answered ready", began)

	began = time.Now()
	cctx, cancel = r.call(ctx, "NodeGetInfo")
	ni, err := csi.NewNodeClient(ep).NodeGetInfo(cctx, &csi.NodeGetInfoRequest{})
	cancel()
	if err != nil {
		err = fmt.Errorf("NodeGetInfo: %w", err)
	} else {
		err = judgeNodeInfo(ni)
	}
	r.check(checkCSINodeInfo, err, fmt.Sprintf("node id %q, max volumes %d, topology %v",
		quote(ni.GetNodeId()), ni.GetMaxVolumesPerNode(), ni.GetAccessibleTopology().GetSegments()), began)
	r.checkCSISanity(ctx, info)
}

// judgeNodeInfo says what the kubelet would refuse in a NodeGetInfo answer:
// it writes the node id to CSINode and the topology to the Node's labels.
func judgeNodeInfo(ni *csi.NodeGetInfoResponse) error {
	if ni.GetNodeId() == "" {
		return errors.New("NodeGetInfo gives no node id; the kubelet refuses the driver (driverNodeID must not be empty)")
	}
	if ni.GetMaxVolumesPerNode() < 0 {
		return fmt.Errorf("NodeGetInfo gives max volumes %d; it must not be negative", ni.GetMaxVolumesPerNode())
	}
	for k, v := range ni.GetAccessibleTopology().GetSegments() {
		if msgs := validation.IsQualifiedName(k); len(msgs) > 0 {
			return fmt.Errorf("topology key %q is not a label key: %s", quote(k), strings.Join(msgs, "; "))
		}
		if msgs := validation.IsValidLabelValue(v); len(msgs) > 0 {
			return fmt.Errorf("topology value %q of %q is not a label value: %s", quote(v), quote(k), strings.Join(msgs, "; "))
		}
	}
	return nil
}

// draSuite checks a DRA driver's services on its endpoint.
func (r *runner) draSuite(ctx context.Context, info PluginInfo, ep *grpc.ClientConn) {
	began := time.Now()
	var missing []string
	var first string
	for _, v := range info.Versions {
		if v != drav1.DRAPluginService && v != drav1beta1.DRAPluginService {
			continue
		}
		if err := prepareEmpty(ctx, r, ep, v); status.Code(err) == codes.Unimplemented {
			missing = append(missing, v)
		} else if first == "" {
			first = v
		}
	}
	var err error
	if len(missing) > 0 {
		err = fmt.Errorf("announced but not served: %q", missing)
	}
	r.check(checkDRAServices, err, "every DRA service announced is served", began)

	if first != "" {
		began = time.Now()
		r.check(checkDRAEmpty, prepareEmpty(ctx, r, ep, first), "NodePrepareResources and NodeUnprepareResources answered an empty request on "+first, began)
	}
	r.checkDRAHealth(ctx, info, ep)
	r.checkResourceSlices(ctx, info)
}

// prepareEmpty sends an empty NodePrepareResources and
// NodeUnprepareResources on the DRA service named service.
func prepareEmpty(ctx context.Context, r *runner, ep *grpc.ClientConn, service string) error {
	cctx, cancel := r.call(ctx, "NodePrepareResources and NodeUnprepareResources")
	defer cancel()
	var err error
	if service == drav1.DRAPluginService {
		c := drav1.NewDRAPluginClient(ep)
		if _, err = c.NodePrepareResources(cctx, &drav1.NodePrepareResourcesRequest{}); err == nil {
			_, err = c.NodeUnprepareResources(cctx, &drav1.NodeUnprepareResourcesRequest{})
		}
	} else {
		c := drav1beta1.NewDRAPluginClient(ep)
		if _, err = c.NodePrepareResources(cctx, &drav1beta1.NodePrepareResourcesRequest{}); err == nil {
			_, err = c.NodeUnprepareResources(cctx, &drav1beta1.NodeUnprepareResourcesRequest{})
		}
	}
	if err != nil {
		return fmt.Errorf("%s: %w", service, err)
	}
	return nil
}

// checkDRAHealth checks that each health service is served if and only if
// it is announced.
func (r *runner) checkDRAHealth(ctx context.Context, info PluginInfo, ep *grpc.ClientConn) {
	began := time.Now()
	var problems, seen []string
	for _, service := range []string{drahealthv1.DRAResourceHealthService, drahealthv1alpha1.DRAResourceHealthService} {
		announced := slices.Contains(info.Versions, service)
		served, err := healthServed(ctx, ep, service)
		switch {
		case err != nil:
			problems = append(problems, err.Error())
		case announced && !served:
			problems = append(problems, service+" is announced but not served: the kubelet's health stream fails")
		case !announced && served:
			problems = append(problems, service+" is served but not announced: the kubelet never reads it")
		}
		seen = append(seen, fmt.Sprintf("%s announced %t, served %t", service, announced, served))
	}
	var err error
	if len(problems) > 0 {
		err = errors.New(strings.Join(problems, "; "))
	}
	r.check(checkDRAHealth, err, strings.Join(seen, "; "), began)
}

// healthServed opens the health stream of service and waits firstAnswer
// for its first message or its end: Unimplemented means not served; a
// report, a stream still open then, or one ended without an error, means
// served.
func healthServed(ctx context.Context, ep *grpc.ClientConn, service string) (bool, error) {
	ctx, cancel := withDeadline(ctx, firstAnswer, service+" NodeWatchResources to answer or end")
	defer cancel()
	var err error
	if service == drahealthv1.DRAResourceHealthService {
		var s grpc.ServerStreamingClient[drahealthv1.NodeWatchResourcesResponse]
		if s, err = drahealthv1.NewDRAResourceHealthClient(ep).NodeWatchResources(ctx, &drahealthv1.NodeWatchResourcesRequest{}); err == nil {
			_, err = s.Recv()
		}
	} else {
		var s grpc.ServerStreamingClient[drahealthv1alpha1.NodeWatchResourcesResponse]
		if s, err = drahealthv1alpha1.NewDRAResourceHealthClient(ep).NodeWatchResources(ctx, &drahealthv1alpha1.NodeWatchResourcesRequest{}); err == nil {
			_, err = s.Recv()
		}
	}
	if errors.Is(err, io.EOF) {
		// Ended at once, without a report: the service answered, so it is
		// served (the kubelet opens the stream again). Seen of
		// kubeletplugin's v1alpha1 bridge under load.
		return true, nil
	}
	switch status.Code(err) {
	case codes.OK, codes.DeadlineExceeded:
		return true, nil
	case codes.Unimplemented:
		return false, nil
	}
	return false, fmt.Errorf("%s NodeWatchResources: %w", service, err)
}
