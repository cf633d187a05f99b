//go:build linux

package kube

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/plugd/plugd/api"
	"github.com/plugd/plugd/internal/nodecond"
	"github.com/plugd/plugd/internal/testenv"
)

// resourceCond is the condition of the expect entry with anyOf named
// after draName: the resource, whichever mechanism provides it.
const resourceCond = draName + "/Ready"

// One readiness across modes (issue 34 item 2), beside the real kubelet: a
// resource any of a device plugin and a DRA driver may provide. The device
// plugin makes it ready; then it stops, and only after that does the DRA
// driver (kubeletplugin) start, as a move from one to the other does: the
// condition stays True throughout, and every write of it names a mechanism
// the kubelet holds as the write comes. Back the other way, both running
// at once: no write until the holder stops, then the other holds it at
// once. With neither, the condition turns False, past the switch's grace,
// with the reasons of both.
func TestAnyOfMove(t *testing.T) {
	const node = "k-anyof"
	k := startKubelet(t, node)
	applyManifest(t, "deploy/kubernetes/daemonset.yaml")
	dir := testenv.ShortDir(t, "ka")
	kubeconfig := filepath.Join(dir, "kubeconfig")
	if err := cp.WriteKubeconfig(kubeconfig, plugdToken(t)); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(dir, "dra"), 0o750); err != nil {
		t.Fatal(err)
	}
	// held is, for each write of True in order, the sockets the kubelet
	// held as the watch brought it.
	var mu sync.Mutex
	var held [][]string
	kn := &truthNode{k: k}
	conds := watchConditions(t, node, func(string) bool {
		socks, _ := kn.kubeletSockets()
		mu.Lock()
		held = append(held, socks)
		mu.Unlock()
		return true
	})
	begin := time.Now()

	gpu := startDevicePlugin(t, k.RegistryDir, gpuName, 2)
	pd := startPlugd(t, dir, fmt.Sprintf(`mode: observe
registryDir: %s
handlers: [{type: DRAPlugin, handler: dra}, {type: DevicePlugin, handler: deviceplugin}]
kubernetes:
  kubeconfig: %s
  nodeName: %s
  kubelet: {address: %q, caFile: %s, podResourcesSocket: %s}
expect:
  - name: %s
    anyOf: [{type: DevicePlugin, name: %s}, {type: DRAPlugin, name: %s}]
doctor: {procDir: none}
`, k.RegistryDir, kubeconfig, node, k.Addr, k.CertFile, k.PodResources, draName, gpuName, draName))
	waitHolder(t, node, "DevicePlugin "+gpuName)

	gpu.Close()
	dra := startDRA(t, k.RegistryDir, filepath.Join(dir, "dra"), node)
	waitHolder(t, node, "DRAPlugin "+draName)
	caughtUp(t, conds, node, resourceCond)

	// Before the kubelet has registered the device plugin, False; from its
	// first True on, True only.
	trs := conds.since(resourceCond, begin)
	var holders []string
	trues := 0
	for i, tr := range trs {
		if tr.status != string(corev1.ConditionTrue) && trues == 0 {
			continue
		}
		typ, name, ok := nodecond.Holder(tr.message)
		if tr.status != string(corev1.ConditionTrue) || !ok {
			t.Errorf("write %d of %s: %s, %q; want True, held by a mechanism", i, resourceCond, tr, tr.message)
			continue
		}
		mu.Lock()
		socks := held[trues]
		mu.Unlock()
		trues++
		if !slices.ContainsFunc(socks, func(s string) bool { return holdsMechanism(k.RegistryDir, s, typ) }) {
			t.Errorf("write %d of %s names %s %s, which the kubelet did not hold as it came: it held %q", i, resourceCond, typ, name, socks)
		}
		if len(holders) == 0 || holders[len(holders)-1] != typ {
			holders = append(holders, typ)
		}
	}
	if !slices.Equal(holders, []string{"DevicePlugin", "DRAPlugin"}) {
		t.Errorf("%s was held by %q in turn; want the device plugin, then the DRA driver", resourceCond, holders)
	}
	for _, tr := range trs {
		t.Logf("%s %s: %s", tr.at.Format("15:04:05.000"), tr, tr.message)
	}

	// Who holds it, as the status API (plugctl get) and kubectl plugd node
	// say.
	eventually(t, "the status API saying the DRA driver holds "+resourceCond, func() (bool, string) {
		ps, err := pd.client.Plugins(context.Background(), api.Filter{Type: "DRAPlugin"})
		if err != nil || len(ps) != 1 {
			return false, fmt.Sprintf("%+v, %v", ps, err)
		}
		return slices.Equal(ps[0].Holds, []string{resourceCond}), fmt.Sprintf("holds %q", ps[0].Holds)
	})
	kcfg := filepath.Join(dir, "admin.kubeconfig")
	if err := cp.WriteKubeconfig(kcfg, cp.AdminToken); err != nil {
		t.Fatal(err)
	}
	if out, code := kubectlPlugd(t, "node", node, "--kubeconfig", kcfg); code != 0 || !regexp.MustCompile(`(?m)^anyOf +`+regexp.QuoteMeta(draName)+` +True +PluginReady +\S+ +DRAPlugin `+regexp.QuoteMeta(draName)+`$`).MatchString(out) {
		t.Errorf("kubectl plugd node %s (exit %d) does not show the DRA driver holding %s:\n%s", node, code, resourceCond, out)
	}

	// Back (a rollback): the device plugin again beside the DRA driver,
	// both ready: the DRA driver keeps holding it, nothing is written; the
	// DRA driver stopped: the device plugin holds it at once, True still.
	gpu = startDevicePlugin(t, k.RegistryDir, gpuName, 2)
	eventually(t, "plugd seeing the kubelet hold the device plugin again", func() (bool, string) {
		ps, err := pd.client.Plugins(context.Background(), api.Filter{Type: "DevicePlugin"})
		if err != nil || len(ps) != 1 || ps[0].Kubelet == nil {
			return false, fmt.Sprintf("%+v, %v", ps, err)
		}
		return ps[0].Kubelet.State == api.KubeletRegistered, fmt.Sprintf("%+v", *ps[0].Kubelet)
	})
	switched := time.Now()
	dra.Stop()
	waitHolder(t, node, "DevicePlugin "+gpuName)
	caughtUp(t, conds, node, resourceCond)
	back := conds.since(resourceCond, begin)[len(trs):]
	if len(back) != 1 || back[0].status != string(corev1.ConditionTrue) || back[0].at.Before(switched) {
		t.Errorf("from the device plugin's return on, %s was written %d times (%v); want once, True, after the DRA driver stopped (%s)", resourceCond, len(back), back, switched.Format("15:04:05.000"))
	}

	// Neither: False, once the switch's grace (10s) is over.
	stopped := time.Now()
	gpu.Close()
	c := waitFalse(t, node, resourceCond)
	for _, s := range []string{"none ready (DevicePlugin " + gpuName + ": ", ", DRAPlugin " + draName + ": ", "; DRAPlugin " + draName + ": "} {
		if !strings.Contains(c.Message, s) {
			t.Errorf("the False of %s says %q; want it to say %q", resourceCond, c.Message, s)
		}
	}
	if tr, ok := conds.last(resourceCond); !ok || tr.at.Sub(stopped) < 10*time.Second {
		t.Errorf("%s turned False %s after the last mechanism stopped; want no sooner than the switch's grace, 10s", resourceCond, tr.at.Sub(stopped))
	}
}

