package csi

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"slices"
	"strings"
	"syscall"
	"time"
	"unicode"
	"unicode/utf8"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/plugd/plugd/internal/confine"
	"github.com/plugd/plugd/pluginmanager"
)

// Bounds on what a driver sends. The CSI spec's own limits are used where it
// sets one (128 bytes for a string, 4 KiB for a map, 256 bytes for a node ID);
// the rest keep a broken or hostile driver from costing memory.
const (
	maxRecvBytes      = 4 << 20 // per gRPC message, gRPC's default made explicit
	maxVendorVersion  = 128
	maxManifestBytes  = 4 << 10
	maxNodeID         = 256
	maxSegments       = 64
	maxSegmentKey     = 63 + 1 + 63 // prefix "/" name
	maxSegmentValue   = 63
	maxTopologyBytes  = 4 << 10
	maxCapabilities   = 64
	liveDialTimeout   = time.Second
	passthroughTarget = "passthrough:///csi-endpoint"
)

// errNotReady is what a Probe that answers ready=false turns into: the driver
// is still starting, and the registration is retried.
var errNotReady = errors.New("driver not ready")

// endpointPath is the path of the driver's socket, by the manager's one
// rule (pluginmanager.EndpointPath): a Plugin from the manager already has
// it; one from elsewhere may still be a unix:// URL.
func endpointPath(endpoint string) (string, error) {
	path, err := pluginmanager.EndpointPath(endpoint)
	if err != nil {
		return "", fmt.Errorf("CSI driver: %w", err)
	}
	return path, nil
}

// nodeInfo is what Register learns from the driver.
type nodeInfo struct {
	vendorVersion string
	manifest      map[string]string
	nodeID        string
	maxVolumes    int64
	topology      map[string]string
	capabilities  []string
}

// query asks p's driver, at endpoint (p's, made a path), who it is, whether
// it is ready, and what it knows of this node. The connection is confined to
// Options.EndpointRoots. Every call has its own deadline of h.callTimeout,
// bounded by ctx. Answers that break the spec, a name that is not the one the
// driver registered with, and a call the driver does not implement are
// terminal errors: retrying would get the same answer.
func (h *Handler) query(ctx context.Context, p pluginmanager.Plugin, endpoint string) (*nodeInfo, error) {
	name := p.Name
	confined := confine.For(endpoint, p.Socket, h.roots)
	dialer := func(ctx context.Context, _ string) (net.Conn, error) {
		return confined.Dial(ctx, endpoint)
	}
	// The dialer ignores the target, so a constant one keeps the path away
	// from gRPC's URL parsing.
	conn, err := grpc.NewClient(passthroughTarget,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithAuthority("localhost"),
		grpc.WithContextDialer(dialer),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(maxRecvBytes)),
	)
	if err != nil {
		return nil, fmt.Errorf("CSI endpoint %s: %w", endpoint, err)
	}
	// Only recorded for now, so the connection is not kept. The kubelet keeps a
	// client for its volume manager; a consumer of plugd's CSI drivers would
	// dial the Endpoint of the active Instance itself.
	defer conn.Close()
	identity := csipb.NewIdentityClient(conn)
	node := csipb.NewNodeClient(conn)
	var info nodeInfo

	pi, err := call(ctx, h, endpoint, "GetPluginInfo", func(ctx context.Context) (*csipb.GetPluginInfoResponse, error) {
		return identity.GetPluginInfo(ctx, &csipb.GetPluginInfoRequest{})
	})
	if err != nil {
		return nil, err
	}
	if got := pi.GetName(); got != name {
		return nil, pluginmanager.TerminalError(fmt.Errorf("CSI driver registered as %q, but its endpoint %s answers GetPluginInfo with the name %q: the registrar and the driver must use the same name", name, endpoint, printable(got, maxVendorVersion)))
	}
	info.vendorVersion = printable(pi.GetVendorVersion(), maxVendorVersion)
	info.manifest = boundManifest(pi.GetManifest())

	probe, err := call(ctx, h, endpoint, "Probe", func(ctx context.Context) (*csipb.ProbeResponse, error) {
		return identity.Probe(ctx, &csipb.ProbeRequest{})
	})
	if err != nil {
		return nil, err
	}
	// No answer means ready, says the spec.
	if r := probe.GetReady(); r != nil && !r.GetValue() {
		return nil, fmt.Errorf("CSI driver %q on %s: %w (Probe answered ready=false)", name, endpoint, errNotReady)
	}

	caps, err := call(ctx, h, endpoint, "NodeGetCapabilities", func(ctx context.Context) (*csipb.NodeGetCapabilitiesResponse, error) {
		return node.NodeGetCapabilities(ctx, &csipb.NodeGetCapabilitiesRequest{})
	})
	if err != nil {
		return nil, err
	}
	if info.capabilities, err = capabilities(caps.GetCapabilities()); err != nil {
		return nil, pluginmanager.TerminalError(fmt.Errorf("CSI driver %q on %s: invalid NodeGetCapabilities answer: %w", name, endpoint, err))
	}

	ni, err := call(ctx, h, endpoint, "NodeGetInfo", func(ctx context.Context) (*csipb.NodeGetInfoResponse, error) {
		return node.NodeGetInfo(ctx, &csipb.NodeGetInfoRequest{})
	})
	if err != nil {
		return nil, err
	}
	if err := checkNodeInfo(ni); err != nil {
		return nil, pluginmanager.TerminalError(fmt.Errorf("CSI driver %q on %s: invalid NodeGetInfo answer: %w", name, endpoint, err))
	}
	info.nodeID = ni.GetNodeId()
	info.maxVolumes = ni.GetMaxVolumesPerNode()
	info.topology = maps.Clone(ni.GetAccessibleTopology().GetSegments())
	return &info, nil
}

