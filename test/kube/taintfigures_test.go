//go:build linux

package kube

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/plugd/plugd/internal/nodecond"
	"github.com/plugd/plugd/internal/testenv"
	"github.com/plugd/plugd/test/kube/kubelet"
)

// The figures of issue 32 beside the real kubelet, several runs each
// (PLUGD_KUBE_FIGURES=N: N registrations, N/3 dead plugds, at least 3;
// skipped otherwise, a few minutes), reported in the log and in
// docs/kubernetes.md ("Startup taints: the figures"):
//   - the kubelet's registration of a CSI driver (its write of the driver,
//     with its attach limit, into CSINode: the registration's end as the API
//     server orders it) to plugd's removal of the driver's taint, and its
//     condition's True to that removal: p50 and p99 (nearest rank: of fewer
//     than 100 runs, the slowest);
//   - plugd SIGKILLed, then the registrar stopped, to the condition no
//     longer True, with the shipped caretaker;
//   - at steady state, the API requests of plugd and of the caretaker over
//     a minute, from the API server's audit log.
//
// Each registration is a registrar started again: with retaint the taint
// is put back when the registrar stops (the condition False), and removed
// once the kubelet has registered the new socket, as at a node's boot.
// removalGoal is issue 32's goal for the kubelet's registration to the
// taint's removal.
const removalGoal = 50 * time.Millisecond

func TestTaintFigures(t *testing.T) {
	runs, _ := strconv.Atoi(os.Getenv("PLUGD_KUBE_FIGURES"))
	if runs <= 0 {
		t.Skip("set PLUGD_KUBE_FIGURES=N to measure, N runs")
	}
	f := startFiguresNode(t, "k-taint-figures")
	fromKubelet, fromTrue := f.registrations(runs)
	t.Logf("the kubelet's CSINode write to the taint removed, %d runs: p50 %s, p99 %s (runs: %s)", runs,
		quantile(fromKubelet, 0.5), quantile(fromKubelet, 0.99), durations(fromKubelet))
	t.Logf("the condition's True to the taint removed, %d runs: p50 %s, p99 %s (runs: %s)", runs,
		quantile(fromTrue, 0.5), quantile(fromTrue, 0.99), durations(fromTrue))
	// The goal: the taint gone within 50 ms of the kubelet's registration,
	// at the median (with an evaluation gap of 100 ms it took 107 ms).
	if p50 := quantile(fromKubelet, 0.5); p50 > removalGoal {
		t.Errorf("the kubelet's CSINode write to the taint removed: p50 %s, over the goal of %s", p50, removalGoal)
	}
	f.steadyMinute()
	dead := f.deadPlugds(max(runs/3, 3))
	t.Logf("plugd SIGKILLed, then the registrar stopped, to the condition no longer True (reason %s), %d runs: median %s (runs: %s)",
		nodecond.ReasonPlugdNotRunning, len(dead), quantile(dead, 0.5), durations(dead))
	if quantile(dead, 1) > deadBound {
		t.Errorf("a dead plugd's True stood for %s, more than %s", quantile(dead, 1), deadBound)
	}
}

// figuresNode is TestTaintFigures's node: the real kubelet, plugd with a
// CSI driver's taint (retaint), the driver and its registrar, the shipped
// caretaker, and the watches of the Node and the CSINode.
type figuresNode struct {
	t                 *testing.T
	node, dir, config string
	k                 *kubelet.Kubelet
	endpoint          string
	wl                *writeLog
	pd                *plugd
	reg               *proc
}

func startFiguresNode(t *testing.T, node string) *figuresNode {
	f := &figuresNode{t: t, node: node}
	f.k = startKubelet(t, node, taintA+":NoSchedule")
	applyManifest(t, "deploy/kubernetes/daemonset.yaml")
	applyManifest(t, "deploy/kubernetes/remove-taint-rbac.yaml")
	f.dir = testenv.ShortDir(t, "kf")
	kubeconfig := filepath.Join(f.dir, "kubeconfig")
	if err := cp.WriteKubeconfig(kubeconfig, plugdToken(t)); err != nil {
		t.Fatal(err)
	}
	k := f.k
	f.config = fmt.Sprintf(`mode: observe
registryDir: %s
handlers: [{type: CSIPlugin, handler: csi}]
kubernetes:
  kubeconfig: %s
  nodeName: %s
  kubelet: {address: %q, caFile: %s, podResourcesSocket: %s}
expect:
  - {type: CSIPlugin, name: %s, taint: "%s:NoSchedule", retaint: true}
doctor: {procDir: none}
`, k.RegistryDir, kubeconfig, node, k.Addr, k.CertFile, k.PodResources, csiA, taintA)
	f.wl = watchWrites(t, node, func(string) removalProbe { return removalProbe{} })
	f.pd = startPlugd(t, f.dir, f.config)
	f.endpoint = startCSIDriverNamed(t, f.dir, node, csiA)
	args, _ := shippedCaretaker(t)
	startCaretaker(t, f.dir, args...)
	return f
}

