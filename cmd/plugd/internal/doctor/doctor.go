// Package doctor is plugctl doctor's engine: it looks at a node's plugins
// the way an operator would when a plugin "does not work", and says what
// is wrong, on what evidence, and what to do.
//
// Check reads what plugd knows of each socket, and looks for itself where
// that is not enough: it connects to sockets that do not answer (to tell a
// dead plugin from one plugd may not reach), to the endpoints of plugins
// that answer, to a DRA driver's health service, and it looks for
// registration sockets under other kubelet root directories and for a
// running kubelet's --root-dir. Every look is read-only and bounded by a
// deadline.
package doctor

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/plugd/plugd/api"
	"github.com/plugd/plugd/internal/confine"
	"github.com/plugd/plugd/internal/dirtrust"
	"github.com/plugd/plugd/internal/nodecond"
	"github.com/plugd/plugd/internal/textsafe"
)

// Target is one registration socket the doctor examines, as plugd knows it.
type Target struct {
	Socket, Type, Name, Endpoint string
	Versions                     []string
	// State is plugd's (api.Plugin's); Reason and LastError say why a
	// socket is Failed or Rejected.
	State, Reason, LastError string
	Created                  time.Time
	// Answering says the plugin answers GetInfo now.
	Answering bool
	// Remembered says Type, Name, Endpoint and Versions are what the socket
	// said before it stopped answering.
	Remembered bool
	// Kubelet is the kubelet view, when plugd is connected to Kubernetes.
	Kubelet *api.KubeletView
}

// Expected is a plugin the node must have, or a resource (Type anyOf)
// any of the plugins in AnyOf may provide.
type Expected struct {
	Type, Name, Condition string
	AnyOf                 []Expected
}

// KubernetesProblem is trouble plugd has with the API server.
type KubernetesProblem struct {
	Operation, Reason, Message, Permission string
	Since                                  time.Time
}

// Confinement is what the API server answered when plugd asked it, in a
// dry run, to change a condition of its Node that is not plugd's.
type Confinement struct {
	// Confined says an admission policy refused it; NoClaim that it did
	// because plugd's token carries no node name.
	Confined, NoClaim bool
	Message           string
	At                time.Time
}

// KubeletAccess is how plugd reads the running kubelet's own state.
type KubeletAccess struct {
	// Address is its secure port.
	Address string
	// Live says plugd reads it; otherwise Reason, Message and Permission
	// say why not (kubenode's reasons: KubeletNotRunning,
	// KubeletForbidden, KubeletTLS...), since Since.
	Live                        bool
	Reason, Message, Permission string
	Since                       time.Time
	// Started is the kubelet's start; Restarted says plugd saw it restart.
	Started   time.Time
	Restarted bool
	// Version is the kubelet's version as its Node reports it ("v1.37.2");
	// empty if unknown. What the kubelet asks of DRA drivers depends on it.
	Version string
}

// Condition is an expected plugin's Node condition as the Node has it
// (Status empty: it has none), and the write plugd has not made yet.
type Condition struct {
	Type, Name, Condition   string
	Status, Reason, Message string
	Heartbeat, Transition   time.Time
	// Pending says plugd finds otherwise and has not written it yet:
	// WantStatus, WantReason, WantMessage.
	Pending                             bool
	WantStatus, WantReason, WantMessage string
}

// StaleEntry is a driver CSINode lists while the running kubelet holds no
// registration of it; or, with More set, how many more there are than
// plugd tells of one by one.
type StaleEntry struct {
	Driver, NodeID, Remedy string
	More                   int
}

