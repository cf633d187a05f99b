package daemon

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"path/filepath"
	"reflect"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/yaml"

	"github.com/plugd/plugd/api"
	"github.com/plugd/plugd/cmd/plugd/internal/kubenode"
	"github.com/plugd/plugd/handlers/csi"
	"github.com/plugd/plugd/handlers/deviceplugin"
	"github.com/plugd/plugd/handlers/dra"
	"github.com/plugd/plugd/pluginmanager"
)

// Config is plugd's configuration: a YAML file (--config), each field of which
// a flag can also set. The zero value of a field means its default.
type Config struct {
	// Mode is "manage" (default): plugd registers the plugins with its
	// handlers and tells them so, as the node's plugin manager; or
	// "observe": beside a kubelet that registers them, plugd only looks
	// (GetInfo at once, then when the connection it holds hangs up, and
	// every liveness.probeInterval, 5m by default), never tells a plugin
	// anything, never calls a handler, and never writes to the registry
	// directory, which may be mounted read-only.
	Mode string `json:"mode,omitempty"`

	// RegistryDir is the directory plugins put their registration sockets in.
	// Default: $XDG_RUNTIME_DIR/plugd/plugins (or /run/plugd/plugins for root,
	// or plugd-<uid>/plugins in the temporary directory). Set it to
	// /var/lib/kubelet/plugins_registry to serve the kubelet's plugins in
	// place of the kubelet's own manager.
	RegistryDir string `json:"registryDir,omitempty"`

	// Handlers say which plugin types are accepted, and by which handler.
	// Default: the built-in types CSIPlugin, DRAPlugin and DevicePlugin, each
	// with the "accept" handler. Plugins of any other type are rejected with
	// "no handler" until a handler is configured for it.
	Handlers []HandlerConfig `json:"handlers,omitempty"`

	Status StatusConfig `json:"status,omitempty"`

	// Workers is how many sockets are worked on at once. Default 128.
	Workers int `json:"workers,omitempty"`
	// ResyncInterval is how often the registry directory is walked again to
	// repair missed filesystem events. Default 30s; negative disables it.
	ResyncInterval Duration `json:"resyncInterval,omitempty"`

	Backoff  BackoffConfig  `json:"backoff,omitempty"`
	Timeouts TimeoutsConfig `json:"timeouts,omitempty"`

	// DeregisterOnShutdown deregisters every plugin when plugd stops.
	// Default false, so that a restart does not make plugins flap.
	DeregisterOnShutdown bool `json:"deregisterOnShutdown,omitempty"`
	// ShutdownTimeout bounds a clean shutdown on SIGTERM or SIGINT. Default 10s.
	ShutdownTimeout Duration `json:"shutdownTimeout,omitempty"`

	Liveness LivenessConfig `json:"liveness,omitempty"`
	Policy   PolicyConfig   `json:"policy,omitempty"`

	Log LogConfig `json:"log,omitempty"`

	// Kubernetes connects plugd to the Kubernetes API, for the kubelet's
	// view of each plugin, Node conditions and events. Absent: off, and
	// nothing needs an API server.
	Kubernetes *KubernetesConfig `json:"kubernetes,omitempty"`
	// Expect lists the plugins this node must have. With kubernetes set,
	// each gets a Node condition; plugctl doctor reports a missing one.
	Expect []ExpectConfig `json:"expect,omitempty"`

	Doctor DoctorConfig `json:"doctor,omitempty"`
}

// KubernetesConfig says how plugd reaches the Kubernetes API, and what it
// does there. It reads only its own node's Node, CSINode and ResourceSlices,
// and writes only on change.
type KubernetesConfig struct {
	// Kubeconfig is a kubeconfig file. Empty: the pod's in-cluster
	// configuration (its ServiceAccount).
	Kubeconfig string `json:"kubeconfig,omitempty"`
	// NodeName is this node's Node object. Default: $NODE_NAME (the
	// DaemonSet sets it from spec.nodeName). Required.
	NodeName string `json:"nodeName,omitempty"`
	// RemoveTaintWhenReady, KEY:EFFECT, is a taint plugd removes from the
	// Node once every expected plugin is ready (a startup taint, so that
	// no pod lands before its plugins are registered). Empty: none.
	RemoveTaintWhenReady string `json:"removeTaintWhenReady,omitempty"`
	// StartupWindow is how long after the kubelet's start a startup taint
	// (expect[].taint, removeTaintWhenReady) another writer puts back is
	// removed again, at most 3 times per boot of the kubelet; after it,
	// such a taint is left to its writer, and plugd logs who holds it.
	// Default 10m.
	StartupWindow Duration `json:"startupWindow,omitempty"`
	// DisagreementGrace is how long a plugin's socket and the kubelet may
	// disagree (it answers and the kubelet lacks it, or the reverse) before
	// a Warning event says so. Default 1m.
	DisagreementGrace Duration `json:"disagreementGrace,omitempty"`
	// HeartbeatInterval is how often plugd rewrites its Node conditions
	// (their lastHeartbeatTime) when nothing changes: one write per node
	// per interval. A condition whose heartbeat is older than twice this
	// and a minute is one nobody maintains (plugd stopped); plugctl
	// cluster shows it as such. Default 5m, from 1m to 5m.
	HeartbeatInterval Duration `json:"heartbeatInterval,omitempty"`
	// Kubelet is where plugd reads the running kubelet's own state.
	Kubelet KubeletAccessConfig `json:"kubelet,omitempty"`
}

