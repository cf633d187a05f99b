// Package api is plugd's status API as seen from outside: the JSON types the
// daemon serves and a Go client for them. The daemon and plugctl both import
// it; it imports nothing of the daemon.
//
// Endpoints (HTTP on a unix socket by default, see DefaultSocket):
//
//	GET /v1/plugins[?type=T&name=N&state=S]   PluginList
//	GET /v1/plugins/{id}                      Plugin (id: the socket's path inside the registry directory)
//	GET /v1/events[?replay=N]                 a stream of Event, one JSON object per line
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
	// State is one of States: Pending, Registering, Registered, Failed,
	// Stale (a socket nobody listens on), Rejected, Unhealthy (registered,
	// but not answering its liveness probe); a plugd in observe mode reports
	// only Pending, Answering, NotAnswering and Stale.
	State string `json:"state"`
	// Reason is the step the last attempt failed at (dial, get_info,
	// invalid_info, no_handler, validate, register, notify); LastError says why.
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
	// run), as a JSON object; absent if the handler reports nothing.
	Details any `json:"details,omitempty"`
}

// States are the states a plugin can be in, from the happy path to trouble.
var States = []string{"Pending", "Registering", "Registered", "Failed", "Stale", "Rejected", "Unhealthy", "Answering", "NotAnswering"}

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
	Type   string    `json:"type"` // Discovered, Registered, Failed, Rejected, Unhealthy, Healthy, Deregistered, Removed, Lost; observing: Answering, NotAnswering, Looked (a look that found nothing new)
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