// Input is everything Check looks at.
type Input struct {
	// RegistryDir is the directory plugd watches.
	RegistryDir string
	// Observe says plugd observes another manager (the kubelet) rather
	// than registering plugins itself; AllowWritableDir that it accepts
	// directories other users may change (pluginmanager.Options).
	Observe, AllowWritableDir bool
	Plugins                   []Target
	Expect                    []Expected
	// KubeletRoots are kubelet root directories whose plugins_registry is
	// searched for sockets that belong in RegistryDir. Nil means
	// DefaultKubeletRoots.
	KubeletRoots []string
	// ProcDir is where running processes are listed, to find a kubelet and
	// its --root-dir: "/proc" on Linux; empty skips the search.
	ProcDir    string
	Kubernetes []KubernetesProblem
	// Kubelet is how plugd reads the kubelet; nil without Kubernetes.
	Kubelet *KubeletAccess
	// Conditions are the expected plugins' Node conditions.
	Conditions []Condition
	// StaleCSINode are CSINode entries the running kubelet does not hold.
	StaleCSINode []StaleEntry
	// NodeName is this node's Node, with Kubernetes.
	NodeName string
	// DRASlices counts the ResourceSlices published for this node, by
	// driver; nil when unknown (no Kubernetes, or not read yet).
	DRASlices map[string]int
	// Confinement is what plugd's probe found of the admission policies
	// that confine its ServiceAccount to its Node; nil without Kubernetes
	// or before the probe told.
	Confinement *Confinement
	// Now is the time ages are counted to.
	Now time.Time
}

// DefaultKubeletRoots are the kubelet root directories of the usual
// distributions: upstream, MicroK8s, k0s and k3s (RKE2 uses upstream's).
var DefaultKubeletRoots = []string{
	"/var/lib/kubelet",
	"/var/snap/microk8s/common/var/lib/kubelet",
	"/var/lib/k0s/kubelet",
	"/var/lib/rancher/k3s/agent/kubelet",
}

// Bounds on the looks Check takes itself.
const (
	dialTimeout   = time.Second
	healthTimeout = 2 * time.Second
	parallelLooks = 8
	maxSockPath   = confine.MaxPath // a unix socket path's longest, without its NUL: as the manager refuses
	maxRootWalk   = 1000
)

// Check looks at in and returns its findings, most serious first. It
// returns within a few seconds, or when ctx is done, with what it found.
func Check(ctx context.Context, in Input) []api.Finding {
	if in.Now.IsZero() {
		in.Now = time.Now()
	}
	if in.KubeletRoots == nil {
		in.KubeletRoots = DefaultKubeletRoots
	}
	c := &checker{in: in, looks: lookAll(ctx, in.Plugins)}
	c.roots = findRoots(in)
	for i := range in.Plugins {
		c.socket(&in.Plugins[i], c.looks[i])
	}
	c.duplicates()
	c.rejected()
	c.expected()
	for i := range in.Plugins {
		c.kubelet(&in.Plugins[i])
	}
	c.otherRoots()
	c.unsafeSubdirs()
	c.kubernetes()
	c.confinement()
	c.kubeletAccess()
	c.staleEntries()
	c.draSlices()
	c.pendingConditions()
	for i := range c.out {
		c.out[i] = printable(c.out[i])
	}
	slices.SortStableFunc(c.out, func(a, b api.Finding) int {
		return cmp.Or(-cmp.Compare(slices.Index(api.Severities, a.Severity), slices.Index(api.Severities, b.Severity)),
			cmp.Compare(a.Socket, b.Socket), cmp.Compare(a.Check, b.Check))
	})
	return c.out
}

// maxFindingText bounds each text of a finding (its summary, remedy, and
// each line of evidence): they quote plugins, processes and the API server.
const maxFindingText = 4096

// printable is f with every text escaped (textsafe) and cut to
// maxFindingText, as plugin-controlled text is everywhere plugd shows it:
// findings quote sockets' names, plugins' answers, processes' command
// lines and the API server's objects, and are printed on terminals.
func printable(f api.Finding) api.Finding {
	for _, s := range []*string{&f.Type, &f.Name, &f.Socket, &f.Summary, &f.Remedy} {
		*s = textsafe.Printable(*s, maxFindingText)
	}
	ev := make([]string, len(f.Evidence))
	for i, e := range f.Evidence {
		ev[i] = textsafe.Printable(e, maxFindingText)
	}
	f.Evidence = ev
	return f
}

type checker struct {
	in    Input
	looks []look
	roots roots
	out   []api.Finding
	// Per socket, the checks that found something, for the causes of
	// "the kubelet has not registered it".
	found map[string][]string
}

func (c *checker) add(f api.Finding) {
	if c.found == nil {
		c.found = map[string][]string{}
	}
	c.found[f.Socket] = append(c.found[f.Socket], f.Summary)
	c.out = append(c.out, f)
}