// KubeletAccessConfig says where plugd reads what the running kubelet
// holds: its /metrics on its secure port (which sockets its plugin manager
// has registered, and when it started; plugd's ServiceAccount needs "get
// nodes/metrics") and its pod-resources socket (the devices it can
// allocate). Where it cannot, plugd infers what the kubelet registered
// from API objects, and says so (reason Inferred).
type KubeletAccessConfig struct {
	// Address is the kubelet's secure port, HOST:PORT. Default
	// $NODE_IP:10250 (the DaemonSet sets NODE_IP from status.hostIP), else
	// localhost:10250. "none": do not read the kubelet.
	Address string `json:"address,omitempty"`
	// ServerName is the name the kubelet's serving certificate must hold.
	// Default: the node name (a self-signed kubelet certificate holds the
	// hostname).
	ServerName string `json:"serverName,omitempty"`
	// CAFile verifies the kubelet's serving certificate: a self-signed one
	// is its own kubelet.crt (/var/lib/kubelet/pki/kubelet.crt). Default:
	// the API server's CA, which signs it when the kubelet's
	// serverTLSBootstrap is on.
	CAFile string `json:"caFile,omitempty"`
	// InsecureSkipTLSVerify reads the kubelet without verifying its
	// certificate. plugd warns at start. Default false.
	InsecureSkipTLSVerify bool `json:"insecureSkipTLSVerify,omitempty"`
	// PodResourcesSocket is the kubelet's pod-resources socket. Default
	// /var/lib/kubelet/pod-resources/kubelet.sock; "none": a device
	// plugin's healthy devices are the Node's allocatable.
	PodResourcesSocket string `json:"podResourcesSocket,omitempty"`
	// RegistryDir is the registry directory's path as the kubelet names it,
	// when plugd sees it elsewhere. Default: registryDir.
	RegistryDir string `json:"registryDir,omitempty"`
	// Resync is how often the kubelet is read when nothing says it
	// changed. Default 5m.
	Resync Duration `json:"resync,omitempty"`
}

// The kubelet's defaults.
const (
	defaultKubeletPort        = "10250"
	defaultPodResourcesSocket = "/var/lib/kubelet/pod-resources/kubelet.sock"
	kubeletOff                = "none"
)

