package doctor

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	utilversion "k8s.io/apimachinery/pkg/util/version"
	drahealthv1 "k8s.io/kubelet/pkg/apis/dra-health/v1"
	drahealthv1alpha1 "k8s.io/kubelet/pkg/apis/dra-health/v1alpha1"
	drav1 "k8s.io/kubelet/pkg/apis/dra/v1"
	drav1beta1 "k8s.io/kubelet/pkg/apis/dra/v1beta1"

	"github.com/plugd/plugd/api"
)

// What the kubelet and a DRA driver may disagree on (issue 34 item 3):
// which services the kubelet uses of those the driver advertises in its
// registration (GetInfo's supported versions, gRPC service names), whether
// the driver serves the health service the kubelet asks for, and whose
// ResourceSlices are published for a node whose kubelet does not hold
// the driver. The kubelet's rules are those of its
// pkg/kubelet/cm/dra/plugin (v1.36 and v1.37).

// The services the kubelet knows, newest first (its
// servicesSupportedByKubelet and healthServicesSupportedByKubelet).
var (
	kubeletDRAServicesKnown    = []string{drav1.DRAPluginService, drav1beta1.DRAPluginService}
	kubeletHealthServicesKnown = []string{drahealthv1.DRAResourceHealthService, drahealthv1alpha1.DRAResourceHealthService}
)

// kubeletWipeDelay is how long after it lost a DRA driver's last
// connection the kubelet deletes the driver's ResourceSlices of its node
// (defaultWipingDelay in v1.37's pkg/kubelet/cm/dra); it deletes all of
// its node's when it starts. sliceSettle is the margin beyond it after
// which slices the kubelet should have deleted are a finding: its delete
// is retried with a backoff from 1s.
const (
	kubeletWipeDelay = 30 * time.Second
	sliceSettle      = 10 * time.Second
	// maxSliceFindings bounds the drivers told of one by one; anyone who
	// may create ResourceSlices can name thousands.
	maxSliceFindings = 16
)

// kubeletServices are the services a kubelet uses with a DRA driver, by
// the kubelet's own rules.
type kubeletServices struct {
	// Service is the DRA service it calls NodePrepareResources on: the
	// first of the driver's versions it knows (the driver's order).
	Service string
	// Health is the health service it asks for a stream: from v1.37 the
	// first of v1 and v1alpha1 (the kubelet's order) the driver
	// advertises, none if it advertises neither. A v1.36 kubelet, with its
	// feature ResourceHealthStatus (beta, on by default), asks every
	// driver for v1alpha1, advertised or not, again every 5 s while it
	// fails (kubernetes/kubernetes#141855); EveryDriver says so. Before
	// v1.36 the feature is alpha, off by default: none.
	Health      string
	EveryDriver bool
}

// kubeletMinor is the minor version of a kubelet of version v (as its Node
// reports it: "v1.37.2", "v1.36.3+k3s1"), 0 if unknown.
func kubeletMinor(v string) int {
	pv, err := utilversion.ParseGeneric(v)
	if err != nil || pv.Major() != 1 {
		return 0
	}
	return int(pv.Minor())
}

// servicesOf are the services a kubelet of minor version minor (0:
// unknown, taken as the newest) uses with a driver that advertises
// versions.
func servicesOf(versions []string, minor int) kubeletServices {
	var s kubeletServices
	for _, v := range versions {
		if slices.Contains(kubeletDRAServicesKnown, v) {
			s.Service = v
			break
		}
	}
	switch {
	case minor == 36:
		s.Health, s.EveryDriver = drahealthv1alpha1.DRAResourceHealthService, true
	case minor == 0 || minor > 36:
		for _, h := range kubeletHealthServicesKnown {
			if slices.Contains(versions, h) {
				s.Health = h
				break
			}
		}
	}
	return s
}

// kubeletNamed is the kubelet as the evidence names it: with its version
// when the Node reports one.
func (c *checker) kubeletNamed() string {
	k := c.in.Kubelet
	switch {
	case k == nil || k.Version == "":
		return "the kubelet"
	case kubeletMinor(k.Version) == 0:
		// A kubelet built without its version (a development build)
		// reports v0.0.0-master: judged by the newest rules.
		return fmt.Sprintf("the kubelet (of no release version: its Node reports %q)", k.Version)
	}
	return "the kubelet (" + k.Version + ")"
}

