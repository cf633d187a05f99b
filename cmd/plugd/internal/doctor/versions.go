package doctor

import (
	"fmt"
	"slices"
	"strings"

	utilversion "k8s.io/apimachinery/pkg/util/version"
	drav1 "k8s.io/kubelet/pkg/apis/dra/v1"
	drav1beta1 "k8s.io/kubelet/pkg/apis/dra/v1beta1"

	"github.com/plugd/plugd/api"
)

// refusedVersions reports a plugin whose versions the kubelet would refuse
// at validation, as the kubelet's handler for its type checks them.
func refusedVersions(p *Target) (api.Finding, bool) {
	f := api.Finding{Severity: api.SeverityError, Check: "versions-refused",
		Evidence: []string{"versions: [" + strings.Join(p.Versions, ", ") + "]"}}
	switch p.Type {
	case api.CSIPlugin:
		// The kubelet takes the highest version up to 1.x, and speaks CSI 1.
		if v, err := utilversion.HighestSupportedVersion(p.Versions); err == nil && v.Major() == 1 {
			return f, false
		}
		f.Summary = "the kubelet refuses this CSI driver: it offers no CSI 1.x version"
		f.Remedy = "upgrade the driver (or node-driver-registrar) to one that speaks CSI 1.x; its GetInfo must list a version such as 1.0.0"
	case api.DRAPlugin:
		if slices.Contains(p.Versions, drav1.DRAPluginService) || slices.Contains(p.Versions, drav1beta1.DRAPluginService) {
			return f, false
		}
		f.Summary = fmt.Sprintf("the kubelet refuses this DRA driver: it offers neither %s nor %s", drav1.DRAPluginService, drav1beta1.DRAPluginService)
		f.Remedy = "build the driver with a k8s.io/dynamic-resource-allocation/kubeletplugin that serves " + drav1.DRAPluginService
	case api.DevicePlugin:
		if slices.Contains(p.Versions, "v1beta1") {
			return f, false
		}
		f.Summary = "the kubelet refuses this device plugin: it does not offer v1beta1"
		f.Remedy = "the kubelet's device manager speaks only the v1beta1 device plugin API: list v1beta1 in the plugin's versions"
	default:
		return f, false
	}
	return f, true
}
