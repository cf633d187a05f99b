//go:build unix

package daemon

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"

	api "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/plugd/plugd/internal/testenv"
	"github.com/plugd/plugd/plugin"
	"github.com/plugd/plugd/pluginmanager"
	"github.com/plugd/plugd/plugintest"
)

// Issue 13, item 11: one rule for endpoints. Each endpoint a plugin may send
// goes through the manager (a real one, with a real plugin socket) and
// through the Validate of every built-in handler, as plugd configures them:
// they all accept the same ones, and the handlers get the one clean path.
// Before, the manager accepted unix:///… and handed it on as sent, which
// the accept, dra and deviceplugin handlers then refused, and it accepted an
// endpoint too long for any unix socket.
func TestOneEndpointRule(t *testing.T) {
	long := "/run/" + strings.Repeat("e", 110) + ".sock"
	cases := []struct {
		name, endpoint string
		want           string // the clean path; "" refused; "socket": the registration socket
	}{
		{"absolute", "/run/plugin.sock", "/run/plugin.sock"},
		{"unix URL", "unix:///run/plugin.sock", "/run/plugin.sock"},
		{"unix URL relative", "unix://run/plugin.sock", ""},
		{"unix scheme one slash", "unix:/run/plugin.sock", ""},
		{"relative", "run/plugin.sock", ""},
		{"empty", "", "socket"},
		{"dot dot", "/run/x/../plugin.sock", "/run/plugin.sock"},
		{"unix URL dot dot", "unix:///run/./x//../plugin.sock", "/run/plugin.sock"},
		{"NUL", "/run/plu\x00gin.sock", ""},
		{"too long", long, ""},
		{"long but clean short", "/run/" + strings.Repeat("x/../", 30) + "plugin.sock", "/run/plugin.sock"},
	}

	// The manager, with a recorder for a custom type.
	rec := plugintest.NewRecorder()
	m := plugintest.NewManagerWith(t, pluginmanager.Options{Dir: testenv.ShortDir(t, "er")}, map[string]pluginmanager.Handler{"example.com/Thing": rec})
	for i, c := range cases {
		s, err := plugin.Start(plugin.Config{Dir: m.Dir, Socket: fmt.Sprintf("p%d.sock", i), Type: "example.com/Thing", Name: fmt.Sprintf("p%d", i), Endpoint: c.endpoint, Versions: []string{"v1"}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		want := c.want
		if want == "socket" {
			want = s.Path()
		}
		if want == "" {
			st := m.WaitSocket(s.Path(), pluginmanager.StateRejected)
			if st.Reason != pluginmanager.ReasonInvalidInfo {
				t.Errorf("%s: the manager rejected %q with reason %s (%s), want %s", c.name, c.endpoint, st.Reason, st.LastError, pluginmanager.ReasonInvalidInfo)
			}
			if n := rec.Count("validate", fmt.Sprintf("p%d", i)); n != 0 {
				t.Errorf("%s: the handler saw %q, which the manager refuses", c.name, c.endpoint)
			}
			continue
		}
		st := m.WaitSocket(s.Path(), pluginmanager.StateRegistered)
		if st.Endpoint != want {
			t.Errorf("%s: the status says endpoint %q, want %q", c.name, st.Endpoint, want)
		}
		if p, ok := rec.Holds(s.Path()); !ok || p.Endpoint != want {
			t.Errorf("%s: the handler was given endpoint %q, want %q", c.name, p.Endpoint, want)
		}
	}

	// Every built-in handler, given what the plugin sent (an empty endpoint
	// as the manager gives it: the socket).
	plugins := map[string]pluginmanager.Plugin{
		"accept":       {Type: "example.com/Thing", Name: "thing", Versions: []string{"v1"}},
		"csi":          {Type: "CSIPlugin", Name: "csi.example.com", Versions: []string{"1.0.0"}},
		"dra":          {Type: "DRAPlugin", Name: "dra.example.com", Versions: []string{"v1.DRAPlugin"}},
		"deviceplugin": {Type: "DevicePlugin", Name: "example.com/gpu", Versions: []string{api.Version}},
		"hook":         {Type: "example.com/Thing", Name: "thing", Versions: []string{"v1"}},
	}
	for _, name := range []string{"accept", "csi", "dra", "deviceplugin", "hook"} {
		hc := HandlerConfig{Type: plugins[name].Type, Handler: name}
		if name == "hook" {
			hc.Hook = &HookConfig{Command: []string{"true"}, Events: []string{"validate"}}
		}
		h, err := newHandler(hc, nil, slog.New(slog.DiscardHandler), nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(h.close)
		for _, c := range cases {
			p := plugins[name]
			p.Socket = "/run/plugins/reg.sock"
			p.Endpoint = c.endpoint
			if c.want == "socket" {
				p.Endpoint = p.Socket
			}
			err := h.Validate(context.Background(), p)
			if accepted := err == nil; accepted != (c.want != "") {
				t.Errorf("%s handler: Validate(endpoint %q) = %v; the manager accepts it: %v", name, c.endpoint, err, c.want != "")
			}
		}
	}
	// The rule itself, which they all apply.
	for _, c := range cases {
		got, err := pluginmanager.EndpointPath(c.endpoint)
		switch want := c.want; {
		case want == "socket":
			if err == nil {
				t.Errorf("EndpointPath(%q) = %q, want an error: the manager, not the rule, takes an empty endpoint as the socket", c.endpoint, got)
			}
		case want == "" && err == nil:
			t.Errorf("EndpointPath(%q) = %q, want an error", c.endpoint, got)
		case want != "" && (err != nil || got != want):
			t.Errorf("EndpointPath(%q) = %q, %v, want %q", c.endpoint, got, err, want)
		case err != nil && !strings.Contains(err.Error(), "endpoint"):
			t.Errorf("EndpointPath(%q) = %v, want the error to name the endpoint", c.endpoint, err)
		}
	}
}
