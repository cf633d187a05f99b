package doctor

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	drahealthv1 "k8s.io/kubelet/pkg/apis/dra-health/v1"
	drahealthv1alpha1 "k8s.io/kubelet/pkg/apis/dra-health/v1alpha1"

	"github.com/plugd/plugd/api"
	"github.com/plugd/plugd/internal/testenv"
)

// quietHealthAlpha is quietHealth in the older version of the service.
type quietHealthAlpha struct {
	drahealthv1alpha1.UnimplementedDRAResourceHealthServer
}

func (quietHealthAlpha) NodeWatchResources(_ *drahealthv1alpha1.NodeWatchResourcesRequest, s grpc.ServerStreamingServer[drahealthv1alpha1.NodeWatchResourcesResponse]) error {
	<-s.Context().Done()
	return nil
}

// reportingHealth sends one report at once, as a driver with devices does.
type reportingHealth struct {
	drahealthv1.UnimplementedDRAResourceHealthServer
}

func (reportingHealth) NodeWatchResources(_ *drahealthv1.NodeWatchResourcesRequest, s grpc.ServerStreamingServer[drahealthv1.NodeWatchResourcesResponse]) error {
	if err := s.Send(&drahealthv1.NodeWatchResourcesResponse{}); err != nil {
		return err
	}
	<-s.Context().Done()
	return nil
}

// The kubelet's rules for the services it uses with a DRA driver, by its
// version (pkg/kubelet/cm/dra/plugin of v1.35, v1.36 and v1.37).
func TestServicesOf(t *testing.T) {
	for _, tc := range []struct {
		kubelet  string
		versions []string
		want     kubeletServices
	}{
		{"v1.37.2", []string{"v1.DRAPlugin", "v1beta1.DRAPlugin", "v1.DRAResourceHealth", "v1alpha1.DRAResourceHealth"}, kubeletServices{Service: "v1.DRAPlugin", Health: "v1.DRAResourceHealth"}},
		// The DRA service in the driver's order, the health service in the kubelet's.
		{"v1.37.2", []string{"v2.DRAPlugin", "v1beta1.DRAPlugin", "v1.DRAPlugin", "v1alpha1.DRAResourceHealth", "v1.DRAResourceHealth"}, kubeletServices{Service: "v1beta1.DRAPlugin", Health: "v1.DRAResourceHealth"}},
		{"v1.37.2", []string{"v1.DRAPlugin"}, kubeletServices{Service: "v1.DRAPlugin"}},
		{"", []string{"v1.DRAPlugin", "v1alpha1.DRAResourceHealth"}, kubeletServices{Service: "v1.DRAPlugin", Health: "v1alpha1.DRAResourceHealth"}},
		// v1.36 asks every driver for v1alpha1, advertised or not.
		{"v1.36.3+k3s1", []string{"v1.DRAPlugin"}, kubeletServices{Service: "v1.DRAPlugin", Health: "v1alpha1.DRAResourceHealth", EveryDriver: true}},
		{"v1.36.0", []string{"v1.DRAPlugin", "v1.DRAResourceHealth"}, kubeletServices{Service: "v1.DRAPlugin", Health: "v1alpha1.DRAResourceHealth", EveryDriver: true}},
		// Before, the health stream is alpha, off by default.
		{"v1.35.4", []string{"v1beta1.DRAPlugin", "v1alpha1.DRAResourceHealth"}, kubeletServices{Service: "v1beta1.DRAPlugin"}},
		{"v1.37.2", []string{"v2.DRAPlugin"}, kubeletServices{}},
	} {
		if got := servicesOf(tc.versions, kubeletMinor(tc.kubelet)); got != tc.want {
			t.Errorf("kubelet %q, versions %v: %+v, want %+v", tc.kubelet, tc.versions, got, tc.want)
		}
	}
}

