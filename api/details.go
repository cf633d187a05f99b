package api

import (
	"encoding/json"
	"time"
)

// What each built-in handler reports of a plugin, as Plugin.Details. The
// handlers (github.com/plugd/plugd/handlers/...) return these very types;
// a client that received a Plugin as JSON decodes its Details into the one
// for its Type with DecodeDetails.
//
//	CSIPlugin     CSIDetails
//	DRAPlugin     DRADetails (registered), DRAObserved (observing)
//	DevicePlugin  DevicePluginDetails (registered), DevicePluginObserved (observing)
//	(hook)        HookRun

// CSIInstance is one registration of a CSI driver: one registration socket,
// and the driver endpoint it announced.
type CSIInstance struct {
	// Socket is the registration socket in the registry directory.
	Socket string `json:"socket"`
	// Endpoint is the path of the driver's CSI socket.
	Endpoint string `json:"endpoint"`
	// Version is the CSI version chosen, as the driver wrote it: the highest
	// 1.x it offered.
	Version string `json:"version"`
	// VendorVersion and Manifest are what GetPluginInfo answered, cut to the
	// spec's limits (128 bytes, 4 KiB).
	VendorVersion string            `json:"vendorVersion"`
	Manifest      map[string]string `json:"manifest,omitempty"`
	// NodeID, MaxVolumes and Topology are what NodeGetInfo answered. A
	// MaxVolumes of zero means the driver sets no limit.
	NodeID     string            `json:"nodeID"`
	MaxVolumes int64             `json:"maxVolumes"`
	Topology   map[string]string `json:"topology,omitempty"`
	// Capabilities are the node service capabilities, e.g. "STAGE_UNSTAGE_VOLUME".
	Capabilities []string `json:"capabilities"`
	// RegisteredAt is when the instance was registered; for an observed one,
	// when it was first seen answering.
	RegisteredAt time.Time `json:"registeredAt"`
	// Observed is set on an instance recorded by Observe: another manager (a
	// kubelet) registered it, and this handler only looks at it.
	Observed bool `json:"observed,omitempty"`
}

// CSIDetails are the details of a CSI driver instance: the instance, and
// where it stands.
type CSIDetails struct {
	Driver string `json:"driver"`
	// Active is false for an older instance kept during a rolling restart.
	Active    bool `json:"active"`
	Instances int  `json:"instances"`
	CSIInstance
}

// DRAInstance is one registered instance of a DRA driver.
type DRAInstance struct {
	// Socket is the registration socket; Endpoint is where the DRA service is.
	Socket   string `json:"socket"`
	Endpoint string `json:"endpoint"`
	// Service is the DRA gRPC service chosen, e.g. "v1.DRAPlugin".
	Service string `json:"service"`
	// HealthService is the health service followed, e.g. "v1.DRAResourceHealth";
	// empty if the plugin advertises none or answered that it has none.
	HealthService string    `json:"healthService,omitempty"`
	Connected     bool      `json:"connected"`
	RegisteredAt  time.Time `json:"registeredAt"`
	// DisconnectedAt is when the connection was lost, zero while connected.
	DisconnectedAt time.Time `json:"disconnectedAt,omitzero"`
}

// DRADetails are the details of a registered DRA driver instance: the
// instance, and where it stands within its driver.
type DRADetails struct {
	Driver string `json:"driver"`
	DRAInstance
	Serving         bool `json:"serving"`
	DriverAvailable bool `json:"driverAvailable"`
	// Devices are the driver's devices whose health its DRAResourceHealth
	// stream reported (the driver's, not the instance's), sorted by pool
	// and device; empty if it reports none. At most 1024.
	Devices []DRADeviceHealth `json:"devices,omitempty"`
}

// DRADeviceHealth is the health a DRA driver last reported for one of its
// devices: Health is DeviceHealthy, DeviceUnhealthy or "Unknown" (not
// reported, or not refreshed within the driver's timeout).
type DRADeviceHealth struct {
	Pool    string `json:"pool"`
	Device  string `json:"device"`
	Health  string `json:"health"`
	Message string `json:"message,omitempty"`
}

