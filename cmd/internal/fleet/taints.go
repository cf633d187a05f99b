package fleet

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/plugd/plugd/api"
	"github.com/plugd/plugd/internal/nodecond"
)

// What the node view shows of startup taints: the Node's own taints and
// their last writer (read with the Node, at no cost), and each expected
// plugin's taint with its state as plugd on the node keeps it (plugctl
// get's), asked through the API server's proxy to plugd's pod: one
// request when a person looks, no write. Which taint is which plugin's is
// plugd's configuration, which nothing on the Node records.

// pluginsPath is plugd's plugins on its status API.
const pluginsPath = "/v1/plugins"

// taintsOf are n's taints but Kubernetes' own (nodecond.StartupTaints),
// and who last wrote the list, when.
func taintsOf(n *corev1.Node) (taints []string, by string, at time.Time) {
	taints = append([]string{}, nodecond.StartupTaints(n)...)
	by, at = nodecond.TaintsWriter(n)
	return taints, by, at
}

// plugdTaints fills in each of plugins' taints as plugd on node shows
// them, asked through the API server's proxy to its pod (o finds it), or
// says why it cannot.
func plugdTaints(ctx context.Context, c Clients, node string, o DoctorOptions, plugins []NodePlugin) error {
	o = o.withDefaults()
	pod, fs := plugdPod(ctx, c, node, o)
	if pod == nil {
		if len(fs) > 0 {
			return errors.New(strings.Join(append([]string{fs[0].Summary}, fs[0].Evidence...), ": "))
		}
		return errors.New("no plugd pod")
	}
	port := statusPort(pod)
	if port == "" {
		return fmt.Errorf("plugd's pod %s declares no port named status", pod.Name)
	}
	ctx, cancel := context.WithTimeout(ctx, o.ReportTimeout)
	defer cancel()
	b, err := c.Core.Pods(pod.Namespace).ProxyGet("http", pod.Name, port, pluginsPath, nil).DoRaw(ctx)
	if err != nil {
		return fmt.Errorf("GET pods/%s/proxy%s on port %s: %w (on the node: plugctl list -o wide)", pod.Name, pluginsPath, port, short(err))
	}
	var l api.PluginList
	if err := json.Unmarshal(b, &l); err != nil {
		return fmt.Errorf("plugd's answer through the pod proxy is not its list of plugins: %w", short(err))
	}
	for i := range plugins {
		p := &plugins[i]
		for _, q := range l.Plugins {
			if q.Type == p.Type && q.Name == p.Name && len(q.Taints) > 0 {
				p.Taints = q.Taints
				break
			}
		}
	}
	return nil
}
