package kube

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/plugd/plugd/internal/testenv"
)

// The startup taints of each plugin (issue 32), beside the real kubelet:
// each removed once its own plugin's condition is True and not before; a
// re-add by another writer within the startup window removed again,
// naming it, and left after it; retaint puts the taint back on False and
// removes it again on True; a restart of plugd changes no taint.
const (
	csiTaint = "example.com/csi-not-ready"
	gpuTaint = "example.com/gpu-not-ready"
)

// taintLog records, from a watch of the Node, when each taint key was
// seen to come and go and when each plugd condition turned True.
type taintLog struct {
	mu     sync.Mutex
	gone   map[string][]time.Time // a taint seen absent after present
	back   map[string][]time.Time // a taint seen present after absent
	trueAt map[string][]time.Time
}

func watchTaints(t *testing.T, node string) *taintLog {
	tl := &taintLog{gone: map[string][]time.Time{}, back: map[string][]time.Time{}, trueAt: map[string][]time.Time{}}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	t.Cleanup(func() { cancel(); <-done })
	go func() {
		defer close(done)
		had, wasTrue := map[string]bool{}, map[string]bool{}
		for ctx.Err() == nil {
			w, err := admin.CoreV1().Nodes().Watch(ctx, metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("metadata.name", node).String()})
			if err != nil {
				select {
				case <-ctx.Done():
				case <-time.After(100 * time.Millisecond):
				}
				continue
			}
			for ev := range w.ResultChan() {
				n, ok := ev.Object.(*corev1.Node)
				if !ok || ev.Type == watch.Deleted {
					continue
				}
				now := time.Now()
				tl.mu.Lock()
				for _, k := range []string{csiTaint, gpuTaint} {
					has := slices.ContainsFunc(n.Spec.Taints, func(tt corev1.Taint) bool { return tt.Key == k })
					switch {
					case had[k] && !has:
						tl.gone[k] = append(tl.gone[k], now)
					case !had[k] && has && len(tl.gone[k]) > 0:
						tl.back[k] = append(tl.back[k], now)
					}
					had[k] = has
				}
				for _, c := range n.Status.Conditions {
					is := c.Status == corev1.ConditionTrue
					if is && !wasTrue[string(c.Type)] {
						tl.trueAt[string(c.Type)] = append(tl.trueAt[string(c.Type)], now)
					}
					wasTrue[string(c.Type)] = is
				}
				tl.mu.Unlock()
			}
		}
	}()
	return tl
}

func (tl *taintLog) count(m map[string][]time.Time, k string) int {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	return len(m[k])
}

func (tl *taintLog) last(m map[string][]time.Time, k string) time.Time {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	return m[k][len(m[k])-1]
}

func hasTaint(t *testing.T, node, key string) bool {
	return slices.ContainsFunc(getNode(t, node).Spec.Taints, func(tt corev1.Taint) bool { return tt.Key == key })
}

// readdTaint puts key back on node as another node component would, with
// a field manager of its own.
func readdTaint(t *testing.T, node, key, manager string) time.Time {
	t.Helper()
	for {
		n := getNode(t, node)
		n.Spec.Taints = append(n.Spec.Taints, corev1.Taint{Key: key, Effect: corev1.TaintEffectNoSchedule})
		_, err := admin.CoreV1().Nodes().Update(context.Background(), n, metav1.UpdateOptions{FieldManager: manager})
		if err == nil {
			return time.Now()
		}
		if !strings.Contains(err.Error(), "the object has been modified") {
			t.Fatal(err)
		}
	}
}

// taintEvents are plugd's events about node of reason, their notes.
func taintEvents(t *testing.T, node, reason string) []string {
	list, err := admin.EventsV1().Events("default").List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range list.Items {
		if e.Regarding.Name == node && e.Reason == reason {
			out = append(out, e.Note)
		}
	}
	return out
}