// draServices reports what the kubelet and a DRA driver that answers
// disagree on: the health service (advertised and not served, served and
// not advertised, asked for by a v1.36 kubelet and not served), and a DRA
// service older than one both speak.
func (c *checker) draServices(p *Target, l look) {
	if p.Type != api.DRAPlugin || !p.Answering || p.Remembered {
		return
	}
	minor := 0
	if c.in.Kubelet != nil {
		minor = kubeletMinor(c.in.Kubelet.Version)
	}
	s := servicesOf(p.Versions, minor)
	if s.Service == "" {
		return // versions-refused says why
	}
	picked := fmt.Sprintf("%s uses %s and %s with it, from its versions [%s]", c.kubeletNamed(), s.Service, orText(s.Health, "no health service"), strings.Join(p.Versions, ", "))
	if f, ok := c.healthDisagreement(p, l, s, minor, picked); ok {
		c.add(about(f, p))
	}
	if s.Service != drav1.DRAPluginService && slices.Contains(p.Versions, drav1.DRAPluginService) {
		c.add(about(api.Finding{Severity: api.SeverityInfo, Check: "dra-service-version",
			Summary:  fmt.Sprintf("the kubelet calls this driver's %s, though it serves %s too: the kubelet takes the first service of the driver's versions it knows", s.Service, drav1.DRAPluginService),
			Evidence: []string{picked},
			Remedy:   fmt.Sprintf("list %s first in the driver's supported versions (kubeletplugin lists the newest first), so that the kubelet and the driver use the same, newest API", drav1.DRAPluginService)}, p))
	}
}

// healthDisagreement is the finding, if any, of the health service the
// kubelet uses (s) and what the driver answered when asked for each
// version (l.health).
func (c *checker) healthDisagreement(p *Target, l look, s kubeletServices, minor int, picked string) (api.Finding, bool) {
	answered := func(svc string) string {
		return fmt.Sprintf("NodeWatchResources (%s) on %s: %s", svc, p.Endpoint, l.health[svc])
	}
	switch {
	case s.EveryDriver && l.health[s.Health] == healthUnimplemented:
		f := api.Finding{Severity: api.SeverityWarning, Check: "health-service-expected",
			Summary:  fmt.Sprintf("%s asks every DRA driver for %s, advertised or not, and this driver does not serve it: the kubelet logs an error every 5 s (kubernetes/kubernetes#141855)", c.kubeletNamed(), s.Health),
			Evidence: []string{picked, answered(s.Health)},
			Remedy: "the disagreement is the v1.36 kubelet's (v1.37 asks only drivers that advertise the service): upgrade the kubelet, or turn its feature gate ResourceHealthStatus off if no driver on the node reports device health; " +
				"a driver quiets it by serving " + s.Health + " (kubeletplugin v0.37 serves it beside v1 unless HealthV1alpha1(false))"}
		if !slices.Contains(p.Versions, s.Health) {
			f.Evidence = append(f.Evidence, "the driver does not advertise "+s.Health+": a v1.36 kubelet asks all the same")
		}
		return f, true
	case s.EveryDriver:
		return api.Finding{}, false
	case s.Health != "" && l.health[s.Health] == healthUnimplemented:
		f := api.Finding{Severity: api.SeverityWarning, Check: "health-service-missing",
			Summary:  "the DRA driver advertises a device health service it does not implement",
			Evidence: []string{picked, answered(s.Health)},
			Remedy:   "serve the DRA health service the versions name, or remove it from the driver's supported versions (kubeletplugin: HealthService(false) for a driver without health reporting)"}
		// A v1.37 kubelet asks once, takes Unimplemented for "no health
		// reporting" and stops until the driver registers again.
		f.Evidence = append(f.Evidence, "a v1.37 kubelet asks once per registration and stops at Unimplemented; a v1.36 kubelet asks every 5 s")
		if minor > 36 {
			f.Severity = api.SeverityInfo
		}
		return f, true
	case s.Health == "":
		var served []string
		for _, h := range kubeletHealthServicesKnown {
			if l.health[h].served() {
				served = append(served, h)
			}
		}
		if len(served) == 0 || minor != 0 && minor < 36 {
			return api.Finding{}, false
		}
		ev := []string{picked}
		for _, h := range served {
			ev = append(ev, answered(h))
		}
		return api.Finding{Severity: api.SeverityWarning, Check: "health-service-unadvertised",
			Summary:  fmt.Sprintf("the DRA driver serves a device health service it does not advertise: %s never asks for it, so its devices' health reaches no pod status", c.kubeletNamed()),
			Evidence: ev,
			Remedy:   "list " + served[0] + " in the driver's supported versions (kubeletplugin advertises it unless HealthService(false))"}, true
	}
	return api.Finding{}, false
}

// draSlices reports ResourceSlices published for this node of a DRA
// driver that the running kubelet does not hold (the kubelet deletes them
// when it lets the driver go, and at its start: slices that outlast that
// are published without the kubelet), and of drivers with no registration
// socket here at all.
func (c *checker) draSlices() {
	told, more := 0, 0
	for _, driver := range slices.Sorted(maps.Keys(c.in.DRASlices)) {
		n := c.in.DRASlices[driver]
		var socks []*Target
		for i := range c.in.Plugins {
			if p := &c.in.Plugins[i]; p.Type == api.DRAPlugin && p.Name == driver {
				socks = append(socks, p)
			}
		}
		var f api.Finding
		var ok bool
		if len(socks) == 0 {
			f, ok = c.slicesWithoutDriver(driver, n), true
		} else {
			f, ok = c.slicesNotHeld(driver, n, socks)
		}
		switch {
		case !ok:
		case told < maxSliceFindings:
			told++
			c.add(f)
		default:
			more++
		}
	}
	if more > 0 {
		c.add(api.Finding{Severity: api.SeverityWarning, Check: "dra-slices-unregistered", Type: api.DRAPlugin,
			Summary:  fmt.Sprintf("ResourceSlices of %d more DRA drivers are published for this node while the kubelet does not hold them", more),
			Evidence: []string{fmt.Sprintf("plugd tells of the first %d drivers one by one", maxSliceFindings)},
			Remedy:   c.listSlices("")})
	}
}

