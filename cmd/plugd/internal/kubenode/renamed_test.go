package kubenode

import (
	"context"
	"encoding/pem"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/rest"

	"github.com/plugd/plugd/cmd/plugd/internal/kubenode/kubeletstate"
)

// kubeletMetrics is a kubelet's /metrics, trimmed, whose plugin manager
// holds /var/lib/kubelet/plugins_registry/csi.sock (plugd's /r/csi.sock),
// started at started; metric is the name of the plugin manager's gauge.
func kubeletMetrics(metric string, started time.Time) string {
	return fmt.Sprintf(`# HELP %[1]s [ALPHA] Number of plugins in Plugin Manager
# TYPE %[1]s gauge
%[1]s{socket_path="/var/lib/kubelet/plugins_registry/csi.sock",state="actual_state_of_world"} 1
%[1]s{socket_path="/var/lib/kubelet/plugins_registry/csi.sock",state="desired_state_of_world"} 1
# HELP process_start_time_seconds [ALPHA] Start time of the process since unix epoch in seconds.
# TYPE process_start_time_seconds gauge
process_start_time_seconds %d
`, metric, started.Unix())
}

// readKubelet makes the bench read an httptest kubelet that serves body
// as its /metrics, through the real client and watch, and waits for the
// read.
func (b *bench) readKubelet(body string) {
	b.t.Helper()
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, body) }))
	srv.Config.ErrorLog = log.New(io.Discard, "", 0)
	srv.StartTLS()
	b.t.Cleanup(srv.Close)
	ca := filepath.Join(b.t.TempDir(), "kubelet.crt")
	if err := os.WriteFile(ca, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}), 0o600); err != nil {
		b.t.Fatal(err)
	}
	cfg := KubeletConfig{Address: srv.Listener.Addr().String(), CAFile: ca, RegistryDir: "/var/lib/kubelet/plugins_registry"}
	c, err := kubeletstate.NewClient(cfg, &rest.Config{}, "example.com", "/r")
	if err != nil {
		b.t.Fatal(err)
	}
	b.n.cfg.Kubelet = cfg
	w := kubeletstate.NewWatch(c, cfg, b.clock, slog.New(slog.DiscardHandler), kubeletstate.Metrics{Reads: b.n.m.kubeletReads, Bytes: b.n.m.kubeletBytes}, func() {})
	b.n.kubeletEvidence = w.Evidence // the informers' handlers still ask the bench's watch for reads
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); w.Run(ctx) }()
	b.t.Cleanup(func() { cancel(); <-done })
	b.waitFor("a read of the kubelet", func() bool { return w.Evidence().Reads > 0 })
}

// Issue 36, item 4: the plugin manager's gauge is ALPHA, and a kubelet
// may rename it in any minor. One that serves /metrics without it while
// plugd sees sockets in its registry (which the kubelet's desired state
// holds within a pass) has not registered nothing: plugd cannot read what
// it registered, and says Inferred with the reason the doctor gives
// (KubeletMetricMissing), never a wrong NotRegistered.
func TestKubeletRenamedItsMetric(t *testing.T) {
	for _, tc := range []struct {
		name, metric string
		live         bool
	}{
		{"as in v1.37", "plugin_manager_total_plugins", true},
		{"renamed", "plugin_manager_plugins", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := newBench(t)
			started := b.clock.Now().Add(-time.Hour)
			b.setPlugins(csiSocket(started, true))
			b.readKubelet(kubeletMetrics(tc.metric, started))
			b.step(0)
			c := b.condition()
			v, _ := b.n.KubeletView(TypeCSI, "csi.example.com")
			st := b.n.Kubelet()
			if tc.live {
				if c == nil || c.Status != corev1.ConditionTrue || c.Reason != ReasonReady || !st.Live {
					t.Errorf("condition %+v, view %+v, kubelet live %v", c, v, st.Live)
				}
				return
			}
			if c == nil || c.Status != corev1.ConditionTrue || c.Reason != ReasonInferred {
				t.Errorf("condition %+v; want True/%s", c, ReasonInferred)
			}
			if v.Reason != ReasonInferred || !strings.Contains(v.Message, ReasonKubeletMetricMissing) {
				t.Errorf("view %+v; want %s, saying %s", v, ReasonInferred, ReasonKubeletMetricMissing)
			}
			if st.Live || st.Problem == nil || st.Problem.Reason != ReasonKubeletMetricMissing || !strings.Contains(st.Problem.Message, "plugin_manager_total_plugins") {
				t.Errorf("kubelet status: live %v, problem %+v; want %s, naming the metric", st.Live, st.Problem, ReasonKubeletMetricMissing)
			}
		})
	}
}

// A kubelet whose plugin manager holds nothing serves no such gauge
// either: with no socket in the registry (or one just made, not yet
// taken up), its absence says nothing is registered.
func TestKubeletWithoutPlugins(t *testing.T) {
	b := newBench(t)
	started := b.clock.Now().Add(-time.Hour)
	b.readKubelet(kubeletMetrics("unrelated_metric", started))
	b.setPlugins(csiSocket(b.clock.Now(), true)) // just made
	b.step(0)
	if st := b.n.Kubelet(); !st.Live {
		t.Errorf("kubelet status: live %v, problem %+v; want live", st.Live, st.Problem)
	}
	if v, _ := b.n.KubeletView(TypeCSI, "csi.example.com"); v.Reason != ReasonNotRegistered {
		t.Errorf("view %+v; want %s", v, ReasonNotRegistered)
	}

	// A kubelet just started, before its first pass over the registry.
	b = newBench(t)
	b.setPlugins(csiSocket(b.clock.Now().Add(-time.Hour), true))
	b.readKubelet(kubeletMetrics("unrelated_metric", b.clock.Now().Add(-time.Second)))
	b.step(0)
	if st := b.n.Kubelet(); !st.Live {
		t.Errorf("a kubelet just started: live %v, problem %+v; want live", st.Live, st.Problem)
	}
	if c := b.condition(); c == nil || c.Status != corev1.ConditionFalse || c.Reason != ReasonKubeletNotRegistered {
		t.Errorf("a kubelet just started: condition %+v; want False/%s", c, ReasonKubeletNotRegistered)
	}
}
