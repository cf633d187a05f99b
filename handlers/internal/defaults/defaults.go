// Package defaults holds the option defaults that the dra and deviceplugin
// handlers share, so that both handlers, and plugd's configuration reference
// (through the handlers' exported DefaultGracePeriod), say one thing.
package defaults

import "time"

const (
	// GracePeriod is what a zero Options.GracePeriod means: how long a
	// driver or resource is kept while its plugin is away. The kubelet's.
	GracePeriod = 30 * time.Second

	// CallTimeout is what a zero Options.CallTimeout means: the bound on
	// a handler's own calls to a plugin's endpoint.
	CallTimeout = 10 * time.Second
)
