// Package api is plugd's status API as seen from outside: the JSON types the
// daemon serves and a Go client for them. The daemon and plugctl both import
// it; it imports nothing of the daemon.
//
// Endpoints (HTTP on a unix socket by default, see DefaultSocket):
//
//	GET /v1/plugins[?type=T&name=N&state=S]   PluginList
//	GET /v1/plugins/{id}                      Plugin (id: the socket's path inside the registry directory)
//	GET /v1/events[?replay=N]                 a stream of Event, one JSON object per line
//	GET /v1/findings                          FindingList: what plugctl doctor prints
//	GET /v1/version                           Version
//	GET /metrics                              Prometheus metrics
//	GET /healthz                              200 while the daemon runs
//	GET /readyz                               200 once the registry directory has been scanned, 503 before
//
// Errors are an Error object with a fitting HTTP status.
package api

import (
	"fmt"
	"os"
	"path/filepath"
	"time"
)

// The plugin types the kubelet registers itself, as its plugin registration
// API spells them (k8s.io/kubelet's pluginregistration/v1 constants): the
// types plugd's built-in handlers serve. Any other type is a plugin type of
// its own, such as example.com/Greeter.
const (
	CSIPlugin    = "CSIPlugin"
	DRAPlugin    = "DRAPlugin"
	DevicePlugin = "DevicePlugin"
)

// Plugin is one registration socket and what plugd knows of it.
type Plugin struct {
	// ID is the socket's path relative to the registry directory, e.g.
	// "csi.example.com-reg.sock" or "vendor/gpu.sock".
	ID       string   `json:"id"`
	Type     string   `json:"type,omitempty"`
	Name     string   `json:"name,omitempty"`
	Endpoint string   `json:"endpoint,omitempty"`
	Versions []string `json:"versions,omitempty"`
	Socket   string   `json:"socket"`
	// State is one of States() (see StatePending and the others).
	State string `json:"state"`
	// Reason is the step the last attempt failed at, one of Reasons();
	// LastError says why.
	Reason          string    `json:"reason,omitempty"`
	LastError       string    `json:"lastError,omitempty"`
	Attempts        int       `json:"attempts"`
	NextRetry       time.Time `json:"nextRetry,omitzero"`
	Discovered      time.Time `json:"discovered,omitzero"`
	RegisteredSince time.Time `json:"registeredSince,omitzero"`
	// Created is when the socket file was made: a Stale socket's age.
	Created time.Time `json:"created,omitzero"`
	// UnhealthySince is when a registered plugin stopped answering.
	UnhealthySince time.Time `json:"unhealthySince,omitzero"`
	// Newest marks the most recently registered of several sockets with the
	// same type and name (old and new instance during a rolling update).
	Newest bool `json:"newest,omitempty"`
	// Details is what the plugin's handler reports of it (a CSI driver's
	// node info, a device plugin's devices and their health, a hook's last
	// run), as a JSON object; absent if the handler reports nothing. The
	// built-in handlers' are the types in details.go (CSIDetails and the
	// others); DecodeDetails decodes it into one.
	Details any `json:"details,omitempty"`
	// Kubelet is what the Kubernetes API says the node's kubelet made of
	// this plugin; absent unless plugd is connected to Kubernetes and the
	// plugin has said who it is.
	Kubelet *KubeletView `json:"kubelet,omitempty"`
	// Holds are the Node conditions of expected resources (expect entries
	// with anyOf) that this plugin makes True now, as the Node says
	// ("held by TYPE NAME"): during a move from a device plugin to a DRA
	// driver, which of the two a resource's readiness rests on.
	Holds []string `json:"holds,omitempty"`
}