// about fills in which plugin a finding is about.
func about(f api.Finding, p *Target) api.Finding {
	f.Type, f.Name, f.Socket = p.Type, p.Name, p.Socket
	return f
}

// lookAll takes each socket's own looks, a few at a time.
func lookAll(ctx context.Context, ps []Target) []look {
	out := make([]look, len(ps))
	sem := make(chan struct{}, parallelLooks)
	var wg sync.WaitGroup
	for i := range ps {
		wg.Go(func() {
			select {
			case sem <- struct{}{}:
				defer func() { <-sem }()
				out[i] = lookAt(ctx, &ps[i])
			case <-ctx.Done():
			}
		})
	}
	wg.Wait()
	return out
}

// socket is every check of one socket alone.
func (c *checker) socket(p *Target, l look) {
	if len(p.Socket) > maxSockPath {
		c.add(about(api.Finding{Severity: api.SeverityError, Check: "socket-path-too-long",
			Summary:  fmt.Sprintf("the socket's path is %d bytes long: unix sockets cannot be reached by a path over %d bytes", len(p.Socket), maxSockPath),
			Evidence: []string{"path: " + p.Socket},
			Remedy:   "give the plugin a shorter socket name or registry path (the kubelet cannot connect to it either)"}, p))
	}
	if p.Endpoint != "" && p.Endpoint != p.Socket && len(p.Endpoint) > maxSockPath {
		c.add(about(api.Finding{Severity: api.SeverityError, Check: "socket-path-too-long",
			Summary:  fmt.Sprintf("the plugin's endpoint is %d bytes long: nobody can connect to a unix socket path over %d bytes", len(p.Endpoint), maxSockPath),
			Evidence: []string{"endpoint: " + p.Endpoint},
			Remedy:   "configure the plugin with a shorter endpoint path"}, p))
	}
	switch l.sock.kind {
	case dialRefused:
		if !c.replacedBy(p) {
			c.add(about(api.Finding{Severity: api.SeverityWarning, Check: "stale-socket",
				Summary:  "stale socket: nobody listens on it (its plugin is gone)",
				Evidence: append(c.fileEvidence(p, l), "connecting: "+l.sock.err),
				Remedy:   "restart the plugin (its pod) if it should run; if it was removed, delete the file: rm " + p.Socket}, p))
		}
	case dialDenied:
		c.add(about(api.Finding{Severity: api.SeverityError, Check: "socket-permission",
			Summary:  fmt.Sprintf("plugd (%s) is not allowed to connect to the socket", l.self),
			Evidence: append(c.fileEvidence(p, l), "connecting: "+l.sock.err),
			Remedy:   "connecting to a unix socket needs write permission on it: have the plugin create it writable by plugd's user or group (its umask or a chmod), or run plugd as the socket's owner"}, p))
	}
	if p.Type != "" && !p.Remembered {
		if f, ok := refusedVersions(p); ok {
			c.add(about(f, p))
		}
	}
	if l.endpoint.kind != dialOK && l.endpoint.kind != dialSkipped {
		c.add(about(api.Finding{Severity: api.SeverityError, Check: "endpoint-dead",
			Summary:  "the registration socket answers, but the plugin's endpoint does not",
			Evidence: []string{"endpoint: " + p.Endpoint, "connecting: " + l.endpoint.err},
			Remedy:   "the plugin announces an endpoint nobody serves: check the path the plugin (or node-driver-registrar's --csi-address / --kubelet-registration-path) gives, and that the driver's own container runs"}, p))
	}
	c.draServices(p, l)
}

// fileEvidence is a socket file's age, owner and mode.
func (c *checker) fileEvidence(p *Target, l look) []string {
	var ev []string
	created := p.Created
	if created.IsZero() {
		created = l.file.modTime
	}
	if !created.IsZero() {
		ev = append(ev, fmt.Sprintf("created %s (%s ago)", created.Format(time.RFC3339), c.in.Now.Sub(created).Round(time.Second)))
	}
	if l.file.owner != "" {
		ev = append(ev, "owner "+l.file.owner+", mode "+l.file.mode)
	}
	if p.Type != "" {
		said := fmt.Sprintf("it was %s %s", p.Type, p.Name)
		if p.Remembered {
			said += " when it last answered"
		}
		ev = append(ev, said)
	}
	return ev
}