// ExpectConfig is a plugin the node must have, or a resource that any of
// several plugins may provide (AnyOf).
type ExpectConfig struct {
	// Type and Name are as the plugin sends them in GetInfo. With anyOf,
	// Name is the resource's, and Type is not set.
	Type string `json:"type,omitempty"`
	Name string `json:"name"`
	// Condition is the type of its Node condition. Default:
	// NAME/TYPEReady, e.g. csi.example.com/CSIPluginReady (for a device
	// plugin's vendor.example/gpu: vendor.example/gpu-DevicePluginReady);
	// with anyOf, NAME/Ready (gpu.example.com/Ready).
	Condition string `json:"condition,omitempty"`
	// MinHealthyDevices is, for a DevicePlugin, how many healthy devices
	// make it ready. Default 1.
	MinHealthyDevices int `json:"minHealthyDevices,omitempty"`
	// MinDevices is, for a DRAPlugin, how many usable devices (in complete
	// pools, untainted, not Unhealthy) make it ready. Default 1.
	MinDevices int `json:"minDevices,omitempty"`
	// DeviceClasses are, for a DRAPlugin, DeviceClasses (by name) that must
	// exist and whose selectors must match enough of the driver's usable
	// devices for it to be ready. Needs kubernetes. Empty: none.
	DeviceClasses []string `json:"deviceClasses,omitempty"`
	// Taint, KEY:EFFECT, is this plugin's startup taint: plugd removes it
	// from the Node once the plugin is ready, and removes it again when
	// another writer puts it back within kubernetes.startupWindow of the
	// kubelet's start. Entries may share a key: it goes once all of them
	// are ready. Needs kubernetes. Empty: none.
	Taint string `json:"taint,omitempty"`
	// Retaint puts Taint back when the plugin, once ready, is not any more
	// (False; not Unknown, not while plugd restarts), and removes it again
	// when it is.
	Retaint bool `json:"retaint,omitempty"`
	// AnyOf lists the plugins that may provide the resource Name, each
	// with the fields an entry of its type takes (type, name,
	// minHealthyDevices, minDevices, deviceClasses), and no condition, taint, retaint or anyOf of its
	// own: the condition is True while any of them is ready, and its
	// message names the one that holds it. For a move from one kind of
	// plugin to another (a device plugin to a DRA driver) that keeps one
	// condition. One alternative is allowed (the condition's name before
	// the move), at most 8. A plugin may be in one entry only.
	AnyOf []ExpectConfig `json:"anyOf,omitempty"`
}

// DoctorConfig tunes plugctl doctor's checks (GET /v1/findings).
type DoctorConfig struct {
	// KubeletRoots are kubelet root directories whose plugins_registry is
	// searched for sockets that belong in registryDir. Default: the
	// upstream, MicroK8s, k0s and k3s roots.
	KubeletRoots []string `json:"kubeletRoots,omitempty"`
	// ProcDir is where the running processes are listed, to find a
	// kubelet and the --root-dir it uses. Default /proc (on Linux; a pod
	// without hostPID sees only its own processes there: mount the host's
	// /proc and point here); "none" skips the search.
	ProcDir string `json:"procDir,omitempty"`
}

// LivenessConfig says how registered plugins are checked to be alive.
// plugd holds the connection each plugin registered over open and idle, and
// hears at once when it hangs up (the plugin's process went), without a
// call; the csi, dra and deviceplugin handlers watch each plugin's own
// endpoint the same way. Probes only add a check of a plugin wedged while
// its connection stays up.
type LivenessConfig struct {
	// ProbeInterval is how often each registered plugin is asked GetInfo as
	// a routine probe (jittered). Default 5m; negative disables probes (the
	// held connection still tells a dead plugin at once). A handler entry's
	// probeInterval overrides it for its type.
	ProbeInterval Duration `json:"probeInterval,omitempty"`
	// UnhealthyGrace is how long a plugin that stopped answering stays
	// registered (Unhealthy) before it is deregistered. Default 30s; a
	// handler's unhealthyGrace overrides it for its type.
	UnhealthyGrace Duration `json:"unhealthyGrace,omitempty"`
}

// PolicyConfig keeps plugins in bounds.
type PolicyConfig struct {
	// EndpointRoots, if set, confines plugins' endpoints to these
	// directories (symlinks resolved); the registration socket itself is
	// always allowed.
	EndpointRoots []string `json:"endpointRoots,omitempty"`
	// AllowedPeers, if set, lists who may serve each plugin type's
	// registration socket: the listening process's uid or gid (read with
	// SO_PEERCRED) must be listed for the plugin's type, or for "*".
	AllowedPeers []PeerRule `json:"allowedPeers,omitempty"`
	// AllowWritableRegistryDir lets plugd use a registry directory that
	// users other than plugd's and root may change (writable by others,
	// owned by another user, or reached through such a directory), and
	// directories below it that are writable by others or another user's;
	// refused, or left out, by default
	// (pluginmanager.Options.AllowWritableDir).
	AllowWritableRegistryDir bool `json:"allowWritableRegistryDir,omitempty"`
	// RemoveStaleAfter, if set, removes a socket nobody listens on once it
	// is older than this. Default: never.
	RemoveStaleAfter Duration `json:"removeStaleAfter,omitempty"`
	// MaxSockets bounds the sockets tracked. Default 20000.
	MaxSockets int `json:"maxSockets,omitempty"`
}

// PeerRule is who may serve plugins of one type.
type PeerRule struct {
	Type string   `json:"type"` // a plugin type, or "*" for every type without a rule of its own
	UIDs []uint32 `json:"uids,omitempty"`
	GIDs []uint32 `json:"gids,omitempty"`
}