// KubeletView is the kubelet's side of a plugin, as read from the API
// server: the node's CSINode drivers for a CSI driver, the Node's capacity
// for a device plugin, the node's ResourceSlices for a DRA driver.
type KubeletView struct {
	// State is one of KubeletStates.
	State string `json:"state"`
	// Reason is a CamelCase word saying why (NotInCSINode, NodeIDMismatch,
	// NoResourceSlices, APIUnavailable, Forbidden, ...); Message says it
	// for a person.
	Reason  string `json:"reason,omitempty"`
	Message string `json:"message,omitempty"`
	// Since is when plugd first saw this state and reason.
	Since time.Time `json:"since,omitzero"`
}

// The states of a KubeletView.
const (
	KubeletRegistered    = "Registered"    // the kubelet has the plugin
	KubeletNotRegistered = "NotRegistered" // the API shows the kubelet does not have it
	KubeletUnknown       = "Unknown"       // the API cannot tell (no ResourceSlices, API unreachable, forbidden)
)

// KubeletStates are the states a KubeletView can be in.
var KubeletStates = []string{KubeletRegistered, KubeletNotRegistered, KubeletUnknown}

// Finding is one problem (or observation) plugctl doctor reports.
type Finding struct {
	// Severity is one of Severities.
	Severity string `json:"severity"`
	// Check names the test that found it, a stable word scripts may
	// match: stale-socket, socket-permission, endpoint-dead,
	// versions-refused, health-service-missing, duplicate-dead,
	// socket-path-too-long, other-kubelet-root, kubelet-process-ignored,
	// kubelet-not-registered, expected-missing, unsafe-subdirectory,
	// kubernetes-api.
	Check string `json:"check"`
	// Type, Name and Socket say which plugin it is about, as far as known;
	// all empty for a finding about plugd or the node.
	Type   string `json:"type,omitempty"`
	Name   string `json:"name,omitempty"`
	Socket string `json:"socket,omitempty"`
	// Summary is one line; Evidence the facts it rests on; Remedy what to do.
	Summary  string   `json:"summary"`
	Evidence []string `json:"evidence,omitempty"`
	Remedy   string   `json:"remedy,omitempty"`
}

// The severities of a Finding, from least to most serious.
const (
	SeverityInfo    = "info"
	SeverityWarning = "warning"
	SeverityError   = "error"
)

// Severities are the severities a Finding can have, least serious first.
var Severities = []string{SeverityInfo, SeverityWarning, SeverityError}

// FindingList is the answer to GET /v1/findings, most serious first.
type FindingList struct {
	Findings []Finding `json:"findings"`
}

// The states of a plugin (Plugin.State). A plugd in observe mode reports
// only Pending, Answering, NotAnswering and Stale.
const (
	StatePending      = "Pending"      // discovered, not yet tried
	StateRegistering  = "Registering"  // an attempt is under way
	StateRegistered   = "Registered"   // its handler accepted it and it was told so
	StateFailed       = "Failed"       // the last attempt failed; retried at NextRetry
	StateStale        = "Stale"        // a socket nobody listens on (a crashed plugin's); retried
	StateRejected     = "Rejected"     // refused for a reason retrying cannot fix
	StateUnhealthy    = "Unhealthy"    // registered, but not answering its liveness probe
	StateAnswering    = "Answering"    // observe mode: it answered at the last look
	StateNotAnswering = "NotAnswering" // observe mode: it did not, or answered nonsense
)

// States returns the states a plugin can be in, from the happy path to
// trouble.
func States() []string {
	return []string{StatePending, StateRegistering, StateRegistered, StateFailed, StateStale, StateRejected, StateUnhealthy, StateAnswering, StateNotAnswering}
}