// replacedBy says another socket of p's plugin answers: p is then an old
// instance's, reported by duplicates.
func (c *checker) replacedBy(p *Target) bool {
	return p.Type != "" && slices.ContainsFunc(c.in.Plugins, func(o Target) bool {
		return o.Socket != p.Socket && o.Type == p.Type && o.Name == p.Name && o.Answering
	})
}

// duplicates reports the dead sockets of plugins that have a live one too.
func (c *checker) duplicates() {
	for i := range c.in.Plugins {
		p := &c.in.Plugins[i]
		if p.Answering || !c.replacedBy(p) {
			continue
		}
		var live []string
		for _, o := range c.in.Plugins {
			if o.Socket != p.Socket && o.Type == p.Type && o.Name == p.Name && o.Answering {
				live = append(live, o.Socket)
			}
		}
		ev := append(c.fileEvidence(p, c.looks[i]), "state: "+p.State, "answering: "+strings.Join(live, ", "))
		c.add(about(api.Finding{Severity: api.SeverityWarning, Check: "duplicate-dead",
			Summary:  fmt.Sprintf("an old socket of %s %s is dead while a newer one answers", p.Type, p.Name),
			Evidence: ev,
			Remedy:   "the old instance did not clean up: delete its socket (rm " + p.Socket + "); a kubelet may otherwise keep using or retrying it"}, p))
	}
}

// expected reports expected plugins with no socket.
func (c *checker) expected() {
	for _, e := range c.in.Expect {
		alts, summary := []Expected{e}, fmt.Sprintf("expected plugin %s %s has no registration socket in %s", e.Type, e.Name, c.in.RegistryDir)
		if len(e.AnyOf) > 0 {
			var names []string
			for _, a := range e.AnyOf {
				names = append(names, a.Type+" "+a.Name)
			}
			alts, summary = e.AnyOf, fmt.Sprintf("expected resource %s: none of its plugins (%s) has a registration socket in %s", e.Name, strings.Join(names, ", "), c.in.RegistryDir)
		}
		if slices.ContainsFunc(c.in.Plugins, func(p Target) bool {
			return slices.ContainsFunc(alts, func(a Expected) bool { return p.Type == a.Type && p.Name == a.Name })
		}) {
			continue
		}
		f := api.Finding{Severity: api.SeverityError, Check: "expected-missing", Type: e.Type, Name: e.Name,
			Summary:  summary,
			Evidence: []string{fmt.Sprintf("%d sockets in %s, none of it", len(c.in.Plugins), c.in.RegistryDir)},
			Remedy:   "start the plugin on this node (is its DaemonSet scheduled here?), or remove it from expect"}
		f.Evidence = append(f.Evidence, c.conditionEvidence(e.Type, e.Name)...)
		if elsewhere := c.roots.socketsOutside(); len(elsewhere) > 0 {
			f.Evidence = append(f.Evidence, "registration sockets under other kubelet roots: "+strings.Join(elsewhere, ", "))
			f.Remedy = "the plugin may be writing under the wrong kubelet root directory (see the other-kubelet-root finding); " + f.Remedy
		}
		c.add(f)
	}
}