// listSlices is the command that lists this node's ResourceSlices, of
// driver if not empty.
func (c *checker) listSlices(driver string) string {
	sel := "spec.nodeName=" + orText(c.in.NodeName, "NODE")
	if driver != "" {
		sel += ",spec.driver=" + driver
	}
	return "kubectl get resourceslices --field-selector " + sel
}

// slicesWithoutDriver is the finding of n ResourceSlices of a driver that
// has no registration socket in plugd's view.
func (c *checker) slicesWithoutDriver(driver string, n int) api.Finding {
	node := orText(c.in.NodeName, "NODE")
	ev := []string{
		fmt.Sprintf("%d ResourceSlices with spec.driver %s and spec.nodeName %s (%s)", n, driver, node, c.listSlices(driver)),
		fmt.Sprintf("no registration socket of DRA driver %s in %s (%d sockets there)", driver, c.in.RegistryDir, len(c.in.Plugins)),
		fmt.Sprintf("the kubelet deletes a driver's slices %s after it loses the driver's last connection, and all of its node's when it starts: if the driver stopped less than %s ago, they go by themselves", kubeletWipeDelay, kubeletWipeDelay),
	}
	if k := c.in.Kubelet; k != nil && k.Reason == "KubeletNotRunning" {
		ev = append(ev, "the kubelet is not running: it deletes the node's slices when it starts")
	}
	return api.Finding{Severity: api.SeverityWarning, Check: "dra-slices-unregistered", Type: api.DRAPlugin, Name: driver,
		Summary:  fmt.Sprintf("%d ResourceSlices of DRA driver %s are published for this node, but the driver is not registered here at all: the scheduler places pods whose claims the kubelet cannot prepare", n, driver),
		Evidence: ev,
		Remedy: fmt.Sprintf("if the driver should run on this node, start its kubelet plugin (is its DaemonSet's pod scheduled here, writing its socket into %s?); if not, stop whatever publishes them (a controller of the driver's, an old release) and delete them: kubectl delete resourceslices --field-selector spec.nodeName=%s,spec.driver=%s",
			c.in.RegistryDir, node, driver)}
}

// slicesNotHeld is the finding, if any, of n ResourceSlices of a driver
// whose sockets socks the running kubelet has held none of for longer
// than it takes to delete them.
func (c *checker) slicesNotHeld(driver string, n int, socks []*Target) (api.Finding, bool) {
	if k := c.in.Kubelet; k == nil || !k.Live {
		return api.Finding{}, false // what the kubelet holds is not known
	}
	var ev []string
	var reason string
	for _, p := range socks {
		v := p.Kubelet
		if v == nil || v.State != api.KubeletNotRegistered || v.Since.IsZero() || c.in.Now.Sub(v.Since) < kubeletWipeDelay+sliceSettle {
			return api.Finding{}, false
		}
		reason = cmp.Or(reason, v.Reason)
		ev = append(ev, fmt.Sprintf("%s: %s (since %s, %s ago)", p.Socket, v.Message, v.Since.Format(time.RFC3339), c.in.Now.Sub(v.Since).Round(time.Second)))
	}
	ev = append(ev, fmt.Sprintf("%d ResourceSlices with spec.driver %s and spec.nodeName %s (%s)", n, driver, orText(c.in.NodeName, "NODE"), c.listSlices(driver)),
		fmt.Sprintf("the kubelet deletes a driver's slices %s after it loses the driver's last connection, and all of its node's when it starts: these were published since, without the kubelet", kubeletWipeDelay))
	f := api.Finding{Severity: api.SeverityWarning, Check: "dra-slices-not-held", Type: api.DRAPlugin, Name: driver, Socket: socks[0].Socket,
		Summary:  fmt.Sprintf("%d ResourceSlices of DRA driver %s are published for this node, but the running kubelet does not hold the driver: the scheduler places pods whose claims the kubelet cannot prepare", n, driver),
		Evidence: ev}
	switch reason {
	case "SeenNotRegistered":
		f.Remedy = "the kubelet refuses the driver's registration while the driver publishes: fix the registration first (see the kubelet-not-registered finding and the kubelet's log: journalctl -u kubelet | grep " + driver + ")"
	case "KubeletRestarted":
		f.Remedy = "the kubelet deleted the node's slices at its start and the driver published them again without registering since (the restart race): restart the driver's pod, so that it registers; a driver should publish only while registered"
	default:
		f.Remedy = "the driver's kubelet plugin is gone or not answering while something of the driver still publishes: restart the driver's pod; if the kubelet then does not take up its socket, see the kubelet-not-registered finding"
	}
	return f, true
}

// orText is s, or none if s is empty.
func orText(s, none string) string {
	if s == "" {
		return none
	}
	return s
}
