package doctor

import (
	"fmt"

	"github.com/plugd/plugd/api"
)

// rejected reports each plugin plugd rejected (refused for a reason
// retrying cannot fix), with plugd's reason and error and what to do, unless
// a finding about its socket says why already (refused versions, a path
// too long): plugctl list shows it Rejected, and the doctor must not find
// nothing wrong.
func (c *checker) rejected() {
	for i := range c.in.Plugins {
		p := &c.in.Plugins[i]
		if p.State != api.StateRejected || len(c.found[p.Socket]) > 0 {
			continue
		}
		ev := []string{"reason: " + orNone(p.Reason)}
		if p.LastError != "" {
			ev = append(ev, "error: "+p.LastError)
		}
		c.add(about(api.Finding{Severity: api.SeverityError, Check: "plugin-rejected",
			Summary:  fmt.Sprintf("plugd rejected %s (%s): it is not registered, and is tried again only when its socket changes", who(p), orNone(p.Reason)),
			Evidence: ev,
			Remedy:   rejectedRemedy(p)}, p))
	}
}

// rejectedRemedy is what to do about a plugin rejected as p.Reason says.
func rejectedRemedy(p *Target) string {
	switch p.Reason {
	case api.ReasonNoHandler:
		return fmt.Sprintf("plugd has no handler for the type %s: add one (config handlers: [{type: %s, handler: accept}], or --handler %s=accept; the defaults are CSIPlugin, DRAPlugin and DevicePlugin), then restart the plugin or send plugd SIGHUP", p.Type, p.Type, p.Type)
	case api.ReasonValidate:
		return "the handler refused the plugin: fix what the error says in the plugin (its name, versions or endpoint), then restart it"
	case api.ReasonInvalidInfo:
		return "the plugin's GetInfo answer breaks a rule of the protocol (the error says which): fix the plugin"
	case api.ReasonPolicy:
		return "a rule of plugd's configuration refused it (policy.endpointRoots, policy.allowedPeers, the registry directory's safety): fix the plugin, or the rule, as the error says"
	case api.ReasonGetInfo:
		return "the socket does not serve the Registration service: is it a registration socket? Move other sockets out of the registry directory"
	}
	return "see the error; restart the plugin once it is fixed (its socket made again is tried afresh)"
}

// who names a plugin for a person.
func who(p *Target) string {
	if p.Type == "" {
		return p.Socket
	}
	return fmt.Sprintf("%s %s (%s)", p.Type, p.Name, p.Socket)
}
