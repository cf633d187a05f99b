package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/plugd/plugd/handlers/csi"
	"github.com/plugd/plugd/handlers/deviceplugin"
	"github.com/plugd/plugd/handlers/dra"
	"github.com/plugd/plugd/handlers/hook"
	"github.com/plugd/plugd/pluginmanager"
)

// handler is a built-in handler as the daemon runs it: close stops what it
// started (connections, streams), after the manager has stopped.
type handler struct {
	pluginmanager.Handler
	close func()
}

// handlerList is the handlers as a person reads them: "CSIPlugin=csi,
// example.com/Greeter=hook".
func handlerList(hs []HandlerConfig) string {
	parts := make([]string, len(hs))
	for i, h := range hs {
		parts[i] = h.Type + "=" + h.Handler
	}
	return strings.Join(parts, ", ")
}

// checkHandler refuses settings that do not belong to the handler named.
func checkHandler(h HandlerConfig) error {
	if h.Handler == "hook" {
		if h.Hook == nil {
			return errors.New("handler hook needs hook: {command: [...]} or hook: {url: ...}")
		}
		if _, err := hook.New(hookConfig(h.Hook), hook.Options{}); err != nil {
			return err
		}
	} else if h.Hook != nil {
		return fmt.Errorf("hook is set, but the handler is %s: remove it, or use handler: hook", h.Handler)
	}
	if h.GracePeriod != 0 && h.Handler != "dra" && h.Handler != "deviceplugin" {
		return fmt.Errorf("gracePeriod applies to the dra and deviceplugin handlers, not %s", h.Handler)
	}
	return h.checkBounds()
}

func hookConfig(h *HookConfig) hook.Config {
	return hook.Config{Command: h.Command, URL: h.URL, Timeout: time.Duration(h.Timeout), Events: h.Events, Env: h.Env}
}

// newHandler builds the handler hc names (checked by WithDefaults), its
// connections to endpoints confined to roots (policy.endpointRoots) at every
// connection, as the manager confines registrations. Its
// metrics carry the plugin type it serves, so that two types served by the
// same kind of handler do not collide.
func newHandler(hc HandlerConfig, roots []string, log *slog.Logger, reg prometheus.Registerer, changed func()) (handler, error) {
	log = log.With("handler", hc.Handler, "pluginType", hc.Type)
	if reg != nil {
		reg = prometheus.WrapRegistererWith(prometheus.Labels{"plugin_type": hc.Type}, reg)
	}
	grace := time.Duration(hc.GracePeriod)
	switch hc.Handler {
	case "accept":
		return handler{acceptHandler{}, func() {}}, nil
	case "csi":
		h := csi.New(csi.Options{Logger: log, Registerer: reg, EndpointRoots: roots})
		return handler{h, h.Close}, nil
	case "deviceplugin":
		h := deviceplugin.New(deviceplugin.Options{Logger: log, Registerer: reg, GracePeriod: grace, EndpointRoots: roots})
		return handler{h, h.Close}, nil
	case "dra":
		h := dra.New(dra.Options{Logger: log, Registerer: reg, GracePeriod: grace, EndpointRoots: roots, Changed: changed})
		return handler{h, h.Close}, nil
	case "hook":
		h, err := hook.New(hookConfig(hc.Hook), hook.Options{Logger: log, Registerer: reg})
		if err != nil {
			return handler{}, err
		}
		return handler{h, func() {}}, nil
	}
	return handler{}, fmt.Errorf("unknown handler %q", hc.Handler)
}

// acceptHandler accepts any plugin whose fields make sense: an endpoint by
// the manager's rule (pluginmanager.EndpointPath), and at least one
// version. It is what plugd offers for a type until a handler that knows the
// type exists.
type acceptHandler struct{}

func (acceptHandler) Validate(_ context.Context, p pluginmanager.Plugin) error {
	if _, err := pluginmanager.EndpointPath(p.Endpoint); err != nil {
		return err
	}
	if len(p.Versions) == 0 {
		return errors.New("the plugin lists no supported versions")
	}
	return nil
}

func (acceptHandler) Register(context.Context, pluginmanager.Plugin) error { return nil }

func (acceptHandler) Deregister(context.Context, pluginmanager.Plugin) {}
