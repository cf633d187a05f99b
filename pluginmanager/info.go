package pluginmanager

import (
	"fmt"
	"unicode"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"

	"github.com/plugd/plugd/internal/textsafe"
)

// Bounds on what a plugin may send. GetInfo's answer is small; anything larger
// is a broken or hostile plugin, refused before it costs memory.
const (
	maxInfoBytes    = 64 << 10
	maxTypeLen      = 128
	maxNameLen      = 256
	maxEndpointLen  = 4096
	maxVersions     = 32
	maxVersionLen   = 64
	maxErrorMessage = 1024 // the reason sent back to a plugin
)

// pluginFromInfo checks a GetInfo answer against the bounds and turns it into a
// Plugin. An empty endpoint means the registration socket itself.
func pluginFromInfo(info *registerapi.PluginInfo, socket string) (Plugin, error) {
	p := Plugin{
		Type:     info.GetType(),
		Name:     info.GetName(),
		Endpoint: info.GetEndpoint(),
		Versions: info.GetSupportedVersions(),
		Socket:   socket,
	}
	if err := checkField("type", p.Type, maxTypeLen, true); err != nil {
		return p, err
	}
	if err := checkField("name", p.Name, maxNameLen, true); err != nil {
		return p, err
	}
	if len(p.Versions) > maxVersions {
		return p, fmt.Errorf("%w: %d supported versions, at most %d are allowed", errInvalidInfo, len(p.Versions), maxVersions)
	}
	for i, v := range p.Versions {
		if err := checkField("supported_versions", v, maxVersionLen, true); err != nil {
			// Named with its index only when it is wrong: no string is
			// made for every version of every answer.
			return p, checkField(fmt.Sprintf("supported_versions[%d]", i), v, maxVersionLen, true)
		}
	}
	sentNone := p.Endpoint == ""
	if sentNone {
		p.Endpoint = socket
	}
	ep, err := EndpointPath(p.Endpoint)
	if sentNone && err != nil {
		// The plugin sent no endpoint: what is wrong is its socket's name.
		return p, fmt.Errorf("%w: it sent no endpoint, so its registration socket is taken for one, and that cannot be (%w): rename the socket, or send an endpoint", errInvalidInfo, err)
	}
	if err != nil {
		return p, fmt.Errorf("%w: %w", errInvalidInfo, err)
	}
	p.Endpoint = ep
	return p, nil
}

// unimplemented reports whether the plugin does not serve the Registration
// service at all: no retry will change that.
func unimplemented(err error) bool {
	return status.Code(err) == codes.Unimplemented
}

// printable makes a message from a plugin, or about one, safe to store and to
// show (see textsafe): a plugin chooses its GetInfo error and its socket's
// name; neither may reach an operator's terminal raw.
func printable(s string) string { return textsafe.Printable(s, maxErrorMessage) }

// checkField enforces a length limit and printable characters without spaces.
func checkField(name, v string, max int, required bool) error {
	if v == "" {
		if required {
			return fmt.Errorf("%w: %s is empty", errInvalidInfo, name)
		}
		return nil
	}
	if len(v) > max {
		return fmt.Errorf("%w: %s is %d bytes long, at most %d are allowed", errInvalidInfo, name, len(v), max)
	}
	if !token(v) {
		return fmt.Errorf("%w: %s %.64q has a character that is not printable or is a space", errInvalidInfo, name, v)
	}
	return nil
}

// token says whether v is printable, without spaces: what every field of a
// GetInfo answer must be.
func token(v string) bool {
	for _, r := range v {
		if r == unicode.ReplacementChar || !unicode.IsPrint(r) || unicode.IsSpace(r) {
			return false
		}
	}
	return true
}