// registrations starts the registrar runs times, each time until its
// taint is gone, then stops it, until the taint is back (retaint); it
// returns, for each, the time from the kubelet's CSINode write and from
// the condition's True to the taint's removal.
func (f *figuresNode) registrations(runs int) (fromKubelet, fromTrue []time.Duration) {
	t, wl := f.t, f.wl
	for range runs {
		nodes, csinodes := wl.lens()
		f.reg = startRegistrarNamed(t, f.endpoint, f.k.RegistryDir, csiA)
		var entry csiNodeWrite
		var ready, gone nodeWrite
		eventually(t, "the watches bringing the registration, the True and the removal", func() (bool, string) {
			var ok1, ok2, ok3 bool
			entry, _, ok1 = wl.listed(csiA, true, csinodes)
			ready, _, ok2 = wl.firstReady(condA, nodes)
			gone, _, ok3 = wl.removal(taintA, nodes)
			return ok1 && ok2 && ok3, fmt.Sprintf("CSINode %t, True %t, removed %t", ok1, ok2, ok3)
		})
		if gone.rv <= entry.rv || gone.rv <= ready.rv {
			t.Fatalf("the taint removed before the kubelet's CSINode write or the condition's True:\n%s", wl)
		}
		fromKubelet = append(fromKubelet, gone.at.Sub(entry.at))
		fromTrue = append(fromTrue, gone.at.Sub(ready.at))
		f.reg.signal(syscall.SIGTERM)
		waitCondition(t, f.node, condA, corev1.ConditionFalse, "SocketMissing")
		eventually(t, "the taint put back, as the watch saw it", func() (bool, string) {
			wl.mu.Lock()
			defer wl.mu.Unlock()
			return slices.Contains(wl.nodes[len(wl.nodes)-1].taints, taintA), ""
		})
	}
	return fromKubelet, fromTrue
}

// steadyMinute registers the driver and logs plugd's and the caretaker's
// requests over a minute of steady state; neither may read or write a
// Node then.
func (f *figuresNode) steadyMinute() {
	t := f.t
	f.reg = startRegistrarNamed(t, f.endpoint, f.k.RegistryDir, csiA)
	waitCondition(t, f.node, condA, corev1.ConditionTrue, "PluginReady")
	from := time.Now()
	time.Sleep(time.Minute) // the window measured, not a synchronisation
	to := time.Now()
	for _, user := range []string{"system:serviceaccount:plugd:plugd", caretakerUser} {
		by, err := auditCount(user, from, to)
		if err != nil {
			t.Fatal(err)
		}
		onNodes, err := auditCountOf(user, "nodes", from, to)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("steady state, %s over %s: %v, of them on Nodes %v", user, to.Sub(from).Round(time.Second), by, onNodes)
		if len(onNodes) != 0 {
			t.Errorf("%s read or wrote Nodes at steady state: %v", user, onNodes)
		}
	}
}

// deadPlugds SIGKILLs plugd and stops the registrar n times, each time
// until the condition is no longer True, then starts both again until it
// is True; it returns the times from the kill to the condition not True.
func (f *figuresNode) deadPlugds(n int) []time.Duration {
	t := f.t
	var dead []time.Duration
	for range n {
		killed := time.Now()
		f.pd.cmd.Process.Signal(syscall.SIGKILL)
		<-f.pd.done
		f.reg.signal(syscall.SIGTERM)
		eventually(t, "the condition no longer True", func() (bool, string) {
			c := condition(getNode(t, f.node), condA)
			return c != nil && c.Status != corev1.ConditionTrue, fmt.Sprint(c)
		})
		dead = append(dead, unknownAfterWrites(t, f.wl, condA, killed))
		f.pd = startPlugd(t, f.dir, f.config)
		f.reg = startRegistrarNamed(t, f.endpoint, f.k.RegistryDir, csiA)
		waitCondition(t, f.node, condA, corev1.ConditionTrue, "PluginReady")
	}
	return dead
}

// unknownAfterWrites is how long after from the Node's watch first
// brought cond not True.
func unknownAfterWrites(t *testing.T, wl *writeLog, cond string, from time.Time) time.Duration {
	t.Helper()
	wl.mu.Lock()
	defer wl.mu.Unlock()
	for _, w := range wl.nodes {
		if w.at.After(from) && !slices.Contains(w.ready, cond) {
			return w.at.Sub(from)
		}
	}
	t.Fatalf("no write of the Node after %s without %s True", from.Format(time.StampMilli), cond)
	return 0
}

// lens are the numbers of the Node's and the CSINode's writes so far.
func (wl *writeLog) lens() (nodes, csinodes int) {
	wl.mu.Lock()
	defer wl.mu.Unlock()
	return len(wl.nodes), len(wl.csinodes)
}

// quantile is the q-quantile of ds, by nearest rank.
func quantile(ds []time.Duration, q float64) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	i := int(float64(len(s))*q+0.999999) - 1
	return s[min(max(i, 0), len(s)-1)].Round(time.Millisecond)
}

func durations(ds []time.Duration) string {
	var out []string
	for _, d := range ds {
		out = append(out, d.Round(time.Millisecond).String())
	}
	return strings.Join(out, ", ")
}