// The types of an Event.
const (
	EventDiscovered   = "Discovered"   // a new socket file appeared (or an old one was replaced)
	EventRegistered   = "Registered"   // its handler accepted the plugin and it was told so
	EventFailed       = "Failed"       // an attempt failed; it will be retried
	EventRejected     = "Rejected"     // refused until the socket changes
	EventDeregistered = "Deregistered" // its handler let the plugin go
	EventUnhealthy    = "Unhealthy"    // a registered plugin stopped answering its liveness probe
	EventHealthy      = "Healthy"      // an Unhealthy plugin answers again, still registered
	EventAnswering    = "Answering"    // observe mode: the plugin answers (again)
	EventNotAnswering = "NotAnswering" // observe mode: the plugin stopped answering (or is Stale)
	EventLooked       = "Looked"       // observe mode: a look found the plugin as the last one did
	EventRemoved      = "Removed"      // the socket file is gone and forgotten
	EventLost         = "Lost"         // this client fell behind; Missed events were dropped
)

// EventTypes returns the types an Event can have.
func EventTypes() []string {
	return []string{EventDiscovered, EventRegistered, EventFailed, EventRejected, EventDeregistered, EventUnhealthy, EventHealthy,
		EventAnswering, EventNotAnswering, EventLooked, EventRemoved, EventLost}
}

// The reasons of a failure (Plugin.Reason): the step that failed.
const (
	ReasonDial        = "dial"         // the registration socket did not accept a connection
	ReasonGetInfo     = "get_info"     // GetInfo failed or timed out
	ReasonInvalidInfo = "invalid_info" // GetInfo's answer broke a rule
	ReasonNoHandler   = "no_handler"   // no handler for the type
	ReasonValidate    = "validate"     // the handler's Validate refused or failed
	ReasonRegister    = "register"     // the handler's Register failed
	ReasonNotify      = "notify"       // the plugin could not be told it was registered
	ReasonPolicy      = "policy"       // a rule of plugd's policy refused it (endpoint roots, peer credentials)
	ReasonUnhealthy   = "unhealthy"    // it stopped answering while registered
	ReasonEndpoint    = "endpoint"     // its own service went, or did not answer its handler's (or observer's) look
)

// Reasons returns the reasons a failure can have.
func Reasons() []string {
	return []string{ReasonDial, ReasonGetInfo, ReasonInvalidInfo, ReasonNoHandler, ReasonValidate, ReasonRegister, ReasonNotify,
		ReasonPolicy, ReasonUnhealthy, ReasonEndpoint}
}

// PluginList is the answer to GET /v1/plugins, sorted by ID.
type PluginList struct {
	Plugins []Plugin `json:"plugins"`
}

// Event is one change, in order. Seq increases by one per event; a client
// that fell behind receives an event of type Lost saying how many it Missed.
// Plugin is the socket as the event left it; its LastError is the error the
// event reports, if any.
type Event struct {
	Seq    uint64    `json:"seq"`
	Time   time.Time `json:"time"`
	Type   string    `json:"type"` // one of EventTypes()
	Plugin Plugin    `json:"plugin"`
	Missed int       `json:"missed,omitempty"`
}

// Version is the answer to GET /v1/version.
type Version struct {
	Version     string `json:"version"`
	GoVersion   string `json:"goVersion"`
	RegistryDir string `json:"registryDir"`
}

// Error is the body of every error answer.
type Error struct {
	Message string `json:"error"`
}

// RuntimeDir is where plugd keeps its sockets when not told otherwise:
// $XDG_RUNTIME_DIR/plugd for a user with a session, /run/plugd for root, and
// plugd-<uid> in the temporary directory otherwise.
func RuntimeDir() string {
	if d := os.Getenv("XDG_RUNTIME_DIR"); d != "" {
		return filepath.Join(d, "plugd")
	}
	if os.Geteuid() == 0 {
		return "/run/plugd"
	}
	return filepath.Join(os.TempDir(), fmt.Sprintf("plugd-%d", os.Geteuid()))
}

// DefaultSocket is the status API's unix socket when not told otherwise.
func DefaultSocket() string { return filepath.Join(RuntimeDir(), "plugd.sock") }

// DefaultRegistryDir is the registry directory when not told otherwise.
func DefaultRegistryDir() string { return filepath.Join(RuntimeDir(), "plugins") }
