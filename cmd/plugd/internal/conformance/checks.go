package conformance

// Plugin types, as plugins name them in GetInfo.
const (
	typeCSI    = "CSIPlugin"
	typeDRA    = "DRAPlugin"
	typeDevice = "DevicePlugin"
)

// A check is one thing the kit verifies of a plugin. The catalogue below is
// the one list of them: the suites run them by ID, the docs describe them,
// and --list prints it.
type check struct {
	ID string
	// Types are the plugin types the check applies to; nil: every type.
	Types []string
	// Expect says what a plugin must do to pass.
	Expect string
	// Kubelet is where the kubelet v1.37 does what the check plays, as a
	// path in k8s.io/kubernetes; "" marks a recommendation: what the
	// type's ecosystem expects or what broke plugins in the field, which
	// the kubelet does not enforce.
	Kubelet string
	// Started marks a check that needs the plugin started by the kit
	// (-- COMMAND): it stops and restarts the plugin. It is skipped when
	// the kit attaches to a running plugin.
	Started bool
	// Via is the way of registering the check is about: viaRegistry (a
	// socket in the registry directory), viaKubeletSock (a device plugin's
	// Register call on the device manager's kubelet.sock), or "" either.
	Via string
}

// The two ways a plugin registers.
const (
	viaRegistry    = "registry"
	viaKubeletSock = "kubelet.sock"
)

// Check IDs, in the order they run.
const (
	checkSocket         = "registration/socket"
	checkGetInfoTime    = "registration/getinfo-deadline"
	checkType           = "registration/type"
	checkName           = "registration/name"
	checkVersions       = "registration/versions"
	checkEndpoint       = "registration/endpoint"
	checkNotify         = "registration/notify-registered"
	checkCSIPluginInfo  = "csi/plugin-info"
	checkCSIProbe       = "csi/probe"
	checkCSINodeInfo    = "csi/node-info"
	checkCSISanity      = "csi/sanity-node"
	checkDRAServices    = "dra/services"
	checkDRAEmpty       = "dra/prepare-empty"
	checkDRAHealth      = "dra/health"
	checkDRASlices      = "dra/resource-slices"
	checkDPRegister     = "deviceplugin/register"
	checkDPOptions      = "deviceplugin/options"
	checkDPListAndWatch = "deviceplugin/list-and-watch"
	checkDPStreamOpen   = "deviceplugin/stream-open"
	checkDPHealth       = "deviceplugin/health-change"
	checkDPListAgain    = "deviceplugin/list-and-watch-again"
	checkDPRestart      = "deviceplugin/kubelet-restart"
	checkRestart        = "registration/manager-restart"
	checkLateNotify     = "registration/late-notify"
	checkSIGTERM        = "lifecycle/sigterm-removes-socket"
	checkStale          = "lifecycle/stale-socket-replaced"
	checkRefused        = "lifecycle/notify-refused"
)

const operationGenerator = "pkg/kubelet/pluginmanager/operationexecutor/operation_generator.go"