func TestPluginTaints(t *testing.T) {
	top := t
	const name, window = "k-taints", 75 * time.Second
	k := startKubelet(t, name, csiTaint+":NoSchedule", gpuTaint+":NoSchedule")
	kubeletStart := time.Now()
	applyManifest(t, "deploy/kubernetes/daemonset.yaml")
	applyManifest(t, "deploy/kubernetes/remove-taint-rbac.yaml")
	dir := testenv.ShortDir(t, "kx")
	kubeconfig := filepath.Join(dir, "kubeconfig")
	if err := cp.WriteKubeconfig(kubeconfig, plugdToken(t)); err != nil {
		t.Fatal(err)
	}
	tl := watchTaints(t, name)
	config := fmt.Sprintf(`mode: observe
registryDir: %s
handlers: [{type: CSIPlugin, handler: csi}, {type: DevicePlugin, handler: deviceplugin}]
kubernetes:
  kubeconfig: %s
  nodeName: %s
  startupWindow: %s
  kubelet: {address: %q, caFile: %s, podResourcesSocket: %s}
expect:
  - {type: CSIPlugin, name: %s, taint: "%s:NoSchedule", retaint: true}
  - {type: DevicePlugin, name: %s, taint: "%s:NoSchedule"}
doctor: {procDir: none}
`, k.RegistryDir, kubeconfig, name, window, k.Addr, k.CertFile, k.PodResources, csiName, csiTaint, gpuName, gpuTaint)
	pd := startPlugd(t, dir, config)
	csi := newCSIPeer(t, dir, k.RegistryDir)

	t.Run("each taint goes with its own plugin, once the kubelet holds it", func(t *testing.T) {
		csi.startDriver(top, "id-a")
		csi.startRegistrar(top)
		waitCondition(t, name, csiCond, corev1.ConditionTrue, "PluginReady")
		eventuallyWithin(t, time.Second, "the CSI driver's taint removed", func() (bool, string) { return !hasTaint(t, name, csiTaint), "" })
		if !hasTaint(t, name, gpuTaint) {
			t.Fatal("the device plugin's taint is gone before it registered")
		}
		wantTaintRemoved(t, pd.socket, csiName, csiTaint, 0, "")
		wantRemovalTimed(t, pd, csiTaint)
		csiGap := tl.last(tl.gone, csiTaint).Sub(tl.last(tl.trueAt, csiCond))
		time.Sleep(5 * time.Second) // the second plugin comes 5 s later, as the scenario says (not a synchronisation)
		startHealthPlugin(top, k.RegistryDir, gpuName, 2)
		waitCondition(t, name, gpuCond, corev1.ConditionTrue, "PluginReady")
		eventuallyWithin(t, time.Second, "the device plugin's taint removed", func() (bool, string) { return !hasTaint(t, name, gpuTaint), "" })
		gpuGap := tl.last(tl.gone, gpuTaint).Sub(tl.last(tl.trueAt, gpuCond))
		t.Logf("condition True to taint removed, as the Node's watch saw them: CSI %s, device plugin %s", csiGap.Round(time.Millisecond), gpuGap.Round(time.Millisecond))
		for what, gap := range map[string]time.Duration{"CSI": csiGap, "device plugin": gpuGap} {
			if gap < 0 || gap > time.Second {
				t.Errorf("%s: taint removed %s after its condition's True; want after it, within 1s", what, gap)
			}
		}
		if got := taintEvents(t, name, "TaintRemoved"); len(got) != 2 {
			t.Errorf("TaintRemoved events: %q; want one per taint", got)
		}
	})

	t.Run("a re-add within the window is removed again, naming its writer", func(t *testing.T) {
		at := readdTaint(t, name, csiTaint, "test-node-manager")
		eventuallyWithin(t, 2*time.Second, "the re-added taint removed again", func() (bool, string) { return !hasTaint(t, name, csiTaint), "" })
		t.Logf("re-added to removed again: %s", tl.last(tl.gone, csiTaint).Sub(at).Round(time.Millisecond))
		eventually(t, "one TaintReadded event naming the writer", func() (bool, string) {
			got := taintEvents(t, name, "TaintReadded")
			return len(got) == 1 && strings.Contains(got[0], "test-node-manager"), fmt.Sprint(got)
		})
		wantTaintRemoved(t, pd.socket, csiName, csiTaint, 1, "test-node-manager")
	})

	t.Run("retaint: back on False, gone on True", func(t *testing.T) {
		csi.registrar.signal(syscall.SIGTERM)
		eventually(t, "the CSI driver's condition False", func() (bool, string) {
			c := condition(getNode(t, name), csiCond)
			return c != nil && c.Status == corev1.ConditionFalse, fmt.Sprint(c)
		})
		eventuallyWithin(t, 2*time.Second, "the taint put back", func() (bool, string) { return hasTaint(t, name, csiTaint), "" })
		csi.startRegistrar(top)
		waitCondition(t, name, csiCond, corev1.ConditionTrue, "PluginReady")
		eventuallyWithin(t, 2*time.Second, "the taint removed again", func() (bool, string) { return !hasTaint(t, name, csiTaint), "" })
		if got := taintEvents(t, name, "TaintRestored"); len(got) != 1 {
			t.Errorf("TaintRestored events: %q; want 1", got)
		}
	})

	t.Run("after the window a re-add is left to its writer, through a restart of plugd", func(t *testing.T) {
		if d := time.Until(kubeletStart.Add(window + 2*time.Second)); d > 0 {
			time.Sleep(d) // the window is wall time on the kubelet's start: wait it out (not a synchronisation)
		}
		readdTaint(t, name, csiTaint, "test-node-manager")
		removals := tl.count(tl.gone, csiTaint)
		pd.stop(t)
		pd = startPlugd(top, dir, config)
		waitCondition(t, name, csiCond, corev1.ConditionTrue, "PluginReady")
		eventually(t, "plugd compared every condition", func() (bool, string) {
			out, _ := plugctl(t, "--socket", pd.socket, "doctor")
			return !strings.Contains(out, "condition-pending"), out
		})
		if !hasTaint(t, name, csiTaint) || tl.count(tl.gone, csiTaint) != removals {
			t.Errorf("plugd removed a taint another writer put back after the window")
		}
		if hasTaint(t, name, gpuTaint) {
			t.Error("a restart of plugd put the device plugin's taint back")
		}
		wantTaintHeld(t, pd.socket, csiName, csiTaint, "test-node-manager")
		wantDoctorNamesHolder(t, pd.socket, name, csiTaint, "test-node-manager")
	})
}
