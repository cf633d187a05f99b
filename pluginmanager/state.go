package pluginmanager

import (
	"time"
)

// State is where a registration socket stands.
type State string

// The states of a socket. Pending -> Registering -> Registered is the happy
// path; Failed is retried with backoff; Rejected waits for the socket to change
// (or, for a missing handler, for AddHandler).
const (
	StatePending     State = "Pending"     // discovered, not yet tried
	StateRegistering State = "Registering" // an attempt is under way
	StateRegistered  State = "Registered"  // the handler accepted it and the plugin was told
	StateFailed      State = "Failed"      // the last attempt failed; retried at NextRetry
	StateRejected    State = "Rejected"    // refused for a reason retrying cannot fix
	StateStale       State = "Stale"       // a socket file nobody listens on (a crashed plugin's); retried
	StateUnhealthy   State = "Unhealthy"   // registered, but stopped answering; deregistered after a grace period
)

// The states of a socket in observe mode (Options.Observe), which say what
// was seen rather than what was decided.
const (
	StateAnswering    State = "Answering"    // it answered GetInfo at the last look
	StateNotAnswering State = "NotAnswering" // it did not answer, or answered nonsense; Reason says which
)

// registered reports whether a handler holds the plugin in state s.
func (s State) registered() bool { return s == StateRegistered || s == StateUnhealthy }

// PluginStatus is what the manager knows of one registration socket.
type PluginStatus struct {
	// Plugin is what the plugin said in GetInfo; until it has answered, only
	// Socket is set.
	Plugin
	// LastAnswer is what a plugin at this path last said in GetInfo: Plugin
	// once this socket file has answered, and until then what the one before
	// it at the same path said (a plugin restarted in place makes a new
	// file, which is Pending until it answers; a plugin that answered a
	// probe as another is registered afresh), so that a socket is known by
	// its type and name while it says nothing. Zero if nothing at the path
	// has answered since the manager found it.
	LastAnswer Plugin `json:"lastAnswer,omitzero"`
	State      State  `json:"state"`
	// Reason and LastError describe the last failure; empty after a success.
	Reason    Reason `json:"reason,omitempty"`
	LastError string `json:"lastError,omitempty"`
	// Attempts counts registration attempts since this socket file appeared.
	Attempts int `json:"attempts"`
	// NextRetry is when a Failed (or Stale) socket is tried again; when
	// observing, when one that did not answer is looked at again.
	NextRetry time.Time `json:"nextRetry,omitzero"`
	// Discovered is when this socket file was first seen.
	Discovered time.Time `json:"discovered"`
	// Created is when the socket file was made (its birth time, or its
	// change time where the filesystem keeps none): a Stale socket's age.
	Created time.Time `json:"created,omitzero"`
	// UnhealthySince is when a registered plugin stopped answering its
	// liveness probe; zero while it answers.
	UnhealthySince time.Time `json:"unhealthySince,omitzero"`
	// RegisteredSince is when the current registration succeeded.
	RegisteredSince time.Time `json:"registeredSince,omitzero"`
	// Newest is set on the most recently created of several registered
	// sockets with the same (type, name): during a rolling update, the new
	// instance.
	Newest bool `json:"newest,omitempty"`
}
