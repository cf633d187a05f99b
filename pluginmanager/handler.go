package pluginmanager

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Plugin is what a plugin said about itself in GetInfo, and where it was found.
type Plugin struct {
	// Type selects the handler: "CSIPlugin", "DRAPlugin", "DevicePlugin" or a custom type.
	Type string `json:"type"`
	// Name identifies the plugin to its handler, e.g. a CSI driver name.
	Name string `json:"name"`
	// Endpoint is where the plugin serves its own API: the clean absolute
	// path of a unix socket, whether the plugin sent that or a unix:// URL of
	// it (EndpointPath is the rule; a plugin whose endpoint breaks it is
	// Rejected, reason invalid_info, and no handler sees it). The manager,
	// its handlers, its observers and the status all use this one path. It
	// is never empty once the plugin has answered: a plugin that sends none
	// is served on its registration socket.
	Endpoint string `json:"endpoint"`
	// Versions are the versions of its type's API the plugin supports, in its order.
	Versions []string `json:"versions"`
	// Socket is the path of the registration socket in the registry directory.
	Socket string `json:"socket"`
}

// Handler accepts plugins of one type. The manager calls it for one socket at a
// time, but for different sockets concurrently, so a Handler must be safe for
// concurrent use.
//
// Every call carries a deadline (Options.HandlerTimeout). A call that outlives it
// is abandoned: its result is ignored, the attempt counts as failed, and the
// handler is not called again for that socket until the abandoned call returns.
// A panic is recovered and counted as a failure of that call.
type Handler interface {
	// Validate decides whether the plugin may register. An error it returns
	// rejects the plugin until its socket changes (TerminalError or not); a
	// Validate that times out or panics is retried instead, as is a
	// KubeletHandler's refusal (as for Register's errors, below).
	Validate(ctx context.Context, p Plugin) error
	// Register takes the plugin into use. An error is reported to the plugin and
	// retried with backoff, unless it is a TerminalError, which rejects the plugin.
	// But while the endpoint the plugin announced (one of its own, not its
	// registration socket) takes no connection, an error that is not a
	// TerminalError is not reported to it: the plugin is Failed, reason
	// endpoint, until the endpoint takes connections, and tried again within
	// 2 s of that (a registrar told it was not registered may exit, as
	// node-driver-registrar does, and its plugin would never register).
	Register(ctx context.Context, p Plugin) error
	// Deregister lets the plugin go: its socket disappeared or was replaced.
	Deregister(ctx context.Context, p Plugin)
}

// Observer looks at plugins without taking them, for a manager observing
// (Options.Observe) beside another manager that registers them. Add one per
// plugin type with Manager.AddObserver; a manager that registers plugins
// does not use observers. After every GetInfo that answered, the manager
// calls Observe, with a deadline (Options.HandlerTimeout); Observe must only
// read, since the plugin belongs to another manager, and its error means the
// plugin's own service does not answer as it should: the plugin is then
// NotAnswering, reason endpoint. Forget is called when the plugin's socket
// is gone, as Observe is (a panic recovered, HandlerTimeout to return in;
// one that takes longer is left to finish while the manager goes on). An
// Observer must be safe for concurrent use.
type Observer interface {
	Observe(ctx context.Context, p Plugin) error
	Forget(p Plugin)
}

// Detailer is implemented by a Handler (or an Observer) that can say what it
// knows of the plugins it holds, as http.Flusher is by a ResponseWriter that
// can flush: whoever shows a plugin's status checks for it with a type
// assertion. Details returns what the handler knows of p beyond what GetInfo
// said (a CSI driver's node id, a device plugin's devices), as a value that
// encodes to a JSON object, or nil if it holds nothing of p (never
// registered or observed, or let go since).
//
// The manager never calls it. plugd's status API does, for every plugin it
// lists: the value is the plugin's details (api.Plugin.Details, which
// `plugctl get -o json` prints), encoded with encoding/json. The built-in
// handlers return the types of package api (api.CSIDetails,
// api.DevicePluginDetails, ...), and plugd's node agent reads what it holds
// against the kubelet's view from those; a handler of your own returns a type
// of its own. Details is called from any goroutine, concurrently with the
// handler's other methods and without a deadline, so it must answer from
// what the handler holds, not call the plugin, and return a value that
// shares nothing the handler goes on changing. plugintest.TestHandler checks
// a handler that has it.
type Detailer interface {
	Details(p Plugin) any
}