// catalogue is every check, in the order they run.
var catalogue = []check{
	{ID: checkSocket, Via: viaRegistry, Expect: "a unix socket, not hidden, appears in the registry directory and serves the Registration service (GetInfo)",
		Kubelet: "pkg/kubelet/pluginmanager/pluginwatcher/plugin_watcher.go (walk and fsnotify, only sockets, names not starting with '.'); " + operationGenerator + " (dial, 10 s)"},
	{ID: checkGetInfoTime, Via: viaRegistry, Expect: "GetInfo answers within 1 s of being asked",
		Kubelet: operationGenerator + " GenerateRegisterPluginFunc (GetInfo with a 1 s deadline)"},
	{ID: checkType, Via: viaRegistry, Expect: "the type is CSIPlugin, DRAPlugin or DevicePlugin",
		Kubelet: operationGenerator + " (no handler for the type: NotifyRegistrationStatus(false))"},
	{ID: checkName, Via: viaRegistry, Expect: "the name is valid for the type: a CSI driver name, a DRA driver name (DNS subdomain), an extended resource name (domain/resource)",
		Kubelet: "pkg/volume/csi/csi_plugin.go ValidatePlugin; pkg/kubelet/cm/dra/plugin/dra_plugin_manager.go; pkg/kubelet/cm/devicemanager/plugin/v1beta1/handler.go ValidatePlugin (IsExtendedResourceName)"},
	{ID: checkVersions, Via: viaRegistry, Expect: "the versions include one the kubelet accepts, read by its rules: CSI a 1.x of two or more numbers; DRA v1.DRAPlugin or v1beta1.DRAPlugin; device plugins v1beta1",
		Kubelet: "pkg/volume/csi/csi_plugin.go validateVersions (HighestSupportedVersion); pkg/kubelet/cm/dra/plugin/dra_plugin_manager.go validateSupportedServices; pkg/kubelet/cm/devicemanager/plugin/v1beta1/handler.go isVersionCompatibleWithPlugin"},
	{ID: checkEndpoint, Via: viaRegistry, Expect: "the endpoint is empty (the registration socket) or an absolute unix socket path shorter than 108 bytes, and accepts connections",
		Kubelet: operationGenerator + " (empty endpoint: the socket path); the handlers dial it in RegisterPlugin"},
	{ID: checkNotify, Via: viaRegistry, Expect: "NotifyRegistrationStatus(registered) is answered without error within 5 s",
		Kubelet: operationGenerator + " notifyPlugin (5 s)"},
	{ID: checkCSIPluginInfo, Types: []string{typeCSI}, Expect: "Identity GetPluginInfo names the driver as registered, with a vendor version"},
	{ID: checkCSIProbe, Types: []string{typeCSI}, Expect: "Identity Probe answers without error (ready, or ready not said)"},
	{ID: checkCSINodeInfo, Types: []string{typeCSI}, Expect: "Node NodeGetInfo gives a node id, max volumes not negative, topology keys and values valid as Node labels",
		Kubelet: "pkg/volume/csi/csi_plugin.go RegisterPlugin (NodeGetInfo); pkg/volume/csi/nodeinfomanager/nodeinfomanager.go InstallCSIDriver (driverNodeID must not be empty; topology written as Node labels)"},
	{ID: checkCSISanity, Types: []string{typeCSI}, Expect: "with --csi-sanity PATH: csi-sanity's node tests (ginkgo focus \"Node Service\", and any --csi-sanity-flag) pass against the endpoint, within 6 times --timeout; skipped without --csi-sanity"},
	{ID: checkDRAServices, Types: []string{typeDRA}, Expect: "every DRA service the plugin announces is served on its endpoint",
		Kubelet: "pkg/kubelet/cm/dra/plugin/dra_plugin_manager.go RegisterPlugin (the first supported service announced is the one called)"},
	{ID: checkDRAEmpty, Types: []string{typeDRA}, Expect: "NodePrepareResources and NodeUnprepareResources answer an empty request without error"},
	{ID: checkDRAHealth, Types: []string{typeDRA}, Expect: "the DRAResourceHealth service is served if and only if it is announced (k/k#141855)",
		Kubelet: "pkg/kubelet/cm/dra/plugin/dra_plugin_manager.go pickHealthService (NodeWatchResources is opened when the service is announced)"},
	{ID: checkDRASlices, Types: []string{typeDRA}, Expect: "with --kubeconfig and --node-name, within --timeout: ResourceSlices name the driver as it registered (spec.driver), each one for a single node is for --node-name (spec.nodeName), and in each pool the newest generation has as many slices as its resourceSliceCount; skipped without --kubeconfig",
		Kubelet: "pkg/kubelet/cm/dra/plugin/dra_plugin_manager.go wipeResourceSlices (the node's slices are deleted by spec.nodeName and spec.driver); staging/src/k8s.io/dynamic-resource-allocation/structured/internal/stable/pools_stable.go GatherPools (the scheduler allocates nothing from an incomplete pool)"},
	{ID: checkDPRegister, Types: []string{typeDevice}, Via: viaKubeletSock, Expect: "a device plugin that calls Register on the device manager's kubelet.sock sends version v1beta1, an extended resource name, and the file name of its socket in the device plugin directory, which accepts connections and answers GetDevicePluginOptions before Register returns",
		Kubelet: "pkg/kubelet/cm/devicemanager/plugin/v1beta1/server.go Register (isVersionCompatibleWithPlugin, IsExtendedResourceName, connectClient: the endpoint joined to the socket directory, dialled and asked GetDevicePluginOptions before Register is answered)"},
	{ID: checkDPOptions, Types: []string{typeDevice}, Expect: "GetDevicePluginOptions answers",
		Kubelet: "pkg/kubelet/cm/devicemanager/plugin/v1beta1/client.go Connect"},
	{ID: checkDPListAndWatch, Types: []string{typeDevice}, Expect: "ListAndWatch sends the inventory at once (within 1 s): device IDs, each Healthy or Unhealthy",
		Kubelet: "pkg/kubelet/cm/devicemanager/plugin/v1beta1/client.go Run (ListAndWatch; no capacity until the first answer)"},
	{ID: checkDPStreamOpen, Types: []string{typeDevice}, Expect: "after the inventory, the ListAndWatch stream stays open (watched for 1 s; further answers are welcome): the kubelet reads every health change from it",
		Kubelet: "pkg/kubelet/cm/devicemanager/plugin/v1beta1/client.go Run (a stream that ends disconnects the plugin: PluginDisconnected marks its devices unhealthy, manager.go markResourceUnhealthy)"},
	{ID: checkDPHealth, Types: []string{typeDevice}, Expect: "after --health-command runs (it makes a device of the plugin's change health), ListAndWatch sends an answer in which a device's health changed, within --timeout; skipped without --health-command: the kit cannot make a device fail by itself",
		Kubelet: "pkg/kubelet/cm/devicemanager/manager.go genericDeviceUpdateCallback (each ListAndWatch answer is the whole inventory; health is read from it alone: allocatable counts the Healthy devices)"},
	{ID: checkDPListAgain, Types: []string{typeDevice}, Expect: "a second ListAndWatch, opened once the first has ended (as a kubelet that connects again opens one), sends the inventory at once (within 1 s), the same devices",
		Kubelet: "pkg/kubelet/cm/devicemanager/plugin/v1beta1/client.go Run (every connection to the plugin, after each registration, opens its own ListAndWatch)"},
	{ID: checkDPRestart, Types: []string{typeDevice}, Via: viaKubeletSock, Expect: "when kubelet.sock is made anew (a kubelet restart), the device plugin calls Register again, with the same request, within --reregister-wait: twice --timeout, 20 s, by default, at most the kubelet's 5 m (the kubelet's stub registers again after 10 s)",
		Kubelet: "pkg/kubelet/cm/devicemanager/plugin/v1beta1/server.go Start (the socket directory emptied and kubelet.sock made anew; a plugin must register again); pkg/kubelet/cm/devicemanager/manager.go readCheckpoint and GetCapacity, types.go endpointStopGracePeriod (the resource at zero capacity until the plugin registers again, and dropped from the Node after 5 m)"},
	{ID: checkRestart, Via: viaRegistry, Expect: "a manager restart (a new connection, GetInfo, NotifyRegistrationStatus) is answered again, with the same GetInfo",
		Kubelet: "pkg/kubelet/pluginmanager/pluginwatcher/plugin_watcher.go (a restarted kubelet walks the directory and registers every socket again)"},
	{ID: checkLateNotify, Via: viaRegistry, Expect: "NotifyRegistrationStatus(true) sent 2 s after GetInfo (a handler that takes its time, as the kubelet's CSI handler calling NodeGetInfo may) is answered, and the plugin is still there"},
	{ID: checkSIGTERM, Started: true, Expect: "on SIGTERM the plugin exits and removes its socket: the registration socket, or a device plugin's own when it registers through kubelet.sock"},
	{ID: checkStale, Via: viaRegistry, Started: true, Expect: "started with a dead socket at its registration path, the plugin replaces it and registers with the same answers"},
	{ID: checkRefused, Via: viaRegistry, Started: true, Expect: "told NotifyRegistrationStatus(false, error): a CSI registrar exits (node-driver-registrar does); a DRA driver or device plugin keeps serving"},
}

// appliesTo says whether c runs for a plugin of type typ.
func (c check) appliesTo(typ string) bool {
	if c.Types == nil {
		return true
	}
	for _, t := range c.Types {
		if t == typ {
			return true
		}
	}
	return false
}

// rule is how a result names the kind of rule a check is.
func (c check) rule() string {
	if c.Kubelet != "" {
		return "kubelet"
	}
	return "recommendation"
}

func checkByID(id string) check {
	for _, c := range catalogue {
		if c.ID == id {
			return c
		}
	}
	panic("conformance: no check " + id) // a typo in this package
}