// Real DRA drivers' endpoints (gRPC on unix sockets) that serve the health
// service in one version, both, or none, advertised or not; the doctor
// asks each, and judges what the kubelet of each version asks of them.
func TestDRAHealthDisagreements(t *testing.T) {
	dir := testenv.ShortDir(t, "dra")
	serve := func(name string, register ...func(*grpc.Server)) string {
		s := grpc.NewServer()
		for _, r := range register {
			r(s)
		}
		path := filepath.Join(dir, name+".sock")
		serveGRPC(t, path, s)
		return path
	}
	v1 := func(s *grpc.Server) { drahealthv1.RegisterDRAResourceHealthServer(s, quietHealth{}) }
	v1reports := func(s *grpc.Server) { drahealthv1.RegisterDRAResourceHealthServer(s, reportingHealth{}) }
	v1alpha1 := func(s *grpc.Server) { drahealthv1alpha1.RegisterDRAResourceHealthServer(s, quietHealthAlpha{}) }
	drivers := []struct {
		name     string
		versions []string
		endpoint string
	}{
		{"none", []string{"v1.DRAPlugin"}, serve("none")},
		{"v1", []string{"v1.DRAPlugin", "v1.DRAResourceHealth"}, serve("v1", v1)},
		{"both", []string{"v1.DRAPlugin", "v1.DRAResourceHealth", "v1alpha1.DRAResourceHealth"}, serve("both", v1, v1alpha1)},
		{"unadvertised", []string{"v1.DRAPlugin"}, serve("unadvertised", v1reports)},
		{"claims", []string{"v1.DRAPlugin", "v1.DRAResourceHealth"}, serve("claims")},
		{"betafirst", []string{"v1beta1.DRAPlugin", "v1.DRAPlugin"}, serve("betafirst")},
	}
	in := Input{RegistryDir: dir, KubeletRoots: []string{}, Now: time.Now()}
	for _, d := range drivers {
		in.Plugins = append(in.Plugins, Target{Socket: filepath.Join(dir, d.name+".reg"), Type: api.DRAPlugin, Name: d.name + ".example.com",
			Versions: d.versions, Endpoint: d.endpoint, State: "Answering", Answering: true})
	}
	// What each kubelet's doctor says of each driver: "check/severity",
	// "" for nothing; the DRA service's finding apart.
	for _, tc := range []struct {
		kubelet string
		want    map[string]string
	}{
		{"", map[string]string{"none": "", "v1": "", "both": "", "unadvertised": "health-service-unadvertised/warning",
			"claims": "health-service-missing/warning", "betafirst": ""}},
		{"v1.37.2", map[string]string{"none": "", "v1": "", "both": "", "unadvertised": "health-service-unadvertised/warning",
			"claims": "health-service-missing/info", "betafirst": ""}},
		{"v1.36.3", map[string]string{"none": "health-service-expected/warning", "v1": "health-service-expected/warning", "both": "",
			"unadvertised": "health-service-expected/warning", "claims": "health-service-expected/warning", "betafirst": "health-service-expected/warning"}},
		{"v1.35.4", map[string]string{"none": "", "v1": "", "both": "", "unadvertised": "", "claims": "", "betafirst": ""}},
		// A development build of the kubelet: judged as the newest, its
		// version unknown.
		{"v0.0.0-master+$Format:%H$", map[string]string{"none": "", "v1": "", "both": "", "unadvertised": "health-service-unadvertised/warning",
			"claims": "health-service-missing/warning", "betafirst": ""}},
	} {
		in.Kubelet = &KubeletAccess{Address: "127.0.0.1:10250", Live: true, Version: tc.kubelet}
		fs := Check(context.Background(), in)
		for _, d := range drivers {
			var got []string
			for _, f := range findings(fs, "", filepath.Join(dir, d.name+".reg")) {
				if f.Check == "dra-service-version" {
					continue
				}
				got = append(got, f.Check+"/"+f.Severity)
				all := f.Summary + strings.Join(f.Evidence, "\n") + f.Remedy
				named := "the kubelet (" + tc.kubelet + ") uses"
				if strings.HasPrefix(tc.kubelet, "v0.") {
					named = fmt.Sprintf("the kubelet (of no release version: its Node reports %q) uses", tc.kubelet)
				}
				if tc.kubelet != "" && !strings.Contains(all, named) || f.Remedy == "" {
					t.Errorf("kubelet %q, %s: %s does not say which services the kubelet uses: %+v", tc.kubelet, d.name, f.Check, f)
				}
			}
			if want := tc.want[d.name]; strings.Join(got, ",") != want {
				t.Errorf("kubelet %q, driver %s: %v, want %q", tc.kubelet, d.name, got, want)
			}
		}
		beta := findings(fs, "dra-service-version", "")
		if len(beta) != 1 || beta[0].Name != "betafirst.example.com" || !strings.Contains(beta[0].Summary, "calls this driver's v1beta1.DRAPlugin") {
			t.Errorf("kubelet %q: dra-service-version %+v, want one of betafirst", tc.kubelet, beta)
		}
		if tc.kubelet == "v1.36.3" {
			f := findings(fs, "health-service-expected", filepath.Join(dir, "none.reg"))[0]
			if ev := strings.Join(f.Evidence, "\n"); !strings.Contains(ev, "does not advertise v1alpha1.DRAResourceHealth") || !strings.Contains(f.Summary, "#141855") {
				t.Errorf("v1.36, a driver without the service: %+v", f)
			}
		}
	}
	in.Kubelet.Version = "v1.37.2"
	f := findings(Check(context.Background(), in), "health-service-unadvertised", "")
	if len(f) != 1 || !strings.Contains(strings.Join(f[0].Evidence, "\n"), "v1.DRAResourceHealth) on "+filepath.Join(dir, "unadvertised.sock")+": served (it sent a report)") ||
		!strings.Contains(f[0].Remedy, "list v1.DRAResourceHealth") {
		t.Errorf("served, not advertised: %+v", f)
	}
}