// kubelet reports plugins the kubelet has not registered while their
// socket answers, with the likely causes, and CSI drivers it refuses for a
// topology conflict (whose registrar then exits: their socket need not
// answer).
func (c *checker) kubelet(p *Target) {
	if p.Kubelet == nil {
		return
	}
	v := p.Kubelet
	if v.Reason == "TopologyConflict" {
		c.add(about(api.Finding{Severity: api.SeverityError, Check: "topology-conflict",
			Summary:  "the kubelet refuses the CSI driver: the topology it reports collides with the Node's labels",
			Evidence: []string{v.Message},
			Remedy:   "remove the stale label from the Node if the driver's new value is right (kubectl label node NODE KEY-), or give the driver its old node id back; then restart the driver's pod (node-driver-registrar exits on the refusal)"}, p))
		return
	}
	if !p.Answering {
		return
	}
	switch {
	case v.State == api.KubeletNotRegistered:
	case v.State == api.KubeletRegistered && v.Reason != "" && v.Reason != "Inferred":
		c.add(about(api.Finding{Severity: api.SeverityWarning, Check: "kubelet-not-registered",
			Summary:  "the kubelet has the plugin, but not as it is now (" + v.Reason + ")",
			Evidence: []string{v.Message},
			Remedy:   "the kubelet's record is older than the plugin: restart the plugin's pod so that it registers again"}, p))
		return
	case v.State == api.KubeletUnknown && v.Reason == "NoResourceSlices":
		c.add(about(api.Finding{Severity: api.SeverityInfo, Check: "kubelet-not-registered",
			Summary:  "the DRA driver answers but has published no ResourceSlices for this node",
			Evidence: []string{v.Message},
			Remedy:   "normal right after a start; otherwise see the driver's log: it publishes its slices itself, with its own API access"}, p))
		return
	default:
		return
	}
	ev := []string{"kubelet view: " + v.Message}
	if !v.Since.IsZero() {
		ev = append(ev, fmt.Sprintf("since %s (%s ago)", v.Since.Format(time.RFC3339), c.in.Now.Sub(v.Since).Round(time.Second)))
	}
	causes := slices.Clone(c.found[p.Socket])
	if k := c.roots.kubelet; k != nil && !sameDir(k.registry(), c.in.RegistryDir) {
		causes = append(causes, fmt.Sprintf("the running kubelet (pid %d) watches %s, not %s", k.pid, k.registry(), c.in.RegistryDir))
	}
	switch v.Reason {
	case "KubeletNotRunning":
		causes = append(causes, "the kubelet is not running: it registers nothing until it starts again (systemctl status kubelet)")
	case "KubeletRestarted":
		causes = append(causes, "the kubelet restarted and has not registered it yet: it takes up every socket within a second or two of its start; if it does not, see its log (journalctl -u kubelet | grep "+p.Name+")")
	case "SeenNotRegistered":
		causes = append(causes, "the kubelet has seen the socket and refused it, or cannot dial the plugin's endpoint; it retries with backoff, and its log says why (journalctl -u kubelet | grep "+p.Name+")")
	}
	switch p.Type {
	case api.CSIPlugin:
		causes = append(causes,
			"node-driver-registrar's --kubelet-registration-path is not the driver socket's path on the host: the kubelet dials that path",
			"the kubelet refused it (a same-named driver with a higher version is registered): its log says why (journalctl -u kubelet | grep "+p.Name+")")
		if v.Reason == "NotInCSINode" || strings.HasPrefix(v.Message, "CSINode") {
			causes = append(causes, "the Node or its CSINode was re-created after the driver registered: restart the driver's pod so node-driver-registrar registers it again")
		}
	case api.DevicePlugin:
		causes = append(causes,
			"the kubelet refused it or cannot dial its endpoint: its log says why (journalctl -u kubelet | grep "+p.Name+")")
	default:
		causes = append(causes, "the kubelet refused it: its log says why (journalctl -u kubelet | grep "+p.Name+")")
	}
	for _, cause := range causes {
		ev = append(ev, "likely cause: "+cause)
	}
	c.add(about(api.Finding{Severity: api.SeverityWarning, Check: "kubelet-not-registered",
		Summary:  "the socket answers, but the kubelet has not registered it",
		Evidence: ev,
		Remedy:   "work through the likely causes, first one first"}, p))
}