// HandlerConfig names the handler for one plugin type.
type HandlerConfig struct {
	// Type is the plugin type, as plugins send it in GetInfo: CSIPlugin,
	// DRAPlugin, DevicePlugin, or a type of your own such as example.com/Greeter.
	Type string `json:"type"`
	// Handler is the name of a built-in handler:
	//   accept        checks the plugin's fields and records it (any type)
	//   csi           a CSI node plugin: checks versions and name, asks the
	//                 driver for its node info (for CSIPlugin)
	//   dra           a DRA driver: picks its gRPC service, watches its
	//                 connection and device health (for DRAPlugin)
	//   deviceplugin  a device plugin: follows its device inventory and
	//                 health (for DevicePlugin)
	//   hook          runs a command or calls a URL on each event (any type;
	//                 set hook)
	Handler string `json:"handler"`
	// GracePeriod, for dra and deviceplugin, is how long a plugin that lost
	// its connection is still counted on before its driver or resource is
	// reported unavailable. Default 30s.
	GracePeriod Duration `json:"gracePeriod,omitempty"`
	// UnhealthyGrace overrides liveness.unhealthyGrace for this type.
	UnhealthyGrace Duration `json:"unhealthyGrace,omitempty"`
	// ProbeInterval overrides liveness.probeInterval for this type;
	// negative disables its probes.
	ProbeInterval Duration `json:"probeInterval,omitempty"`
	// DeregisterWithRegistrar makes a plugin of this type whose registration
	// socket stops answering (its registrar died and left the socket)
	// Unhealthy, and deregistered after unhealthyGrace, even while its
	// handler sees its endpoint serving. Default false: a CSI driver whose
	// node-driver-registrar died stays registered while the driver serves,
	// as with the kubelet.
	DeregisterWithRegistrar bool `json:"deregisterWithRegistrar,omitempty"`
	// Hook configures the hook handler.
	Hook *HookConfig `json:"hook,omitempty"`
}

// HookConfig is the hook handler's: a command or a URL, run on each event.
type HookConfig struct {
	// Command is a program and its arguments (no shell). The plugin is on
	// its stdin as JSON and in PLUGD_* environment variables; exit 0
	// accepts, 3 on register refuses for good, anything else refuses and
	// is retried.
	Command []string `json:"command,omitempty"`
	// URL receives the same JSON as a POST: 2xx accepts, 4xx refuses, 5xx
	// is retried.
	URL string `json:"url,omitempty"`
	// Timeout bounds each run. Default 10s.
	Timeout Duration `json:"timeout,omitempty"`
	// Events are the calls that run the hook: validate, register,
	// deregister. Default register and deregister.
	Events []string `json:"events,omitempty"`
	// Env is extra KEY=VALUE environment for Command.
	Env []string `json:"env,omitempty"`
}

// StatusConfig says where the status API (and /metrics) is served.
type StatusConfig struct {
	// Socket is the unix socket of the status API, created with mode 0660.
	// Default: plugd.sock beside the default registry directory's parent
	// ($XDG_RUNTIME_DIR/plugd/plugd.sock, or /run/plugd/plugd.sock for root).
	// "none" serves no unix socket.
	Socket string `json:"socket,omitempty"`
	// TCP is an address to also serve the status API on, such as
	// 127.0.0.1:9090. Default: none.
	TCP string `json:"tcp,omitempty"`
	// AllowNonLoopback permits a TCP address that is not loopback. The status
	// API has no authentication: only expose it on a network you trust.
	AllowNonLoopback bool `json:"allowNonLoopback,omitempty"`
}

// BackoffConfig is the retry schedule of transient failures.
type BackoffConfig struct {
	// Initial is the first retry delay. Default 500ms.
	Initial Duration `json:"initial,omitempty"`
	// Max caps the delay, which doubles on each failure. Default 2m.
	Max Duration `json:"max,omitempty"`
}

// TimeoutsConfig bounds each step of a registration.
type TimeoutsConfig struct {
	Dial    Duration `json:"dial,omitempty"`    // connecting to a plugin's socket. Default 5s.
	GetInfo Duration `json:"getInfo,omitempty"` // the GetInfo call. Default 5s.
	Notify  Duration `json:"notify,omitempty"`  // each NotifyRegistrationStatus call. Default 5s.
	Handler Duration `json:"handler,omitempty"` // each call of a handler. Default 30s.
}

