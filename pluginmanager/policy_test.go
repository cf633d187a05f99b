package pluginmanager_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"

	"github.com/plugd/plugd/internal/testenv"
	"github.com/plugd/plugd/plugin"
	"github.com/plugd/plugd/pluginmanager"
	"github.com/plugd/plugd/plugintest"
)

func TestEndpointRules(t *testing.T) {
	roots := testenv.ShortDir(t, "root")
	outside := testenv.ShortDir(t, "out")
	// A symlink inside a root that points out of it does not get the endpoint in.
	if err := os.Symlink(outside, filepath.Join(roots, "escape")); err != nil {
		t.Fatal(err)
	}
	h := start(t, pluginmanager.Options{EndpointRoots: []string{roots}}, map[string]pluginmanager.Handler{"CSIPlugin": plugintest.NewRecorder()})
	for _, tc := range []struct {
		endpoint string
		state    pluginmanager.State
		reason   pluginmanager.Reason
		says     string
	}{
		{"", pluginmanager.StateRegistered, "", ""}, // the registration socket itself
		{filepath.Join(roots, "csi.sock"), pluginmanager.StateRegistered, "", ""},
		{"unix://" + filepath.Join(roots, "csi.sock"), pluginmanager.StateRegistered, "", ""},
		{"csi.sock", pluginmanager.StateRejected, pluginmanager.ReasonInvalidInfo, "is not an absolute path"},
		{filepath.Join(outside, "csi.sock"), pluginmanager.StateRejected, pluginmanager.ReasonPolicy, "outside the directories Options.EndpointRoots allows"},
		{filepath.Join(roots, "escape", "csi.sock"), pluginmanager.StateRejected, pluginmanager.ReasonPolicy, "Options.EndpointRoots"},
		{filepath.Join(roots, "..", filepath.Base(outside), "csi.sock"), pluginmanager.StateRejected, pluginmanager.ReasonPolicy, "Options.EndpointRoots"},
	} {
		name := fmt.Sprintf("p%d", len(h.m.Plugins()))
		p := testenv.StartPlugin(t, plugin.Config{Dir: h.dir, Type: "CSIPlugin", Name: name, Endpoint: tc.endpoint})
		s := h.WaitSocket(p.Path(), tc.state)
		if s.Reason != tc.reason || !strings.Contains(s.LastError, tc.says) {
			t.Errorf("endpoint %q: %s %s %q, want %s %s %q", tc.endpoint, s.State, s.Reason, s.LastError, tc.state, tc.reason, tc.says)
		}
		if tc.state == pluginmanager.StateRejected {
			if st, _ := p.Status(); st.Registered || !strings.Contains(st.Error, tc.says) {
				t.Errorf("endpoint %q: the plugin was told %+v", tc.endpoint, st)
			}
		}
	}
}

func TestAllowedPeers(t *testing.T) {
	me, mygid := uint32(os.Geteuid()), uint32(os.Getegid())
	h := start(t, pluginmanager.Options{
		AllowedPeers: &pluginmanager.Peers{UIDs: []uint32{me + 12345}}, // not this test's own processes, by default
	}, map[string]pluginmanager.Handler{"DevicePlugin": plugintest.NewRecorder()})
	// but for CSI drivers, they may
	h.m.AddHandler("CSIPlugin", plugintest.NewRecorder(), pluginmanager.HandlerOptions{AllowedPeers: &pluginmanager.Peers{UIDs: []uint32{me}}})
	ok := testenv.StartPlugin(t, plugin.Config{Dir: h.dir, Type: "CSIPlugin", Name: "mine"})
	h.WaitSocket(ok.Path(), pluginmanager.StateRegistered)
	refused := testenv.StartPlugin(t, plugin.Config{Dir: h.dir, Type: "DevicePlugin", Name: "theirs"})
	s := h.WaitSocket(refused.Path(), pluginmanager.StateRejected)
	want := fmt.Sprintf("runs as uid %d, gid %d, which Options.AllowedPeers does not allow for DevicePlugin plugins (uids [%d], gids [])", me, mygid, me+12345)
	if s.Reason != pluginmanager.ReasonPolicy || !strings.Contains(s.LastError, want) {
		t.Errorf("refusal = %s %q, want it to say %q", s.Reason, s.LastError, want)
	}
}

func TestGroupWritableRegistryDirIsRefusedUnlessAllowed(t *testing.T) {
	for _, allow := range []bool{false, true} {
		dir := testenv.ShortDir(t, "gw")
		if err := os.Chmod(dir, 0o770); err != nil {
			t.Fatal(err)
		}
		m, err := pluginmanager.New(pluginmanager.Options{Dir: dir, AllowWritableDir: allow})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		if allow {
			cancel() // Run starts and stops at once
		}
		err = m.Run(ctx)
		cancel()
		switch {
		case allow && err != nil:
			t.Errorf("AllowWritableDir: Run = %v", err)
		case !allow && (err == nil || !strings.Contains(err.Error(), "writable by users other than its owner") || !strings.Contains(err.Error(), "AllowWritableDir")):
			t.Errorf("group-writable directory: Run = %v", err)
		}
	}
}

func TestMaxSockets(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	h := start(t, pluginmanager.Options{MaxSockets: 2, Registerer: reg, Workers: 1}, map[string]pluginmanager.Handler{"CSIPlugin": plugintest.NewRecorder()})
	var paths []string
	for i := range 3 {
		path := filepath.Join(h.dir, fmt.Sprintf("s%d.sock", i))
		serveRaw(t, path, func(s *grpc.Server) {
			registerapi.RegisterRegistrationServer(s, &fixedInfo{info: &registerapi.PluginInfo{Type: "CSIPlugin", Name: fmt.Sprint("s", i)}, status: make(chan *registerapi.RegistrationStatus, 10)})
		})
		paths = append(paths, path)
		if i < 2 {
			h.WaitSocket(path, pluginmanager.StateRegistered)
		}
	}
	// One worker takes paths in order: the third socket's turn came before
	// the first one's removal, which frees a place and brings it in.
	os.Remove(paths[0])
	h.WaitGone(paths[0])
	if n := testutil.ToFloat64(overLimit(t, reg)); n < 1 {
		t.Errorf("over-limit count = %v, want the third socket counted", n)
	}
	h.WaitSocket(paths[2], pluginmanager.StateRegistered)
}

// overLimit finds the over-limit counter among reg's metrics.
func overLimit(t *testing.T, reg *prometheus.Registry) prometheus.Collector {
	t.Helper()
	return counterFrom(t, reg, "plugd_sockets_over_limit_total")
}