// kubeletAccess reports a kubelet plugd cannot read: what plugd says the
// kubelet registered is then inferred from API objects, which outlive the
// kubelet's registrations; or a kubelet that is not running.
func (c *checker) kubeletAccess() {
	k := c.in.Kubelet
	if k == nil || k.Live || k.Reason == "" {
		return
	}
	ev := []string{k.Message}
	if !k.Since.IsZero() {
		ev = append(ev, fmt.Sprintf("since %s (%s ago)", k.Since.Format(time.RFC3339), c.in.Now.Sub(k.Since).Round(time.Second)))
	}
	f := api.Finding{Severity: api.SeverityWarning, Check: "kubelet-unreadable", Evidence: ev,
		Summary: fmt.Sprintf("plugd cannot read the kubelet's own state (%s): it infers what the kubelet registered from API objects (CSINode, the Node, ResourceSlices), which outlive the kubelet's registrations, and says Inferred", k.Reason)}
	switch k.Reason {
	case "KubeletNotRunning":
		f.Severity, f.Check = api.SeverityError, "kubelet-not-running"
		f.Summary = fmt.Sprintf("nothing listens at %s: the kubelet is not running, so it has registered no plugin", k.Address)
		f.Remedy = "start the kubelet (systemctl status kubelet); if it runs, kubernetes.kubelet.address is not its secure port (port in its KubeletConfiguration, default 10250; the DaemonSet uses the node's IP)"
	case "KubeletForbidden":
		f.Remedy = fmt.Sprintf("grant plugd's ServiceAccount %q: the ClusterRole plugd of deploy/kubernetes/daemonset.yaml has it (kubectl apply -f deploy/kubernetes/daemonset.yaml)", k.Permission)
	case "KubeletUnauthorized":
		f.Remedy = "turn on the kubelet's webhook authentication and authorization (authentication.webhook.enabled: true and authorization.mode: Webhook in its KubeletConfiguration), as metrics-server needs too"
	case "KubeletTLS":
		f.Remedy = "give plugd the kubelet's CA: a self-signed kubelet certificate is /var/lib/kubelet/pki/kubelet.crt; mount that file read-only and set kubernetes.kubelet.caFile to it; or turn on the kubelet's serverTLSBootstrap so that the cluster CA signs it; set kubernetes.kubelet.serverName if the certificate holds another name than the node's. insecureSkipTLSVerify is the last resort"
	case "KubeletMetricMissing":
		f.Remedy = "the kubelet's plugin_manager_total_plugins is an ALPHA metric, and this kubelet renamed or dropped it: check its name (kubectl get --raw /api/v1/nodes/NODE/proxy/metrics | grep plugin_manager) and report the kubelet's version to plugd's maintainers; until then plugd infers, and says Inferred"
	case "KubeletDisabled":
		f.Remedy = "set kubernetes.kubelet.address to the kubelet's secure port (the DaemonSet sets it from the node's IP)"
	default:
		f.Remedy = "check that kubernetes.kubelet.address is the node's address and the kubelet's port, and that no firewall or NetworkPolicy keeps plugd from it"
	}
	c.add(f)
}

// staleEntries reports CSINode entries of drivers the running kubelet
// holds no registration of.
func (c *checker) staleEntries() {
	for _, e := range c.in.StaleCSINode {
		if e.More > 0 {
			c.add(api.Finding{Severity: api.SeverityWarning, Check: "stale-csinode-entry", Type: api.CSIPlugin,
				Summary:  fmt.Sprintf("CSINode lists %d more drivers that the running kubelet holds no registration of", e.More),
				Evidence: []string{"plugd tells of the first few one by one; a CSINode with this many entries nobody holds was written by someone other than the kubelet"},
				Remedy:   "kubectl get csinode NODE -o yaml, and remove the entries of drivers that do not run on the node"})
			continue
		}
		c.add(api.Finding{Severity: api.SeverityWarning, Check: "stale-csinode-entry", Type: api.CSIPlugin, Name: e.Driver,
			Summary:  fmt.Sprintf("CSINode lists the driver %s, but the running kubelet holds no registration of it", e.Driver),
			Evidence: []string{fmt.Sprintf("CSINode entry: name %s, nodeID %q", e.Driver, e.NodeID), "the kubelet removes an entry once, when it deregisters the driver; an API outage at that moment leaves it for good, and the scheduler still counts the driver on this node"},
			Remedy:   "remove the entry: " + e.Remedy + "; or start the driver so that the kubelet registers it again"})
	}
}

// conditionEvidence is what the Node's condition of an expected plugin
// says, and the write plugd has not made yet.
func (c *checker) conditionEvidence(typ, name string) []string {
	for _, cond := range c.in.Conditions {
		if cond.Type != typ || cond.Name != name {
			continue
		}
		var ev []string
		switch {
		case cond.Status == "":
			ev = append(ev, fmt.Sprintf("the Node has no condition %s", cond.Condition))
		default:
			e := fmt.Sprintf("the Node's condition %s is %s (%s)", cond.Condition, cond.Status, cond.Reason)
			if !cond.Transition.IsZero() {
				e += fmt.Sprintf(" since %s", cond.Transition.Format(time.RFC3339))
			}
			if !cond.Heartbeat.IsZero() {
				e += fmt.Sprintf(", last written %s ago", c.in.Now.Sub(cond.Heartbeat).Round(time.Second))
			}
			ev = append(ev, e)
		}
		if cond.Pending {
			ev = append(ev, fmt.Sprintf("plugd's write of %s (%s) is pending", cond.WantStatus, cond.WantReason))
		}
		return ev
	}
	return nil
}