// LogConfig shapes plugd's logs, written to standard error.
type LogConfig struct {
	// Format is "text" (default) or "json".
	Format string `json:"format,omitempty"`
	// Level is "debug", "info" (default), "warn" or "error".
	Level string `json:"level,omitempty"`
}

// Duration is a time.Duration written as a Go duration string, like "30s".
type Duration time.Duration

// UnmarshalJSON reads a Go duration string such as "1m30s". A bare number is
// refused rather than taken as nanoseconds: "resyncInterval: 5" meaning 5ns
// would spin plugd. The error is a *json.UnmarshalTypeError, which the
// decoder completes with the field's name.
func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if json.Unmarshal(b, &s) == nil {
		if v, err := time.ParseDuration(s); err == nil {
			*d = Duration(v)
			return nil
		}
	}
	return &json.UnmarshalTypeError{
		Value: fmt.Sprintf("%s (a duration is written like \"30s\" or \"1m30s\")", b),
		Type:  reflect.TypeFor[Duration](),
	}
}

// MarshalJSON writes the duration as a string, like "30s".
func (d Duration) MarshalJSON() ([]byte, error) {
	return json.Marshal(time.Duration(d).String())
}

// String is the duration as Go prints it.
func (d Duration) String() string { return time.Duration(d).String() }

// The built-in handlers, by name.
var builtinHandlers = []string{"accept", "csi", "dra", "deviceplugin", "hook"}

// DefaultHandlers are the handlers of a configuration that names none.
func DefaultHandlers() []HandlerConfig {
	return []HandlerConfig{
		{Type: csi.Type, Handler: "accept"},
		{Type: dra.Type, Handler: "accept"},
		{Type: deviceplugin.Type, Handler: "accept"},
	}
}

// LoadConfig reads a YAML configuration file. Unknown fields are errors, and
// every error names the file and the field.
func LoadConfig(path string) (Config, error) {
	var c Config
	b, err := readConfigFile(path)
	if err != nil {
		return c, err
	}
	if err := yaml.UnmarshalStrict(b, &c); err != nil {
		return c, configError(path, b, err)
	}
	return c, nil
}

// WithDefaults returns a copy of c with its zero fields set to their
// defaults, or an error naming the first field whose value is not allowed.
func (c Config) WithDefaults() (Config, error) {
	switch c.Mode {
	case "":
		c.Mode = "manage"
	case "manage", "observe":
	default:
		return c, fmt.Errorf("mode is %q: it must be manage (plugd registers plugins) or observe (beside a kubelet, plugd only looks)", c.Mode)
	}
	if c.RegistryDir == "" {
		c.RegistryDir = api.DefaultRegistryDir()
	}
	if abs, err := filepath.Abs(c.RegistryDir); err == nil {
		c.RegistryDir = abs
	}
	if err := checkRegistryDir(c.RegistryDir); err != nil {
		return c, err
	}
	if len(c.Handlers) == 0 {
		c.Handlers = DefaultHandlers()
	}
	if err := checkHandlers(c.Handlers); err != nil {
		return c, err
	}
	if c.Status.Socket == "" {
		c.Status.Socket = api.DefaultSocket()
	}
	if c.Status.Socket != "none" {
		if abs, err := filepath.Abs(c.Status.Socket); err == nil {
			if err := checkStatusSocket(abs, c.RegistryDir); err != nil {
				return c, err
			}
		}
	}
	if c.Status.TCP != "" {
		addr, err := statusTCP(c.Status.TCP, c.Status.AllowNonLoopback)
		if err != nil {
			return c, err
		}
		c.Status.TCP = addr
	}
	if err := c.checkBounds(); err != nil {
		return c, err
	}
	if err := c.Policy.check(); err != nil {
		return c, err
	}
	if c.Log.Format == "" {
		c.Log.Format = "text"
	}
	if c.Log.Format != "text" && c.Log.Format != "json" {
		return c, fmt.Errorf("log.format is %q: it must be text or json", c.Log.Format)
	}
	if c.Log.Level == "" {
		c.Log.Level = "info"
	}
	if _, err := parseLevel(c.Log.Level); err != nil {
		return c, err
	}
	if err := c.checkKubernetes(); err != nil {
		return c, err
	}
	c.applyNumberDefaults()
	doctor, err := c.Doctor.withDefaults()
	if err != nil {
		return c, err
	}
	c.Doctor = doctor
	// The manager checks the rest of its options the same way; let it, so the
	// rules live in one place, and translate its option names to ours.
	if _, err := pluginmanager.New(c.managerOptions(nil, nil)); err != nil {
		return c, errors.New(configFieldNames.Replace(err.Error()))
	}
	return c, nil
}

