package kubenode

import (
	"slices"
	"time"

	"github.com/plugd/plugd/api"
)

// Socket is one registration socket as plugd sees it, and what its
// handler says of it: the node agent's input (Config.Sockets), which the
// daemon builds from the manager's snapshot. (Not a plugin: a plugin may
// have several sockets, during a rolling restart, and a socket may be no
// one's yet.)
type Socket struct {
	// Path is the socket file's path, in plugd's view of the registry
	// directory.
	Path string
	Type string
	Name string
	// State is plugd's state of the socket (Registered, Answering, Stale...).
	State string
	// Answering says the socket is served and its plugin answers: Registered
	// when managing, Answering when observing.
	Answering bool
	// Unsettled says plugd has not looked at the socket yet (it was just
	// found): nothing is concluded from it until it has.
	Unsettled bool
	// Created is when the socket file was made: a re-created socket is a
	// new registration for the kubelet.
	Created time.Time
	// Details is what the plugin's handler says of it
	// (pluginmanager.Detailer), nil if nothing. The node agent holds two
	// facts of it against the kubelet's side, read from the types the
	// built-in handlers return: a CSI driver's NodeGetInfo (api.CSIDetails:
	// its node id and topology) and a device plugin's devices by health
	// (api.DevicePluginDetails, from a stream the handler keeps, or
	// api.DevicePluginObserved, from a look at ObservedAt). Any other
	// value says nothing the node agent uses.
	Details any
}

// nodeInfo is what a CSI driver's NodeGetInfo answered, as its handler
// recorded it; empty if the handler does not ask.
func (p Socket) nodeInfo() (nodeID string, topology map[string]string) {
	if d, ok := p.Details.(api.CSIDetails); ok {
		return d.NodeID, d.Topology
	}
	return "", nil
}

// devices is what a device plugin's handler knows of its devices: how many
// there are, how many are healthy, and when it saw them (zero: a stream
// the handler keeps, current). known is false if the handler does not
// say.
func (p Socket) devices() (healthy, devices int, at time.Time, known bool) {
	var byHealth map[string]int
	switch d := p.Details.(type) {
	case api.DevicePluginDetails:
		byHealth = d.Devices
	case api.DevicePluginObserved:
		byHealth, at = d.Devices, d.ObservedAt
	}
	if byHealth == nil {
		return 0, 0, time.Time{}, false
	}
	for health, n := range byHealth {
		devices += n
		if health == api.DeviceHealthy {
			healthy += n
		}
	}
	return healthy, devices, at, true
}

// nodeIDs are the node ids a CSI driver's sockets answered, each once.
func nodeIDs(socks []Socket) []string {
	var said []string
	for _, p := range socks {
		if id, _ := p.nodeInfo(); id != "" && !slices.Contains(said, id) {
			said = append(said, id)
		}
	}
	return said
}

// deviceCounts is a device plugin's devices as its handler sees them, from
// the socket that reports the most healthy ones (the serving instance,
// during a rolling update).
func deviceCounts(socks []Socket) (healthy, devices int, at time.Time, known bool) {
	for _, p := range socks {
		if !p.Answering {
			continue
		}
		if h, d, seen, ok := p.devices(); ok && (!known || h > healthy) {
			healthy, devices, at, known = h, d, seen, true
		}
	}
	return healthy, devices, at, known
}
