//go:build linux

package kube

import (
	"context"
	"testing"

	kubeletcsi "k8s.io/kubernetes/pkg/volume/csi"

	"github.com/plugd/plugd/handlers/csi"
	"github.com/plugd/plugd/pluginmanager"
)

// plugd's CSI handler accepts exactly the version lists the kubelet's own
// CSI registration handler accepts: a plugin author who tests a registrar
// against plugd learns what the kubelet will say of it.
func TestCSIVersionsAsTheKubelet(t *testing.T) {
	const name, endpoint = "csi.example.com", "/run/csi/csi.sock"
	ctx := context.Background()
	h := csi.New(csi.Options{})
	defer h.Close()
	kubelet := &kubeletcsi.RegistrationHandler{}
	accepted, refused := 0, 0
	for _, versions := range [][]string{
		{"1.0.0"}, {"1.2"}, {"v1.5.0"}, {"0.3.0", "1.0.0-rc1"}, {"1.0.0.0"}, {"1.0-"},
		{" 1.0.0 "}, {"1.0", "2.0"}, {"1.0.0+build.7"}, {"1.0.0", "1.0.0-rc1"},
		{"1"}, {"2.0.0", "junk", "1"}, {"1.x"}, {"-1.0"}, {"v"}, {"1..0"}, {"01.0"},
		{"0.3.0"}, {"2.0.0"}, {"v1.99999999999999999999"}, {""}, {}, nil,
	} {
		plugdErr := h.Validate(ctx, pluginmanager.Plugin{Type: csi.Type, Name: name, Endpoint: endpoint, Versions: versions, Socket: "/reg/x.sock"})
		kubeletErr := kubelet.ValidatePlugin(ctx, name, endpoint, versions)
		if (plugdErr == nil) != (kubeletErr == nil) {
			t.Errorf("versions %q: plugd says %v, the kubelet says %v", versions, plugdErr, kubeletErr)
		}
		if kubeletErr == nil {
			accepted++
		} else {
			refused++
		}
	}
	if accepted == 0 || refused == 0 {
		t.Fatalf("the kubelet accepted %d lists and refused %d: the table must hold both", accepted, refused)
	}
}