// withDefaults returns a copy of d with its zero fields set to their
// defaults, or an error naming the first field whose value is not allowed.
func (d DoctorConfig) withDefaults() (DoctorConfig, error) {
	if p := d.ProcDir; p != "" && p != "none" {
		if err := checkProcDir(p); err != nil {
			return d, fmt.Errorf("doctor.procDir %s %w; \"none\" skips the search for a running kubelet", p, err)
		}
	}
	if d.ProcDir == "" && runtime.GOOS == "linux" {
		d.ProcDir = "/proc"
	}
	if len(d.KubeletRoots) == 0 {
		d.KubeletRoots = nil // an empty list is the default
	}
	for i, r := range d.KubeletRoots {
		if !filepath.IsAbs(r) {
			return d, fmt.Errorf("doctor.kubeletRoots[%d] %q is not an absolute path", i, r)
		}
	}
	return d, nil
}

// checkHandlers returns an error naming the first of hs that is not
// allowed: a type without a name or with a handler already, an unknown
// handler, or a handler's settings.
func checkHandlers(hs []HandlerConfig) error {
	seen := map[string]bool{}
	for i, h := range hs {
		field := fmt.Sprintf("handlers[%d]", i)
		if h.Type == "" {
			return fmt.Errorf("%s.type is empty: name the plugin type, such as CSIPlugin or example.com/Greeter", field)
		}
		if seen[h.Type] {
			return fmt.Errorf("%s.type: %q has a handler already; give each type one handler", field, h.Type)
		}
		seen[h.Type] = true
		if !slices.Contains(builtinHandlers, h.Handler) {
			return fmt.Errorf("%s.handler is %q: it must be one of %s", field, h.Handler, strings.Join(builtinHandlers, ", "))
		}
		if err := checkHandler(h); err != nil {
			return fmt.Errorf("%s: %w", field, err)
		}
	}
	return nil
}

// check returns an error naming the first rule of p that is not allowed.
func (p PolicyConfig) check() error {
	if len(p.AllowedPeers) > 0 && runtime.GOOS == "windows" {
		return errors.New("policy.allowedPeers cannot be enforced on Windows, which does not tell who listens on a unix socket: remove it, and restrict who may write to the registry directory (its ACL) instead")
	}
	seenPeers := map[string]bool{}
	for i, r := range p.AllowedPeers {
		switch {
		case r.Type == "":
			return fmt.Errorf("policy.allowedPeers[%d].type is empty: name a plugin type, or \"*\" for every type", i)
		case seenPeers[r.Type]:
			return fmt.Errorf("policy.allowedPeers[%d]: %q has a rule already", i, r.Type)
		case len(r.UIDs) == 0 && len(r.GIDs) == 0:
			return fmt.Errorf("policy.allowedPeers[%d] (%s) lists no uids or gids: it would refuse every plugin of the type", i, r.Type)
		}
		seenPeers[r.Type] = true
	}
	for i, root := range p.EndpointRoots {
		if !filepath.IsAbs(root) {
			return fmt.Errorf("policy.endpointRoots[%d] %q is not an absolute path", i, root)
		}
	}
	return nil
}