// DRAObserved are the details of a DRA driver seen by a plugd observing:
// the last look at it, not a registration.
type DRAObserved struct {
	Driver   string `json:"driver"`
	Endpoint string `json:"endpoint"`
	// Service is the DRA gRPC service the plugin would be used with: the
	// first in its versions that is supported.
	Service string `json:"service"`
	// Observed is always true: the plugin is looked at, not registered.
	Observed bool `json:"observed"`
	// Reachable says the last look connected to the endpoint; ReachableAt is
	// when one last did.
	Reachable   bool      `json:"reachable"`
	ReachableAt time.Time `json:"reachableAt,omitzero"`
	LastError   string    `json:"lastError,omitempty"`
	// HealthService is the health service followed, as in DRAInstance, and
	// Devices what it reported, as in DRADetails.
	HealthService string            `json:"healthService,omitempty"`
	Devices       []DRADeviceHealth `json:"devices,omitempty"`
}

// DevicePluginOptions are a device plugin's answer to GetDevicePluginOptions.
type DevicePluginOptions struct {
	PreStartRequired                bool `json:"preStartRequired,omitempty"`
	GetPreferredAllocationAvailable bool `json:"getPreferredAllocationAvailable,omitempty"`
}

// The health of a Device, and the keys of the counts of devices by health
// (DevicePluginDetails.Devices, DevicePluginObserved.Devices), spelt as the
// device plugin API spells them.
const (
	DeviceHealthy   = "Healthy"
	DeviceUnhealthy = "Unhealthy"
)

// Device is one device of a device plugin's resource.
type Device struct {
	ID string `json:"id"`
	// Health is DeviceHealthy or DeviceUnhealthy; a device whose plugin
	// sent anything else counts as Unhealthy, as in the kubelet.
	Health string `json:"health"`
	// Topology lists the NUMA nodes the device is attached to, if the plugin said.
	Topology []int64 `json:"topology,omitempty"`
}

// DevicePluginDetails are the details of a registered device plugin
// instance.
type DevicePluginDetails struct {
	Resource  string              `json:"resource"`
	Endpoint  string              `json:"endpoint"`
	Serving   bool                `json:"serving"` // the newest instance, whose devices the resource has
	Connected bool                `json:"connected"`
	Dropped   bool                `json:"dropped,omitempty"`
	Devices   map[string]int      `json:"devices"`   // counts by health
	Inventory []Device            `json:"inventory"` // the devices, sorted by ID (at most 10,000)
	Options   DevicePluginOptions `json:"options"`
	LastError string              `json:"lastError,omitempty"`
	Since     time.Time           `json:"since"`
}

// DevicePluginObserved are the details of a device plugin seen by a plugd
// observing: a snapshot taken at its last look, not a stream.
type DevicePluginObserved struct {
	Resource string `json:"resource"`
	Endpoint string `json:"endpoint"`
	// Observed is always true.
	Observed  bool                `json:"observed"`
	Devices   map[string]int      `json:"devices"`   // counts by health
	Inventory []Device            `json:"inventory"` // the first list of the last look, sorted by ID
	Options   DevicePluginOptions `json:"options"`
	LastError string              `json:"lastError,omitempty"`
	// ObservedAt is when the inventory was taken.
	ObservedAt time.Time `json:"observedAt,omitzero"`
}

// HookRun is the record of one run of a hook handler's command or URL.
type HookRun struct {
	// Event is the call that ran the hook: validate, register or deregister.
	Event string `json:"event"`
	// Result is accepted, refused, error or timeout.
	Result string `json:"result"`
	// Start is when the run started.
	Start time.Time `json:"start"`
	// DurationSeconds is how long it took.
	DurationSeconds float64 `json:"durationSeconds"`
	// ExitStatus is a command's exit status; nil if it did not exit of itself
	// (it could not be started, or was killed).
	ExitStatus *int `json:"exitStatus,omitempty"`
	// HTTPStatus is the status code of a URL's response; zero if none came.
	HTTPStatus int `json:"httpStatus,omitempty"`
	// Output is the last 4 KiB a command wrote to stderr (or to stdout, if
	// nothing to stderr), or the first 4 KiB of a response's body, with
	// control characters escaped.
	Output string `json:"output,omitempty"`
	// Error is why the hook did not accept the plugin; empty if it did.
	Error string `json:"error,omitempty"`
}

// DecodeDetails decodes p.Details, however it came (a handler's value in
// the daemon, or JSON from the status API), into v: a pointer to the
// details type of p's handler.
func (p Plugin) DecodeDetails(v any) error {
	b, err := json.Marshal(p.Details)
	if err != nil {
		return err
	}
	return json.Unmarshal(b, v)
}