// HandlerOptions are the settings of one plugin type, given to AddHandler
// with its handler. The zero value of each field means the Options of the
// manager.
type HandlerOptions struct {
	// UnhealthyGrace is how long an Unhealthy plugin of this type stays
	// registered before it is deregistered. Zero means
	// Options.UnhealthyGrace; negative, for ever: an Unhealthy plugin stays
	// registered until its socket goes, as the kubelet keeps every plugin
	// (see KubeletHandler).
	UnhealthyGrace time.Duration
	// ProbeInterval is how often a registered plugin of this type is asked
	// GetInfo as a routine probe (see Options.ProbeInterval). Zero means
	// Options.ProbeInterval; negative, no routine probes for this type (its
	// plugins' connections are still held, and their hang-ups heard).
	ProbeInterval time.Duration
	// DeregisterWithRegistrar makes a plugin of this type whose registration
	// socket stops answering Unhealthy, and deregistered after
	// UnhealthyGrace, even while its handler reports its endpoint serving
	// (see EndpointReporter). Off, the default for every type: the plugin
	// stays registered while its endpoint serves, as a CSI driver does with
	// the kubelet when its node-driver-registrar dies and leaves its socket
	// behind. A handler that reports nothing of its endpoints makes this
	// moot: its plugins are judged by their registration socket alone.
	DeregisterWithRegistrar bool
	// AllowedPeers, if set, says who may serve registration sockets of this
	// type, in place of Options.AllowedPeers: the process listening on the
	// socket (as the kernel reports it, see Options.AllowedPeers) must run as
	// one of its UIDs or GIDs. AddHandler panics if it is set on Windows.
	AllowedPeers *Peers
}

// HandlerFuncs is a Handler built from functions, like http.HandlerFunc. A nil
// ValidateFunc or RegisterFunc accepts every plugin; a nil DeregisterFunc does nothing.
type HandlerFuncs struct {
	ValidateFunc   func(ctx context.Context, p Plugin) error
	RegisterFunc   func(ctx context.Context, p Plugin) error
	DeregisterFunc func(ctx context.Context, p Plugin)
}

// Validate calls f.ValidateFunc if it is set.
func (f HandlerFuncs) Validate(ctx context.Context, p Plugin) error {
	if f.ValidateFunc == nil {
		return nil
	}
	return f.ValidateFunc(ctx, p)
}

// Register calls f.RegisterFunc if it is set.
func (f HandlerFuncs) Register(ctx context.Context, p Plugin) error {
	if f.RegisterFunc == nil {
		return nil
	}
	return f.RegisterFunc(ctx, p)
}

// Deregister calls f.DeregisterFunc if it is set.
func (f HandlerFuncs) Deregister(ctx context.Context, p Plugin) {
	if f.DeregisterFunc != nil {
		f.DeregisterFunc(ctx, p)
	}
}

// KubeletPluginHandler is the shape of a handler written for the kubelet's plugin
// manager. Wrap one with KubeletHandler to use it unchanged.
type KubeletPluginHandler interface {
	ValidatePlugin(ctx context.Context, pluginName, endpoint string, versions []string) error
	RegisterPlugin(ctx context.Context, pluginName, endpoint string, versions []string, pluginClientTimeout *time.Duration) error
	DeRegisterPlugin(ctx context.Context, pluginName, endpoint string)
}

// KubeletHandler adapts a kubelet-style handler to Handler, and calls it as
// the kubelet's plugin manager (v1.37) does:
//
//   - RegisterPlugin's pluginClientTimeout is nil, so that the handler uses
//     its own default for the calls it makes to the plugin later (the
//     kubelet's DRA handler 45s per prepare and unprepare, its CSI handler 2m
//     for NodeGetInfo);
//   - each method's context has no deadline and is not cancelled when the
//     call returns, only when the manager's Run ends: the kubelet passes its
//     own lifetime context, and its handlers keep work on it (the device
//     manager runs a plugin's ListAndWatch stream on RegisterPlugin's
//     context). It carries the values of the manager's own call context.
//     The manager still waits for each call at most Options.HandlerTimeout:
//     one that outlives that is abandoned (not cancelled), as any handler's;
//   - a ValidatePlugin refusal is retried with backoff, not Rejected for
//     good: the kubelet's CSI handler refuses a second socket of a
//     registered driver and expects to be asked again, which then succeeds
//     once the first socket has gone.
//
// One thing differs from the kubelet, which never looks at a registered
// plugin again: the manager's liveness. A kubelet handler says nothing of
// the plugin's endpoint (EndpointReporter), so the registration socket
// alone tells whether the plugin lives, and a plugin whose registrar dies
// while its driver still serves (node-driver-registrar killed beside a
// healthy CSI driver, its socket left behind) is Unhealthy at once and
// deregistered at the end of its grace period (Options.UnhealthyGrace,
// 30 s): the kubelet's CSI handler then removes the driver, which the
// kubelet would have kept. To keep it as the kubelet does, add the handler
// with a negative grace, so that an Unhealthy plugin of its type stays
// registered until its socket goes:
//
//	m.AddHandler("CSIPlugin", pluginmanager.KubeletHandler(csi),
//		pluginmanager.HandlerOptions{UnhealthyGrace: -1})
func KubeletHandler(h KubeletPluginHandler) Handler {
	return kubeletHandler{h}
}