// checkKubernetes checks the kubernetes and expect sections, and fills in
// the expected plugins' default conditions. c is a copy: its slices are
// replaced, never written through.
func (c *Config) checkKubernetes() error {
	if k := c.Kubernetes; k != nil {
		kc := *k
		c.Kubernetes = &kc
		if kc.NodeName == "" {
			return errors.New("kubernetes.nodeName is empty: set it, --node-name or NODE_NAME (the DaemonSet sets NODE_NAME from spec.nodeName)")
		}
		// A Node's name is a DNS subdomain; anything else (a path such as
		// ../../namespaces/kube-system/secrets/x) is no Node's, and has no
		// place in the URLs plugd builds of it.
		if errs := validation.IsDNS1123Subdomain(kc.NodeName); len(errs) > 0 {
			return fmt.Errorf("kubernetes.nodeName %q is not a Node's name: %s (--node-name and NODE_NAME set it too)", kc.NodeName, strings.Join(errs, "; "))
		}
		if kc.Kubelet.Address == "" {
			kc.Kubelet.Address = net.JoinHostPort("localhost", defaultKubeletPort)
		}
		if kc.Kubelet.PodResourcesSocket == "" {
			kc.Kubelet.PodResourcesSocket = defaultPodResourcesSocket
		}
		a := kc.Kubelet
		if a.Address != kubeletOff {
			if _, port, err := net.SplitHostPort(a.Address); err != nil || port == "" {
				return fmt.Errorf("kubernetes.kubelet.address %q: write it as HOST:PORT, such as 10.0.0.5:10250, or none", a.Address)
			}
		}
		for name, p := range map[string]string{"caFile": a.CAFile, "podResourcesSocket": a.PodResourcesSocket, "registryDir": a.RegistryDir} {
			if p != "" && p != kubeletOff && !filepath.IsAbs(p) {
				return fmt.Errorf("kubernetes.kubelet.%s %q is not an absolute path", name, p)
			}
		}
		if a.CAFile != "" && a.InsecureSkipTLSVerify {
			return errors.New("kubernetes.kubelet: caFile and insecureSkipTLSVerify are both set: verify with caFile, or not at all")
		}
		if kc.RemoveTaintWhenReady != "" {
			if _, _, err := kubenode.ParseTaint(kc.RemoveTaintWhenReady); err != nil {
				return fmt.Errorf("kubernetes.removeTaintWhenReady %w", err)
			}
			if len(c.Expect) == 0 {
				return errors.New("kubernetes.removeTaintWhenReady is set, but expect lists no plugins: the taint would never be removed; list the plugins the node needs in expect")
			}
		}
	}
	return c.checkExpect()
}

// checkExpect checks the expect section and fills in the expected plugins'
// default conditions.
func (c *Config) checkExpect() error {
	expect := make([]ExpectConfig, len(c.Expect))
	xs := make([]kubenode.Expectation, len(c.Expect))
	seen := map[string]string{}
	for i, e := range c.Expect {
		x, err := e.expectation().WithDefaults()
		if err != nil {
			return fmt.Errorf("expect[%d]: %w", i, err)
		}
		if x.Taint != "" && c.Kubernetes == nil {
			return fmt.Errorf("expect[%d]: taint is set, but kubernetes is not: plugd removes a taint from its Node, through the Kubernetes API; set kubernetes.nodeName (or remove the taint)", i)
		}
		if x.UsesDeviceClasses() && c.Kubernetes == nil {
			return fmt.Errorf("expect[%d]: deviceClasses is set, but kubernetes is not: plugd reads DeviceClasses from the Kubernetes API; set kubernetes.nodeName (or remove deviceClasses)", i)
		}
		if err := uniqueExpect(seen, fmt.Sprint(i), x); err != nil {
			return err
		}
		xs[i] = x
		expect[i] = expectConfigOf(x)
	}
	if c.Kubernetes != nil {
		if err := kubenode.CheckTaints(xs, c.Kubernetes.RemoveTaintWhenReady); err != nil {
			return fmt.Errorf("expect: %w", err)
		}
	}
	c.Expect = nil // an empty list is none
	if len(expect) > 0 {
		c.Expect = expect
	}
	return nil
}

// kubeletConfig is the node agent's share of k.Kubelet, with "none" as
// off.
func (k KubernetesConfig) kubeletConfig() kubenode.KubeletConfig {
	a := k.Kubelet
	kc := kubenode.KubeletConfig{Address: a.Address, ServerName: a.ServerName, CAFile: a.CAFile,
		InsecureSkipVerify: a.InsecureSkipTLSVerify, PodResources: a.PodResourcesSocket, RegistryDir: a.RegistryDir,
		Resync: time.Duration(a.Resync)}
	if kc.Address == kubeletOff {
		kc.Address = ""
	}
	if kc.PodResources == kubeletOff {
		kc.PodResources = ""
	}
	return kc
}

func (e ExpectConfig) expectation() kubenode.Expectation {
	x := kubenode.Expectation{Type: e.Type, Name: e.Name, Condition: e.Condition, MinHealthyDevices: e.MinHealthyDevices,
		MinDevices: e.MinDevices, DeviceClasses: slices.Clone(e.DeviceClasses), Taint: e.Taint, Retaint: e.Retaint}
	for _, a := range e.AnyOf {
		x.AnyOf = append(x.AnyOf, a.expectation())
	}
	return x
}