// holdsMechanism says socket, one the kubelet holds, is a registration
// socket in reg of a plugin of type typ as these tests run them: the device
// plugin's gpu.sock, the DRA driver's named by kubeletplugin after it.
func holdsMechanism(reg, socket, typ string) bool {
	dir, base := filepath.Split(socket)
	if filepath.Clean(dir) != filepath.Clean(reg) {
		return false
	}
	switch typ {
	case "DevicePlugin":
		return base == "gpu.sock"
	case "DRAPlugin":
		return strings.HasPrefix(base, draName+"-")
	}
	return false
}

// waitHolder waits until node's resourceCond is True, held by holder
// ("TYPE NAME").
func waitHolder(t *testing.T, node, holder string) {
	t.Helper()
	eventually(t, resourceCond+" held by "+holder, func() (bool, string) {
		c := condition(getNode(t, node), resourceCond)
		if c == nil {
			return false, "no such condition"
		}
		typ, name, _ := nodecond.Holder(c.Message)
		return c.Status == corev1.ConditionTrue && typ+" "+name == holder, fmt.Sprintf("%s %s: %s", c.Status, c.Reason, c.Message)
	})
}

// caughtUp waits until conds has node's condition cond as a GET finds it
// now: the watch may lag a GET.
func caughtUp(t *testing.T, conds *conditionLog, node, cond string) {
	t.Helper()
	(&truthNode{name: node, conds: conds}).caughtUp(t, cond)
}

// waitFalse waits until node's condition typ is False, for any reason.
func waitFalse(t *testing.T, node, typ string) *corev1.NodeCondition {
	t.Helper()
	var got *corev1.NodeCondition
	eventually(t, typ+" False", func() (bool, string) {
		got = condition(getNode(t, node), typ)
		if got == nil {
			return false, "no such condition"
		}
		return got.Status == corev1.ConditionFalse, fmt.Sprintf("%s %s: %s", got.Status, got.Reason, got.Message)
	})
	return got
}