// pendingConditions reports expected plugins' conditions that plugd finds
// otherwise than the Node says, and has not written yet.
func (c *checker) pendingConditions() {
	failing := slices.ContainsFunc(c.in.Kubernetes, func(k KubernetesProblem) bool { return strings.HasPrefix(k.Operation, "patch nodes/status") })
	for _, cond := range c.in.Conditions {
		if !cond.Pending {
			continue
		}
		f := api.Finding{Severity: api.SeverityInfo, Check: "condition-pending", Type: cond.Type, Name: cond.Name,
			Summary:  fmt.Sprintf("the Node's condition %s says %s, but plugd finds %s (%s): its write is under way", cond.Condition, orNone(cond.Status), cond.WantStatus, cond.WantReason),
			Evidence: append(c.conditionEvidence(cond.Type, cond.Name), "plugd finds: "+cond.WantMessage),
			Remedy:   "none needed: a change of reason alone is written once it has held for 2s"}
		if cond.Type == nodecond.Resource && cond.Status == "True" && cond.WantStatus == "False" {
			f.Remedy = "none needed if another of its plugins is on its way: a resource's condition stays True for 10s after its last plugin stopped, while another may take over (a move from a device plugin to DRA); then False is written"
		}
		if failing {
			f.Severity = api.SeverityWarning
			f.Summary = fmt.Sprintf("the Node's condition %s says %s, but plugd finds %s (%s) and cannot write it", cond.Condition, orNone(cond.Status), cond.WantStatus, cond.WantReason)
			f.Remedy = "see the kubernetes-api finding: until the write works, readiness rules read the Node's condition, not plugd's"
		}
		c.add(f)
	}
}

func orNone(s string) string {
	if s == "" {
		return "nothing (it has none)"
	}
	return s
}

// kubernetes reports trouble with the API server.
func (c *checker) kubernetes() {
	for _, k := range c.in.Kubernetes {
		f := api.Finding{Severity: api.SeverityWarning, Check: "kubernetes-api",
			Summary:  fmt.Sprintf("plugd cannot %s (%s)", k.Operation, k.Reason),
			Evidence: []string{k.Message, fmt.Sprintf("since %s (%s ago)", k.Since.Format(time.RFC3339), c.in.Now.Sub(k.Since).Round(time.Second))},
			Remedy:   "plugd retries with backoff; check that the API server is reachable from the node"}
		switch k.Reason {
		case "Forbidden":
			f.Severity = api.SeverityError
			f.Summary = fmt.Sprintf("plugd may not %s: it lacks the permission %q", k.Operation, k.Permission)
			f.Remedy = "bind the ClusterRole of deploy/kubernetes/daemonset.yaml to plugd's ServiceAccount (kubectl apply -f deploy/kubernetes/daemonset.yaml)"
			if k.Permission == "patch nodes" { // only kubernetes.removeTaintWhenReady needs it, and has a file of its own
				f.Remedy = "bind the ClusterRole of deploy/kubernetes/remove-taint-rbac.yaml to plugd's ServiceAccount (kubectl apply -f deploy/kubernetes/remove-taint-rbac.yaml), or unset kubernetes.removeTaintWhenReady"
			}
		case "RefusedByPolicy":
			f.Severity = api.SeverityError
			f.Summary = fmt.Sprintf("an admission policy refuses plugd's write: %s", k.Operation)
			f.Remedy = "the policy's message says what it refuses: list plugd's condition types in the ConfigMap RELEASE-admission (key conditions) and its taint in " +
				"RELEASE-remove-taint (key taints) as plugd's configuration has them (the chart renders both from its values), and run plugd with its Pod-bound token; see docs/security.md"
		case "Unauthorized":
			f.Severity = api.SeverityError
			f.Remedy = "plugd's credentials are refused: check its kubeconfig, or that its ServiceAccount token is mounted and current"
		}
		c.add(f)
	}
}