// ResourceSlices of this node whose driver the running kubelet does not
// hold: none while it holds the driver or the kubelet's wipe may still
// come; the restart race named; a driver with no socket at all; many
// drivers told of up to a bound, the rest counted.
func TestDRASlices(t *testing.T) {
	dir := testenv.ShortDir(t, "drs")
	now := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	gone := filepath.Join(dir, "gone.sock") // nothing there: not answering
	target := func(name string, v *api.KubeletView) Target {
		return Target{Socket: gone, Type: api.DRAPlugin, Name: name, Versions: []string{"v1.DRAPlugin"}, State: "NotAnswering", Remembered: true, Kubelet: v}
	}
	notHeld := func(reason string, since time.Duration) *api.KubeletView {
		return &api.KubeletView{State: api.KubeletNotRegistered, Reason: reason, Message: "the running kubelet's plugin manager holds no socket of it", Since: now.Add(-since)}
	}
	live := &KubeletAccess{Address: "127.0.0.1:10250", Live: true, Version: "v1.37.2"}
	for _, tc := range []struct {
		name    string
		plugins []Target
		kubelet *KubeletAccess
		check   string // "" for none
		remedy  string
	}{
		{"held", []Target{target("d.example.com", &api.KubeletView{State: api.KubeletRegistered, Message: "holds"})}, live, "", ""},
		{"not held, within the kubelet's wipe", []Target{target("d.example.com", notHeld("NotRegistered", 20*time.Second))}, live, "", ""},
		{"not held, the kubelet not read", []Target{target("d.example.com", notHeld("NotRegistered", time.Hour))}, &KubeletAccess{Reason: "KubeletForbidden"}, "", ""},
		{"not held", []Target{target("d.example.com", notHeld("NotRegistered", time.Minute))}, live, "dra-slices-not-held", "restart the driver's pod"},
		{"the restart race", []Target{target("d.example.com", notHeld("KubeletRestarted", time.Minute))}, live, "dra-slices-not-held", "(the restart race)"},
		{"refused", []Target{target("d.example.com", notHeld("SeenNotRegistered", time.Minute))}, live, "dra-slices-not-held", "refuses the driver's registration"},
		{"one socket held, an old one not", []Target{target("d.example.com", notHeld("NotRegistered", time.Hour)),
			{Socket: filepath.Join(dir, "new.sock"), Type: api.DRAPlugin, Name: "d.example.com", Kubelet: &api.KubeletView{State: api.KubeletRegistered}}}, live, "", ""},
		{"no socket", nil, live, "dra-slices-unregistered", "kubectl delete resourceslices --field-selector spec.nodeName=node-a,spec.driver=d.example.com"},
		{"no socket, the kubelet not read", nil, &KubeletAccess{Reason: "KubeletNotRunning"}, "dra-slices-unregistered", "kubectl delete resourceslices"},
	} {
		in := Input{RegistryDir: dir, KubeletRoots: []string{}, Now: now, NodeName: "node-a", Plugins: tc.plugins, Kubelet: tc.kubelet,
			DRASlices: map[string]int{"d.example.com": 3}}
		var got []api.Finding
		for _, f := range Check(context.Background(), in) {
			if strings.HasPrefix(f.Check, "dra-slices-") {
				got = append(got, f)
			}
		}
		switch {
		case tc.check == "" && len(got) != 0:
			t.Errorf("%s: %+v, want none", tc.name, got)
		case tc.check == "":
		case len(got) != 1 || got[0].Check != tc.check || got[0].Severity != api.SeverityWarning || got[0].Name != "d.example.com" ||
			!strings.Contains(got[0].Remedy, tc.remedy) || !strings.Contains(got[0].Summary, "3 ResourceSlices of DRA driver d.example.com"):
			t.Errorf("%s: %+v, want one %s whose remedy says %q", tc.name, got, tc.check, tc.remedy)
		}
	}

	many := map[string]int{}
	for i := range maxSliceFindings + 4 {
		many[fmt.Sprintf("d%02d.example.com", i)] = 1
	}
	fs := findings(Check(context.Background(), Input{RegistryDir: dir, KubeletRoots: []string{}, Now: now, NodeName: "node-a", DRASlices: many}), "dra-slices-unregistered", "")
	if len(fs) != maxSliceFindings+1 || !slices.ContainsFunc(fs, func(f api.Finding) bool { return strings.Contains(f.Summary, "of 4 more DRA drivers") }) {
		t.Errorf("%d drivers' slices: %d findings, want %d and a count of 4 more", len(many), len(fs), maxSliceFindings+1)
	}
}
