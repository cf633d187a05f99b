package pluginmanager

import (
	"fmt"
	"path/filepath"
	"slices"
	"strings"

	"github.com/plugd/plugd/internal/confine"
)

// Peers lists the users and groups a plugin's process may run as.
type Peers struct {
	UIDs []uint32
	GIDs []uint32
}

func (p Peers) allow(who peer) bool {
	return who.known && (slices.Contains(p.UIDs, who.uid) || slices.Contains(p.GIDs, who.gid))
}

// policy is the rules that keep plugins in bounds, from the Options: who
// may serve a plugin (AllowedPeers) and where its endpoint may be
// (EndpointRoots).
type policy struct {
	peers    *Peers   // Options.AllowedPeers
	roots    []string // Options.EndpointRoots, as given, for messages
	resolved []string // the same, resolved (resolveRoots)
}

func newPolicy(o Options) policy {
	return policy{peers: o.AllowedPeers, roots: o.EndpointRoots, resolved: resolveRoots(o.EndpointRoots)}
}

// check applies the rules: who may serve the plugin's type (he's
// AllowedPeers, or the Options' for a type without a handler or without its
// own) and where its endpoint may be. ask asks the kernel who serves the
// plugin; it is called only if a rule applies. Its error names the rule, so
// that an operator knows which setting refused.
func (pol policy) check(p Plugin, ask func() peer, he *handlerEntry) error {
	rule, setting := pol.peers, "Options.AllowedPeers"
	if he != nil {
		rule = he.peers
		if rule != pol.peers {
			setting = "the HandlerOptions.AllowedPeers of its type"
		}
	}
	if rule != nil {
		if who := ask(); !rule.allow(who) {
			return refusedPeer(p, who, rule, setting)
		}
	}
	if len(pol.roots) > 0 && p.Endpoint != p.Socket {
		ep := confine.ResolveExisting(p.Endpoint) // a symlink inside a root may point out of it (Endpoint is clean: EndpointPath)
		if !slices.ContainsFunc(pol.resolved, func(root string) bool { return confine.Within(ep, root) }) {
			return fmt.Errorf("endpoint %s is outside the directories Options.EndpointRoots allows (%s)", p.Endpoint, strings.Join(pol.roots, ", "))
		}
	}
	return nil
}

// refusedPeer says why rule, the AllowedPeers of setting, refuses who.
func refusedPeer(p Plugin, who peer, rule *Peers, setting string) error {
	if !who.known {
		return fmt.Errorf("the credentials of the process serving %s could not be read, and %s requires them", p.Socket, setting)
	}
	return fmt.Errorf("the process serving %s (pid %d) runs as uid %d, gid %d, which %s does not allow for %s plugins (uids %v, gids %v)",
		p.Socket, who.pid, who.uid, who.gid, setting, p.Type, rule.UIDs, rule.GIDs)
}

// resolveRoots cleans the endpoint roots and resolves their symlinks, so that
// they compare with resolved endpoints.
func resolveRoots(roots []string) []string {
	out := make([]string, 0, len(roots))
	for _, r := range roots {
		out = append(out, confine.ResolveExisting(filepath.Clean(r)))
	}
	return out
}
