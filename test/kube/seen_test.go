//go:build linux

package kube

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	corev1 "k8s.io/api/core/v1"

	"github.com/plugd/plugd/api"
	"github.com/plugd/plugd/internal/testenv"
	"github.com/plugd/plugd/plugin"
	"github.com/plugd/plugd/test/kube/kubelet"
)

// kubeletPluginState says whether the kubelet's plugin manager has socket
// in its desired state (seen) and in its actual state (registered), from
// its own /metrics (kubelet_plugin_manager_total_plugins).
func kubeletPluginState(t *testing.T, k *kubelet.Kubelet, socket string) (seen, registered bool, err error) {
	t.Helper()
	body, code, err := k.Get(context.Background(), "/metrics", cp.AdminToken)
	if err != nil || code != 200 {
		return false, false, fmt.Errorf("GET /metrics: %d, %v", code, err)
	}
	in := func(state string) bool {
		return strings.Contains(body, fmt.Sprintf("plugin_manager_total_plugins{socket_path=%q,state=%q} 1", socket, state))
	}
	return in("desired_state_of_world"), in("actual_state_of_world"), nil
}

// Issue 24: a socket the real kubelet has seen and not registered (its
// desired state without its actual state) is named, with what plugd knows
// of why, in the view, the condition and plugctl doctor (which reads the
// versions as the kubelet does: versions-refused). The plugin is a
// CSI registration socket that announces the version "1": plugd's CSI
// handler reads it as 1.0.0 and the driver answers, but the kubelet's
// version parser wants two numbers at least, so it refuses the driver at
// validation, tells the plugin registered=false, and retries with backoff;
// the plugin (plugd's SDK, not node-driver-registrar) does not exit. Then
// a registration announcing "1.0.0" beside it: the kubelet registers
// that, and the condition turns True, once.
func TestKubeletSeenNotRegistered(t *testing.T) {
	const node = "k-seen"
	k := startKubelet(t, node)
	applyManifest(t, "deploy/kubernetes/daemonset.yaml")
	dir := testenv.ShortDir(t, "ks")
	kubeconfig := filepath.Join(dir, "kubeconfig")
	if err := cp.WriteKubeconfig(kubeconfig, plugdToken(t)); err != nil {
		t.Fatal(err)
	}
	conds := watchConditions(t, node, nil)

	// The driver, and its registration socket with a version the kubelet
	// cannot parse.
	endpoint := filepath.Join(dir, "csi.sock")
	d := &csiDriver{name: csiName, nodeID: node}
	serveGRPC(t, endpoint, func(s *grpc.Server) {
		csi.RegisterIdentityServer(s, d)
		csi.RegisterNodeServer(s, d)
	})
	bad := testenv.StartPlugin(t, plugin.Config{Dir: k.RegistryDir, Socket: csiName + "-reg.sock", Type: "CSIPlugin", Name: csiName,
		Versions: []string{"1"}, Endpoint: endpoint})
	sock := bad.Path()
	// The kubelet's side, the premise: it has seen the socket, refused it
	// and told the plugin so, and holds it in its desired state only.
	eventually(t, "the kubelet refusing the registration", func() (bool, string) {
		st, ok := bad.Status()
		return ok && !st.Registered, fmt.Sprintf("%+v %v", st, ok)
	})
	st, _ := bad.Status()
	if !strings.Contains(st.Error, "validation failed") {
		t.Errorf("the kubelet's registered=false says %q; want its validation's refusal", st.Error)
	}
	t.Logf("the kubelet told the plugin: %s", st.Error)
	eventually(t, "the kubelet's desired state with the socket, its actual state without", func() (bool, string) {
		seen, registered, err := kubeletPluginState(t, k, sock)
		return seen && !registered, fmt.Sprintf("seen %v, registered %v, %v", seen, registered, err)
	})

	pd := startPlugd(t, dir, besideKubeletConfig(k.RegistryDir, kubeconfig, node, k.Addr, k.CertFile, dir))

	// The view: the socket answers plugd, and the kubelet has seen it and
	// not registered it.
	v := pd.waitKubelet(t, csiName, api.KubeletNotRegistered, "SeenNotRegistered")
	if !strings.Contains(v.Message, "the kubelet has seen "+sock+" and not registered it") || !strings.Contains(v.Message, "refused it or cannot reach it") {
		t.Errorf("view: %+v", v)
	}
	if p := pd.plugin(t, csiName); p.State != api.StateAnswering {
		t.Errorf("plugd's own look at the plugin: %s (%s); want %s", p.State, p.LastError, api.StateAnswering)
	}
	// The condition: False, and why.
	c := waitCondition(t, node, csiCond, corev1.ConditionFalse, "KubeletNotRegistered")
	if !strings.Contains(c.Message, "its socket answers, but the kubelet has not registered it") || !strings.Contains(c.Message, "has seen "+sock) {
		t.Errorf("the condition's message: %q", c.Message)
	}
	// The doctor: why (the versions, as the kubelet's parser reads them),
	// and the finding that the kubelet has not registered the socket, with
	// that why as its first likely cause, then the kubelet's refusal and
	// where to read its reason.
	var refused, notRegistered api.Finding
	eventually(t, "plugctl doctor's versions-refused and kubelet-not-registered findings", func() (bool, string) {
		out, _ := plugctl(t, "--socket", pd.socket, "doctor", "-o", "json")
		var l api.FindingList
		decode(t, out, &l)
		refused, notRegistered = api.Finding{}, api.Finding{}
		for _, f := range l.Findings {
			switch {
			case f.Check == "versions-refused" && f.Socket == sock:
				refused = f
			case f.Check == "kubelet-not-registered" && f.Name == csiName:
				notRegistered = f
			}
		}
		return refused.Check != "" && notRegistered.Check != "", out
	})
	if refused.Severity != api.SeverityError || !strings.Contains(refused.Summary, "the kubelet refuses this CSI driver") ||
		!slices.Contains(refused.Evidence, "versions: [1]") || !strings.Contains(refused.Remedy, "1.0.0") {
		t.Errorf("versions-refused: %+v", refused)
	}
	var causes []string
	for _, e := range notRegistered.Evidence {
		if c, ok := strings.CutPrefix(e, "likely cause: "); ok {
			causes = append(causes, c)
		}
	}
	if notRegistered.Severity != api.SeverityWarning || notRegistered.Socket != sock || !strings.Contains(notRegistered.Remedy, "likely causes") ||
		!slices.Contains(notRegistered.Evidence, "kubelet view: "+v.Message) || len(causes) < 2 ||
		causes[0] != refused.Summary ||
		!strings.HasPrefix(causes[1], "the kubelet has seen the socket and refused it, or cannot dial the plugin's endpoint") ||
		!strings.Contains(causes[1], "journalctl -u kubelet | grep "+csiName) {
		t.Errorf("kubelet-not-registered: %+v", notRegistered)
	}
	out, _ := plugctl(t, "--socket", pd.socket, "doctor")
	for _, want := range []string{"versions-refused", "kubelet-not-registered", "journalctl -u kubelet | grep " + csiName} {
		if !strings.Contains(out, want) {
			t.Errorf("plugctl doctor does not say %q:\n%s", want, out)
		}
	}
	// The refused plugin serves on: it was told false, and did not exit.
	if _, err := os.Stat(sock); err != nil || bad.Notifications() == 0 {
		t.Errorf("the refused plugin's socket: %v; notifications %d", err, bad.Notifications())
	}

	// A registration the kubelet takes, beside it: True, and nothing
	// between.
	good := testenv.StartPlugin(t, plugin.Config{Dir: k.RegistryDir, Socket: csiName + "-v1-reg.sock", Type: "CSIPlugin", Name: csiName,
		Versions: []string{"1.0.0"}, Endpoint: endpoint})
	waitCondition(t, node, csiCond, corev1.ConditionTrue, "PluginReady")
	if _, registered, _ := kubeletPluginState(t, k, good.Path()); !registered {
		t.Error("True while the kubelet does not hold the new socket")
	}
	// The refused one goes; its view (one per plugin) is the one it held.
	bad.Close()
	v = pd.waitKubelet(t, csiName, api.KubeletRegistered, "")
	if !strings.Contains(v.Message, "the kubelet's plugin manager holds "+good.Path()) {
		t.Errorf("view once registered: %+v", v)
	}
	// The watch of the Node may trail the GET that saw True.
	var seq []string
	eventually(t, "the watch seeing the condition True", func() (bool, string) {
		seq = seq[:0]
		for _, tr := range conds.since(csiCond, pd.started) {
			seq = append(seq, tr.String())
		}
		return len(seq) > 0 && seq[len(seq)-1] == "True/PluginReady", fmt.Sprint(seq)
	})
	if !slices.Equal(seq, []string{"False/KubeletNotRegistered", "True/PluginReady"}) {
		t.Errorf("the condition went %v", seq)
	}
}