type kubeletHandler struct{ h KubeletPluginHandler }

// kubeletContext is the context a kubelet handler is given for a call made
// with ctx (see KubeletHandler).
func kubeletContext(ctx context.Context) context.Context {
	if life, ok := ctx.Value(lifetimeKey{}).(context.Context); ok && life.Err() == nil {
		return life
	}
	return context.WithoutCancel(ctx) // shutting down, or called outside Run
}

// lifetimeKey carries Run's context to kubelet handlers.
type lifetimeKey struct{}

func (k kubeletHandler) Validate(ctx context.Context, p Plugin) error {
	if err := k.h.ValidatePlugin(kubeletContext(ctx), p.Name, p.Endpoint, p.Versions); err != nil {
		return &retryableError{err}
	}
	return nil
}

func (k kubeletHandler) Register(ctx context.Context, p Plugin) error {
	return k.h.RegisterPlugin(kubeletContext(ctx), p.Name, p.Endpoint, p.Versions, nil)
}

func (k kubeletHandler) Deregister(ctx context.Context, p Plugin) {
	k.h.DeRegisterPlugin(kubeletContext(ctx), p.Name, p.Endpoint)
}

// retryableError is a Validate refusal that is retried with backoff rather
// than final: a kubelet handler's, which the kubelet retries.
type retryableError struct{ err error }

func (e *retryableError) Error() string { return e.err.Error() }
func (e *retryableError) Unwrap() error { return e.err }

func isRetryable(err error) bool {
	var r *retryableError
	return errors.As(err, &r)
}

// TerminalError marks err as not worth retrying: a Register that returns it
// parks the plugin as Rejected until its socket changes. It returns nil for nil.
func TerminalError(err error) error {
	if err == nil {
		return nil
	}
	return &terminalError{err}
}

type terminalError struct{ err error }

func (e *terminalError) Error() string { return e.err.Error() }
func (e *terminalError) Unwrap() error { return e.err }

func isTerminal(err error) bool {
	var t *terminalError
	return errors.As(err, &t)
}

// The errors behind two of the reasons; callers branch on Reason, which the
// status and events carry, so these stay unexported.
var (
	errNoHandler   = errors.New("no handler for plugin type")
	errInvalidInfo = errors.New("invalid plugin info")
)

// Reason says at which step a registration attempt failed. It is a small fixed
// set, so it is safe as a metric label.
type Reason string

// The reasons an attempt can fail.
const (
	ReasonDial        Reason = "dial"         // the registration socket did not accept a connection
	ReasonGetInfo     Reason = "get_info"     // GetInfo failed or timed out
	ReasonInvalidInfo Reason = "invalid_info" // GetInfo's answer broke a rule
	ReasonNoHandler   Reason = "no_handler"   // no handler for the type
	ReasonValidate    Reason = "validate"     // the handler's Validate refused or failed
	ReasonRegister    Reason = "register"     // the handler's Register failed
	ReasonNotify      Reason = "notify"       // the plugin could not be told it was registered
	ReasonPolicy      Reason = "policy"       // a rule of the manager's options refused it (endpoint roots, peer credentials)
	ReasonUnhealthy   Reason = "unhealthy"    // it stopped answering while registered
	ReasonEndpoint    Reason = "endpoint"     // its own service went, or did not answer its handler's (or observer's) look
)

// handlerPanic is the error a recovered panic turns into.
func handlerPanic(op string, v any) error {
	return fmt.Errorf("handler %s panicked: %v", op, v)
}