// expectConfigOf is x, with its defaults, as the configuration writes it:
// an entry with anyOf has no type.
func expectConfigOf(x kubenode.Expectation) ExpectConfig {
	e := ExpectConfig{Type: x.Type, Name: x.Name, Condition: x.Condition, MinHealthyDevices: x.MinHealthyDevices,
		MinDevices: x.MinDevices, DeviceClasses: slices.Clone(x.DeviceClasses), Taint: x.Taint, Retaint: x.Retaint}
	if x.Type == kubenode.TypeAnyOf {
		e.Type = ""
	}
	for _, a := range x.AnyOf {
		e.AnyOf = append(e.AnyOf, expectConfigOf(a))
	}
	return e
}

// uniqueExpect refuses an entry x (expect[at]) whose condition, or one of
// whose plugins, an entry before it has (seen): one plugin, one condition;
// a plugin in two entries' anyOf would make one socket hold two.
func uniqueExpect(seen map[string]string, at string, x kubenode.Expectation) error {
	names := [][2]string{{"plugin " + x.Type + " " + x.Name, at}, {"condition " + x.Condition, at}}
	for j, a := range x.AnyOf {
		names = append(names, [2]string{"plugin " + a.Type + " " + a.Name, fmt.Sprintf("%s].anyOf[%d", at, j)})
	}
	for _, n := range names {
		if j, dup := seen[n[0]]; dup {
			return fmt.Errorf("expect[%s]: %s is also expect[%s]'s", n[1], n[0], j)
		}
	}
	for _, n := range names {
		seen[n[0]] = n[1]
	}
	return nil
}

// configFieldNames turns the manager's option names into this file's field names.
var configFieldNames = strings.NewReplacer(
	"pluginmanager: ", "",
	"Options.BackoffInitial", "backoff.initial",
	"Options.BackoffMax", "backoff.max",
	"Options.Workers", "workers",
	"Options.Dir", "registryDir",
)

// managerOptions is the manager's share of the configuration.
func (c Config) managerOptions(logger *slog.Logger, reg prometheus.Registerer) pluginmanager.Options {
	o := pluginmanager.Options{
		Dir:                  c.RegistryDir,
		Logger:               logger,
		Workers:              c.Workers,
		ResyncInterval:       time.Duration(c.ResyncInterval),
		BackoffInitial:       time.Duration(c.Backoff.Initial),
		BackoffMax:           time.Duration(c.Backoff.Max),
		DialTimeout:          time.Duration(c.Timeouts.Dial),
		GetInfoTimeout:       time.Duration(c.Timeouts.GetInfo),
		NotifyTimeout:        time.Duration(c.Timeouts.Notify),
		HandlerTimeout:       time.Duration(c.Timeouts.Handler),
		DeregisterOnShutdown: c.DeregisterOnShutdown,
		Registerer:           reg,
		EventBuffer:          streamBuffer,
		ProbeInterval:        time.Duration(c.Liveness.ProbeInterval),
		UnhealthyGrace:       time.Duration(c.Liveness.UnhealthyGrace),
		EndpointRoots:        c.Policy.EndpointRoots,
		AllowWritableDir:     c.Policy.AllowWritableRegistryDir,
		RemoveStaleAfter:     time.Duration(c.Policy.RemoveStaleAfter),
		MaxSockets:           c.Policy.MaxSockets,
		Observe:              c.Mode == "observe",
	}
	o.AllowedPeers, _ = c.peerRule("*")
	return o
}

// handlerOptions are the manager's settings for the plugin type of h: its
// own unhealthy grace and probe interval, whether it goes with its
// registrar, and who may serve it (policy.allowedPeers' rule for
// the type; without one, the "*" rule, which is the manager's default).
func (c Config) handlerOptions(h HandlerConfig) pluginmanager.HandlerOptions {
	ho := pluginmanager.HandlerOptions{
		UnhealthyGrace:          time.Duration(h.UnhealthyGrace),
		ProbeInterval:           time.Duration(h.ProbeInterval),
		DeregisterWithRegistrar: h.DeregisterWithRegistrar,
	}
	if r, ok := c.peerRule(h.Type); ok {
		ho.AllowedPeers = r
	}
	return ho
}

// peerRule is the policy.allowedPeers rule for typ, if there is one.
func (c Config) peerRule(typ string) (*pluginmanager.Peers, bool) {
	for _, r := range c.Policy.AllowedPeers {
		if r.Type == typ {
			return &pluginmanager.Peers{UIDs: r.UIDs, GIDs: r.GIDs}, true
		}
	}
	return nil, false
}

func parseLevel(s string) (slog.Level, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(s)); err != nil {
		return l, fmt.Errorf("log.level is %q: it must be debug, info, warn or error", s)
	}
	return l, nil
}