// call makes one RPC with a deadline of h.callTimeout under ctx, counts it, and
// names it in the error. A method the driver does not implement is terminal:
// they are all REQUIRED by the spec, and an endpoint without them is not a CSI
// driver (often it is the registration socket itself, sent as the endpoint).
func call[T any](ctx context.Context, h *Handler, endpoint, method string, rpc func(context.Context) (T, error)) (T, error) {
	ctx, cancel := context.WithTimeoutCause(ctx, h.callTimeout,
		fmt.Errorf("no answer within %s", h.callTimeout))
	defer cancel()
	resp, err := rpc(ctx)
	code := status.Code(err)
	h.metrics.calls.WithLabelValues(method, code.String()).Inc()
	if err == nil {
		return resp, nil
	}
	if code == codes.DeadlineExceeded {
		// The driver enforces our deadline too (gRPC sends it along) and may
		// report it a moment before our own context does; waiting for ours
		// is bounded by the same deadline, and its cause says how long we waited.
		<-ctx.Done()
	}
	if ctx.Err() != nil {
		err = context.Cause(ctx)
	}
	err = fmt.Errorf("CSI %s on %s: %w", method, endpoint, err)
	if code == codes.Unimplemented {
		return resp, pluginmanager.TerminalError(fmt.Errorf("%w (every CSI node plugin must implement it: is %s a CSI driver's socket?)", err, endpoint))
	}
	return resp, err
}

// capabilities names the node service capabilities, in the driver's order,
// without duplicates. One of a kind this version of the spec does not know is
// named by its number, as protobuf does.
func capabilities(cs []*csipb.NodeServiceCapability) ([]string, error) {
	if len(cs) > maxCapabilities {
		return nil, fmt.Errorf("%d capabilities, at most %d are accepted", len(cs), maxCapabilities)
	}
	names := []string{}
	for _, c := range cs {
		rpc := c.GetRpc()
		if rpc == nil {
			continue // a kind of capability newer than this spec
		}
		if n := rpc.GetType().String(); !slices.Contains(names, n) {
			names = append(names, n)
		}
	}
	return names, nil
}

// checkNodeInfo holds NodeGetInfo's answer to the spec's limits: the node ID is
// what a controller will be told, and the topology what volumes are scheduled
// by, so a truncated one would be wrong rather than short.
func checkNodeInfo(ni *csipb.NodeGetInfoResponse) error {
	id := ni.GetNodeId()
	switch {
	case id == "":
		return errors.New("node_id is empty, and the spec requires it")
	case len(id) > maxNodeID:
		return fmt.Errorf("node_id is %d bytes long, the spec allows at most %d", len(id), maxNodeID)
	case !isPrintable(id):
		return fmt.Errorf("node_id %q has a character that is not printable", id)
	}
	if n := ni.GetMaxVolumesPerNode(); n < 0 {
		return fmt.Errorf("max_volumes_per_node is %d, and the spec forbids negative values", n)
	}
	segs := ni.GetAccessibleTopology().GetSegments()
	if len(segs) > maxSegments {
		return fmt.Errorf("accessible_topology has %d segments, at most %d are accepted", len(segs), maxSegments)
	}
	total := 0
	for _, k := range slices.Sorted(maps.Keys(segs)) {
		v := segs[k]
		total += len(k) + len(v)
		switch {
		case k == "" || len(k) > maxSegmentKey || !isPrintable(k):
			return fmt.Errorf("accessible_topology key %.80q is empty, longer than %d bytes or not printable", k, maxSegmentKey)
		case v == "" || len(v) > maxSegmentValue || !isPrintable(v):
			return fmt.Errorf("accessible_topology value %.80q of %q is empty, longer than %d bytes or not printable", v, k, maxSegmentValue)
		}
	}
	if total > maxTopologyBytes {
		return fmt.Errorf("accessible_topology is %d bytes, the spec allows at most %d", total, maxTopologyBytes)
	}
	return nil
}

// boundManifest keeps the manifest, which is only shown, within the spec's
// 4 KiB: entries are taken in key order while they fit, the rest dropped.
func boundManifest(m map[string]string) map[string]string {
	if len(m) == 0 {
		return nil
	}
	out := make(map[string]string)
	total := 0
	for _, k := range slices.Sorted(maps.Keys(m)) {
		v := m[k]
		if total+len(k)+len(v) > maxManifestBytes {
			break
		}
		total += len(k) + len(v)
		out[printable(k, maxManifestBytes)] = printable(v, maxManifestBytes)
	}
	return out
}

func isPrintable(s string) bool {
	if !utf8.ValidString(s) {
		return false
	}
	return strings.IndexFunc(s, func(r rune) bool { return !unicode.IsPrint(r) }) < 0
}

// printable makes a string from a driver, which is only shown, safe to show:
// valid UTF-8, without characters a terminal would act on, and at most max
// bytes long.
func printable(s string, max int) string {
	s = strings.ToValidUTF8(s, "")
	s = strings.Map(func(r rune) rune {
		if unicode.IsPrint(r) {
			return r
		}
		return -1
	}, s)
	if len(s) > max {
		s = strings.ToValidUTF8(s[:max], "")
	}
	return s
}

// answers reports whether something listens on the unix socket at path. Only
// a refused connection or a missing file count as "no": a listener that is
// slow or busy is still there.
func answers(ctx context.Context, path string) bool {
	ctx, cancel := context.WithTimeout(ctx, liveDialTimeout)
	defer cancel()
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", path)
	if err != nil {
		return !errors.Is(err, syscall.ECONNREFUSED) && !errors.Is(err, syscall.ENOENT)
	}
	c.Close()
	return true
}
