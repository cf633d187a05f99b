package daemon

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"

	"github.com/plugd/plugd/pluginmanager"
)

// newHandler returns the built-in handler of that name (checked by WithDefaults).
func newHandler(name string) pluginmanager.Handler {
	switch name {
	case "accept":
		return acceptHandler{}
	}
	panic("daemon: unknown handler " + name)
}

// acceptHandler accepts any plugin whose fields make sense: an endpoint that is
// an absolute path, and at least one version. It is what plugd offers for a
// type until a handler that knows the type exists.
type acceptHandler struct{}

func (acceptHandler) Validate(_ context.Context, p pluginmanager.Plugin) error {
	if !filepath.IsAbs(p.Endpoint) {
		return fmt.Errorf("endpoint %q is not an absolute path", p.Endpoint)
	}
	if len(p.Versions) == 0 {
		return errors.New("the plugin lists no supported versions")
	}
	return nil
}

func (acceptHandler) Register(context.Context, pluginmanager.Plugin) error { return nil }

func (acceptHandler) Deregister(context.Context, pluginmanager.Plugin) {}