// confinement reports a ServiceAccount that no admission policy confines
// to its Node, and a token the policies refuse whole.
func (c *checker) confinement() {
	cf := c.in.Confinement
	if cf == nil || cf.Confined && !cf.NoClaim {
		return
	}
	evidence := []string{cf.Message, "probed at " + cf.At.Format(time.RFC3339)}
	if cf.NoClaim {
		c.add(api.Finding{Severity: api.SeverityError, Check: "admission-policy",
			Summary:  "plugd's token carries no node name (claim authentication.kubernetes.io/node-name): the admission policies refuse every write plugd makes to its Node",
			Evidence: evidence,
			Remedy: "run plugd with the Pod-bound ServiceAccount token the kubelet mounts (the DaemonSet's default, not a long-lived Secret token or a kubeconfig), " +
				"on Kubernetes 1.30 or later with the feature ServiceAccountTokenPodNodeInfo on; see docs/security.md"})
		return
	}
	c.add(api.Finding{Severity: api.SeverityWarning, Check: "admission-policy",
		Summary: "no admission policy confines plugd's ServiceAccount to its Node: with RBAC alone, plugd's token may change the status of every Node " +
			"(and, with removeTaintWhenReady, every Node's taints and labels) and record events in any namespace",
		Evidence: evidence,
		Remedy: "install the chart's admission policies (value admissionPolicy.enabled, on by default; Kubernetes 1.30 or later: admissionregistration.k8s.io/v1 " +
			"ValidatingAdmissionPolicy), or kubectl apply -f deploy/kubernetes/daemonset.yaml; see docs/security.md"})
}

// unsafeSubdirs reports the directories below the registry directory that
// users other than plugd's and root could change (dirtrust.CheckBelow):
// plugd registers none of the sockets in them, and the kubelet, which
// registers them, can be handed a planted plugin. The walk is bounded.
func (c *checker) unsafeSubdirs() {
	if c.in.RegistryDir == "" || c.in.AllowWritableDir {
		return
	}
	root, seen := filepath.Clean(c.in.RegistryDir), 0
	// A registry directory that is a symlink (a moved /var/lib) is followed,
	// as the manager follows it; WalkDir goes into it only with a slash.
	walkRoot := root
	if fi, err := os.Lstat(root); err == nil && fi.Mode()&fs.ModeSymlink != 0 {
		walkRoot = root + string(filepath.Separator)
	}
	filepath.WalkDir(walkRoot, func(path string, d fs.DirEntry, err error) error {
		if err != nil || path == walkRoot || !d.IsDir() {
			return nil
		}
		if seen++; seen > maxRootWalk {
			return fs.SkipAll // directories, not sockets: a registry of 5000 plugins is walked whole
		}
		if strings.HasPrefix(d.Name(), ".") {
			return fs.SkipDir // not watched, by plugd or the kubelet
		}
		err = dirtrust.CheckBelow(path, os.Geteuid())
		var u *dirtrust.Untrusted
		if !errors.As(err, &u) {
			return nil
		}
		socks := socketsIn(path)
		f := api.Finding{Check: "unsafe-subdirectory",
			Evidence: []string{err.Error(), fmt.Sprintf("sockets in it: %d", socks)},
			Remedy:   fmt.Sprintf("make it writable by its owner alone (chmod go-w %s) and root's or plugd's user's (chown), or move its plugins' sockets into a directory that is; to accept it, set policy.allowWritableRegistryDir", path)}
		if fi, err := os.Lstat(path); err == nil {
			if o := ownerOf(fi); o != "" {
				f.Evidence = append(f.Evidence, "owner: "+o)
			}
		}
		if c.in.Observe {
			f.Severity = api.SeverityWarning
			f.Summary = fmt.Sprintf("the directory %s, below the registry directory, is not safe from other users: they could plant a plugin there for the kubelet", path)
		} else {
			f.Severity = api.SeverityError
			f.Summary = fmt.Sprintf("the directory %s, below the registry directory, is not safe from other users: plugd registers none of the %d plugin sockets in it", path, socks)
		}
		c.add(f)
		return fs.SkipDir
	})
}

// socketsIn counts the sockets directly in dir.
func socketsIn(dir string) int {
	es, _ := os.ReadDir(dir)
	n := 0
	for _, e := range es {
		if e.Type()&fs.ModeSocket != 0 {
			n++
		}
	}
	return n
}
