package csi_test

import (
	"testing"

	"github.com/plugd/plugd/handlers/csi"
	"github.com/plugd/plugd/internal/testenv"
	"github.com/plugd/plugd/pluginmanager"
	"github.com/plugd/plugd/plugintest"
)

// The CSI handler keeps the contract of a handler, with a CSI driver
// registered as node-driver-registrar registers one.
func TestConformance(t *testing.T) {
	plugintest.TestHandler(t, plugintest.HandlerCase{
		Type: csi.Type,
		New:  func(*testing.T) pluginmanager.Handler { return csi.New(csi.Options{}) },
		Start: func(t *testing.T, dir, name string) (string, func()) {
			d := serveDriver(t, testenv.ShortDir(t, "csi"), name)
			r := startRegistrar(t, dir, "", name, d.path, "1.0.0")
			return r.path, r.stop
		},
		Refused: pluginmanager.Plugin{Type: csi.Type, Name: "old.example.com", Endpoint: "/run/csi.sock", Versions: []string{"0.3.0"}, Socket: "/run/reg/old.sock"},
	})
}
