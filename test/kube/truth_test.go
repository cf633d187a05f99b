//go:build linux

package kube

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/plugd/plugd/api"
	"github.com/plugd/plugd/internal/nodecond"
	"github.com/plugd/plugd/internal/testenv"
	"github.com/plugd/plugd/test/kube/kubelet"
)

const topologyKey = "topology.example.com/node"

// truthNode is a node with a real kubelet, plugd observing it with the
// shipped RBAC, and the field's plugins.
type truthNode struct {
	name       string
	k          *kubelet.Kubelet
	dir        string
	config     string
	pd         *plugd
	csi        *csiPeer
	gpu        *healthPlugin
	conds      *conditionLog
	events     *eventLog
	kubeconfig string
}

func newTruthNode(t *testing.T, name string) *truthNode {
	t.Helper()
	k := startKubelet(t, name, taintKey+":NoSchedule")
	applyManifest(t, "deploy/kubernetes/daemonset.yaml")
	applyManifest(t, "deploy/kubernetes/remove-taint-rbac.yaml")
	n := &truthNode{name: name, k: k, dir: testenv.ShortDir(t, "kt")}
	n.kubeconfig = filepath.Join(n.dir, "kubeconfig")
	if err := cp.WriteKubeconfig(n.kubeconfig, plugdToken(t)); err != nil {
		t.Fatal(err)
	}
	n.conds = watchConditions(t, name, n.holdsPluginOf)
	n.events = watchEvents(t, name)
	n.config = fmt.Sprintf(`mode: observe
registryDir: %s
handlers: [{type: CSIPlugin, handler: csi}, {type: DRAPlugin, handler: dra}, {type: DevicePlugin, handler: deviceplugin}]
kubernetes:
  kubeconfig: %s
  nodeName: %s
  removeTaintWhenReady: "%s:NoSchedule"
  disagreementGrace: 2s
  kubelet: {address: %q, caFile: %s, podResourcesSocket: %s}
expect:
  - {type: CSIPlugin, name: %s}
  - {type: DevicePlugin, name: %s, minHealthyDevices: 2}
  - {type: DRAPlugin, name: %s}
doctor: {kubeletRoots: [%s], procDir: none}
`, k.RegistryDir, n.kubeconfig, name, taintKey, k.Addr, k.CertFile, k.PodResources, csiName, gpuName, draName, filepath.Join(n.dir, "none"))
	n.csi = newCSIPeer(t, n.dir, k.RegistryDir)
	if err := os.MkdirAll(filepath.Join(n.dir, "dra"), 0o750); err != nil {
		t.Fatal(err)
	}
	return n
}

// ready brings the node back to where every subtest starts: plugd, the
// kubelet and every plugin running, every condition True. A subtest that
// failed half-way leaves the next one a node it can work with.
func (n *truthNode) ready(t *testing.T, top *testing.T) {
	t.Helper()
	select {
	case <-n.pd.done:
		n.pd = startPlugd(top, n.dir, n.config)
	default:
	}
	if !n.k.Running() {
		if err := n.k.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case <-n.csi.registrar.done:
		n.csi.startRegistrar(top)
	default:
	}
	for _, c := range []string{csiCond, gpuCond, draCond} {
		waitCondition(t, n.name, c, corev1.ConditionTrue, "PluginReady")
	}
}

// kubeletLogCount counts the lines of the kubelet's log that hold s.
// kubeletRegistrations counts the registrations of socket the kubelet's
// reconciler has begun, from its log.
func (n *truthNode) kubeletRegistrations(socket string) int {
	b, _ := os.ReadFile(n.k.LogFile())
	c := 0
	for l := range strings.Lines(string(b)) {
		if strings.Contains(l, "OperationExecutor.RegisterPlugin started") && strings.Contains(l, socket) {
			c++
		}
	}
	return c
}

func (n *truthNode) kubeletLogCount(s string) int {
	b, _ := os.ReadFile(n.k.LogFile())
	return strings.Count(string(b), s)
}

// heldRE is a socket the kubelet's plugin manager holds, in its /metrics.
var heldRE = regexp.MustCompile(`plugin_manager_total_plugins\{socket_path="([^"]+)",state="actual_state_of_world"\} 1\b`)

// kubeletSockets are the sockets the running kubelet's plugin manager
// holds now (its actual state of the world), from its own /metrics; ok is
// false if they cannot be read (no kubelet runs).
func (n *truthNode) kubeletSockets() (socks []string, ok bool) {
	body, code, err := n.k.Get(context.Background(), "/metrics", cp.AdminToken)
	if err != nil || code != 200 {
		return nil, false
	}
	for _, m := range heldRE.FindAllStringSubmatch(body, -1) {
		socks = append(socks, m[1])
	}
	return socks, true
}

// kubeletHolds says the kubelet's plugin manager holds socket now, from
// its own /metrics.
func (n *truthNode) kubeletHolds(t *testing.T, socket string) bool {
	t.Helper()
	socks, _ := n.kubeletSockets()
	return slices.Contains(socks, socket)
}

// holdsPluginOf says the kubelet's plugin manager holds the registration
// socket of the plugin of condition cond now. It reads only what does not
// change while the test runs (the conditionLog asks it from its own
// goroutine): the DRA driver's socket is named by kubeletplugin, after the
// driver.
func (n *truthNode) holdsPluginOf(cond string) bool {
	socks, _ := n.kubeletSockets()
	for _, s := range socks {
		dir, base := filepath.Split(s)
		if filepath.Clean(dir) != filepath.Clean(n.k.RegistryDir) {
			continue
		}
		switch cond {
		case csiCond:
			if base == csiName+"-reg.sock" {
				return true
			}
		case gpuCond:
			if base == "gpu.sock" {
				return true
			}
		case draCond:
			if strings.HasPrefix(base, draName+"-") {
				return true
			}
		}
	}
	return false
}

// writes is the condition's writes since from, as STATUS/REASON (Absent
// where the Node went with it).
func (n *truthNode) writes(cond string, from time.Time) []string {
	var out []string
	for _, tr := range n.conds.since(cond, from) {
		out = append(out, tr.String())
	}
	return out
}

// expectWrites checks every write of the condition since from against
// want, in order: each element is a regular expression of one write
// (STATUS/REASON), and one that ends in ? may be missing, one that ends in
// * may be there any number of times. Each write of True must have come
// while the kubelet held the plugin's socket (its /metrics, read as the
// watch brought the write).
func (n *truthNode) expectWrites(t *testing.T, cond string, from time.Time, want ...string) {
	t.Helper()
	n.caughtUp(t, cond)
	trs := n.conds.since(cond, from)
	got := n.writes(cond, from)
	if !seqMatch(got, want) {
		t.Errorf("%s was written %q; want %q", cond, got, want)
	}
	for _, tr := range trs {
		if tr.status == string(corev1.ConditionTrue) && !tr.held {
			t.Errorf("%s written True at %s while the kubelet did not hold its plugin's socket", cond, tr.at.Format("15:04:05.000"))
		}
	}
	t.Logf("%s: %s", cond, strings.Join(got, " -> "))
}

// caughtUp waits until the condition log has the Node's condition cond
// as a GET finds it now: the watch may lag a GET (and the log asks the
// kubelet at each write of True).
func (n *truthNode) caughtUp(t *testing.T, cond string) {
	t.Helper()
	eventually(t, "the watch bringing "+cond, func() (bool, string) {
		c := condition(getNode(t, n.name), cond)
		l, ok := n.conds.last(cond)
		if c == nil {
			return !ok || l.status == "", fmt.Sprintf("the log has %s; the Node none", l)
		}
		return ok && l.status == string(c.Status) && l.reason == c.Reason && l.message == c.Message, fmt.Sprintf("the log has %s; the Node %s/%s", l, c.Status, c.Reason)
	})
}

// seqMatch says got matches the patterns of expectWrites.
func seqMatch(got, pats []string) bool {
	if len(pats) == 0 {
		return len(got) == 0
	}
	p, q := pats[0], byte(0)
	if l := len(p); l > 0 && (p[l-1] == '?' || p[l-1] == '*') {
		p, q = p[:l-1], p[l-1]
	}
	one := len(got) > 0 && regexp.MustCompile("^(?:"+p+")$").MatchString(got[0])
	switch q {
	case '?':
		return seqMatch(got, pats[1:]) || one && seqMatch(got[1:], pats[1:])
	case '*':
		return seqMatch(got, pats[1:]) || one && seqMatch(got[1:], pats)
	}
	return one && seqMatch(got[1:], pats[1:])
}

// ev is the pattern of one occurrence of an event of plugd's, for
// expectEvents: its reason, the plugin's type and name, and, after a colon,
// the cause (a regular expression; none for a PluginReady of PluginReady).
func ev(reason, typ, name, cause string) string {
	p := regexp.QuoteMeta(reason + " " + typ + " " + name)
	if cause != "" {
		p += ": " + cause
	}
	return p
}

// The kinds of disagreement, as a KubeletDisagrees event's note says them.
var disagreementNotes = map[string]string{
	"NotRegistered":     "its socket answers, but the kubelet has not registered it",
	"SocketNotServed":   "but no socket of it answers",
	"StaleCSINodeEntry": "holds no registration of it",
}

// expectEvents waits until plugd's events since from that reached the API
// hold every one of want (patterns of ev), then checks they hold nothing
// else. The order is not checked: client-go sends each event from a
// goroutine of its own, so the events of one look of plugd's reach the API
// in any order (the condition's writes have the order). Every occurrence's
// note must describe its own cause: a PluginNotReady's ends with it, a
// KubeletDisagrees' says its kind of disagreement.
func (n *truthNode) expectEvents(t *testing.T, from time.Time, want ...string) {
	t.Helper()
	var got []occurrence
	var extra []string
	missing := want
	// Events reach the API after the writes they tell of: wait for them.
	deadline := time.Now().Add(wait)
	for {
		changed := n.events.changed()
		got = n.events.since(from)
		missing, extra = matchEvents(got, want)
		if len(missing) == 0 || !waitUntil(changed, deadline) {
			break
		}
	}
	if len(missing) > 0 || len(extra) > 0 {
		t.Errorf("plugd's events: missing %q; not expected %q; all: %q", missing, extra, got)
	}
	var names []string
	for _, o := range got {
		names = append(names, o.String())
		_, cause, _ := strings.Cut(strings.TrimPrefix(o.action, "Check "), ": ")
		switch o.reason {
		case "PluginNotReady":
			if !strings.HasSuffix(o.note, "("+cause+")") {
				t.Errorf("%s: the note does not end with its cause: %q", o, o.note)
			}
		case "KubeletDisagrees":
			if d, ok := disagreementNotes[cause]; !ok || !strings.Contains(o.note, d) {
				t.Errorf("%s: the note does not say %q: %q", o, d, o.note)
			}
		}
	}
	t.Logf("events: %s", strings.Join(names, "; "))
}

// matchEvents pairs each pattern of want with one occurrence, and returns
// the patterns with none and the occurrences left over.
func matchEvents(got []occurrence, want []string) (missing, extra []string) {
	used := make([]bool, len(got))
	for _, w := range want {
		re := regexp.MustCompile("^(?:" + w + ")$")
		i := 0
		for i < len(got) && (used[i] || !re.MatchString(got[i].String())) {
			i++
		}
		if i == len(got) {
			missing = append(missing, w)
			continue
		}
		used[i] = true
	}
	for i, o := range got {
		if !used[i] {
			extra = append(extra, o.String())
		}
	}
	return missing, extra
}

// waitEvents waits until plugd's events since from hold want (and maybe
// more).
func (n *truthNode) waitEvents(t *testing.T, from time.Time, want ...string) {
	t.Helper()
	deadline := time.Now().Add(wait)
	for {
		changed := n.events.changed()
		got := n.events.since(from)
		missing, _ := matchEvents(got, want)
		if len(missing) == 0 {
			return
		}
		if !waitUntil(changed, deadline) {
			t.Fatalf("plugd's events: %q not within %s; all: %q", missing, wait, got)
		}
	}
}

// waitUntil waits until ch is closed (true) or the deadline passes (false).
func waitUntil(ch <-chan struct{}, deadline time.Time) bool {
	tm := time.NewTimer(time.Until(deadline))
	defer tm.Stop()
	select {
	case <-ch:
		return true
	case <-tm.C:
		return false
	}
}

// freshPlugd restarts plugd (a rolling restart: no write, as its own
// subtest shows) and waits until it has compared every condition. A
// scenario that counts events starts with it: client-go's cache of events
// lives in plugd's process, and the third occurrence of one event within 6
// minutes reaches the API only when its series ends; with a fresh plugd
// each occurrence of the scenario reaches it at once (the first creates
// the event, the second makes it a series of 2).
func (n *truthNode) freshPlugd(t *testing.T, top *testing.T) {
	t.Helper()
	n.pd.stop(t)
	n.pd = startPlugd(top, n.dir, n.config)
	for _, name := range []string{csiName, gpuName, draName} {
		n.pd.waitKubelet(t, name, api.KubeletRegistered, "")
	}
	eventually(t, "plugd compared every condition", func() (bool, string) {
		out, _ := plugctl(t, "--socket", n.pd.socket, "doctor")
		return !strings.Contains(out, "condition-pending"), out
	})
}

// plugdPatches counts plugd's patches of the Node (its conditions, its
// taint) between from and now, but for heartbeats (due every 5 minutes:
// one may fall in any scenario).
func (n *truthNode) plugdPatches(t *testing.T, from time.Time) int {
	t.Helper()
	by, err := auditCountOf(plugdUser, "nodes", from, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	return by["patch"] - n.conds.beatsSince(from)
}

// Every scenario of the issue against a real kubelet: plugd's conditions
// follow what the running kubelet holds, not the API objects that outlive
// its registrations; each subtest asserts the sequence of condition values
// a watch of the Node saw.
func TestKubeletTruth(t *testing.T) {
	top := t
	n := newTruthNode(t, "k-truth")
	k := n.k
	n.pd = startPlugd(t, n.dir, n.config)
	all := []string{csiCond, gpuCond, draCond}

	t.Run("True only once the kubelet holds each plugin", func(t *testing.T) {
		from := time.Now()
		n.csi.startDriver(top, "id-a")
		n.csi.startRegistrar(top)
		n.gpu = startHealthPlugin(top, k.RegistryDir, gpuName, 2)
		startDRA(top, k.RegistryDir, filepath.Join(n.dir, "dra"), n.name)
		for _, c := range all {
			waitCondition(t, n.name, c, corev1.ConditionTrue, "PluginReady")
		}
		for _, s := range []string{n.csi.socket(), filepath.Join(k.RegistryDir, "gpu.sock")} {
			if !n.kubeletHolds(t, s) {
				t.Errorf("True while the kubelet does not hold %s", s)
			}
		}
		// plugd wrote False (SocketMissing) before each plugin came, maybe
		// before from; a new socket goes through other reasons for False
		// until the kubelet holds it, written if one holds for 3s.
		for _, c := range all {
			n.expectWrites(t, c, from, "False/[A-Za-z]+*", "True/PluginReady")
		}
		v := n.pd.waitKubelet(t, csiName, api.KubeletRegistered, "")
		if !strings.Contains(v.Message, "the kubelet's plugin manager holds "+n.csi.socket()) {
			t.Errorf("view: %+v", v)
		}
		eventually(t, "the startup taint removed", func() (bool, string) {
			has := slices.ContainsFunc(getNode(t, n.name).Spec.Taints, func(tt corev1.Taint) bool { return tt.Key == taintKey })
			return !has, fmt.Sprint(getNode(t, n.name).Spec.Taints)
		})
		m, _ := plugctlMetrics(t, n.pd)
		if v, _ := metric(m, "plugd_kubelet_live"); v != "1" {
			t.Errorf("plugd_kubelet_live = %q", v)
		}
		for _, typ := range []string{"CSIPlugin", "DevicePlugin", "DRAPlugin"} {
			if v, ok := metric(m, "plugd_kubelet_registration_seconds_count", `type="`+typ+`"`); !ok || v == "0" {
				t.Errorf("no registration time of a %s: %q", typ, v)
			}
		}
	})

	t.Run("a registrar stopped and started: False once, True once", func(t *testing.T) {
		n.ready(t, top)
		n.freshPlugd(t, top) // and the next subtest shares it: two causes of one plugin in one plugd
		from := time.Now()
		n.csi.registrar.signal(syscall.SIGTERM)
		// It closes its connections, then removes its socket, and starts
		// again once the condition is False, as a restarted container
		// would.
		eventually(t, "the condition False", func() (bool, string) {
			c := condition(getNode(t, n.name), csiCond)
			return c.Status == corev1.ConditionFalse, c.Reason
		})
		restarted := time.Now()
		n.csi.startRegistrar(top)
		c := waitCondition(t, n.name, csiCond, corev1.ConditionTrue, "PluginReady")
		// The cause is the reason plugd's first look found: the registrar's
		// socket gone, or (where that look came between its closing its
		// connections and removing the socket) not answering.
		n.expectWrites(t, csiCond, from, "False/(SocketMissing|NotAnswering)", "True/PluginReady")
		n.expectWrites(t, gpuCond, from)
		n.expectWrites(t, draCond, from)
		if p := n.plugdPatches(t, from); p > 2 {
			t.Errorf("plugd patched the Node %d times; want at most 2", p)
		}
		n.expectEvents(t, from,
			ev("PluginNotReady", "CSIPlugin", csiName, "(SocketMissing|NotAnswering)"),
			ev("PluginReady", "CSIPlugin", csiName, ""))
		t.Logf("registrar started again to True: %s", c.LastTransitionTime.Sub(restarted).Round(time.Millisecond))
	})

	t.Run("a registrar killed, its socket left, and started again: written twice", func(t *testing.T) {
		n.ready(t, top)
		from := time.Now()
		n.csi.registrar.signal(syscall.SIGKILL)
		if _, err := os.Stat(n.csi.socket()); err != nil {
			t.Fatalf("the killed registrar's socket is gone: %v", err)
		}
		waitCondition(t, n.name, csiCond, corev1.ConditionFalse, "NotAnswering")
		// The kubelet holds the dead socket until a new registrar unlinks
		// it: past the grace, one KubeletDisagrees. The registrar starts
		// again after it, so that the events do not hang on how soon.
		n.waitEvents(t, from, ev("KubeletDisagrees", "CSIPlugin", csiName, "SocketNotServed"))
		restarted := time.Now()
		n.csi.startRegistrar(top)
		c := waitCondition(t, n.name, csiCond, corev1.ConditionTrue, "PluginReady")
		if !n.kubeletHolds(t, n.csi.socket()) {
			t.Error("True while the kubelet does not hold the new socket")
		}
		n.expectWrites(t, csiCond, from, "False/NotAnswering", "True/PluginReady")
		n.expectWrites(t, gpuCond, from)
		n.expectWrites(t, draCond, from)
		if p := n.plugdPatches(t, from); p > 2 {
			t.Errorf("plugd patched the Node %d times; want at most 2", p)
		}
		// The same plugd as the last subtest's: a second PluginReady is a
		// series of 2, and the PluginNotReady of another cause an event of
		// its own, with its own note (expectEvents checks each note).
		n.expectEvents(t, from,
			ev("PluginNotReady", "CSIPlugin", csiName, "NotAnswering"),
			ev("KubeletDisagrees", "CSIPlugin", csiName, "SocketNotServed"),
			ev("PluginReady", "CSIPlugin", csiName, ""))
		t.Logf("registrar started again to True: %s", c.LastTransitionTime.Sub(restarted).Round(time.Millisecond))
	})

	t.Run("the kubelet restarts: False within 10s, True only once it holds them again", func(t *testing.T) {
		n.ready(t, top)
		n.freshPlugd(t, top) // and the next subtest shares it: two causes of one plugin in one plugd
		from := time.Now()
		stopped := from // SIGTERM: the kubelet closes its port, then finishes
		k.Stop()
		for _, c := range all {
			waitCondition(t, n.name, c, corev1.ConditionFalse, "KubeletNotRegistered")
		}
		if d := time.Since(stopped); d > 10*time.Second {
			t.Errorf("False %s after the kubelet stopped; want within 10s", d)
		}
		t.Logf("kubelet stopped to every condition False: %s", time.Since(stopped).Round(time.Millisecond))
		// The API objects still say registered: CSINode lists the driver,
		// the DRA driver's slices are there.
		cn, err := admin.StorageV1().CSINodes().Get(context.Background(), n.name, metav1.GetOptions{})
		if err != nil || len(cn.Spec.Drivers) == 0 {
			t.Errorf("CSINode while the kubelet is down: %+v, %v", cn, err)
		}
		v := n.pd.waitKubelet(t, csiName, api.KubeletNotRegistered, "KubeletNotRunning")
		if !strings.Contains(v.Message, "nothing listens at "+k.Addr) {
			t.Errorf("view while the kubelet is down: %+v", v)
		}
		out, _ := plugctl(t, "--socket", n.pd.socket, "doctor")
		if !strings.Contains(out, "kubelet-not-running") {
			t.Errorf("plugctl doctor with the kubelet down:\n%s", out)
		}
		// Down past the grace, each plugin's socket answers while no
		// kubelet has it: one disagreement each, told once. The kubelet
		// starts after them, so that the events do not hang on how long
		// the above took.
		var disagree []string
		for _, p := range [][2]string{{"CSIPlugin", csiName}, {"DevicePlugin", gpuName}, {"DRAPlugin", draName}} {
			disagree = append(disagree, ev("KubeletDisagrees", p[0], p[1], "NotRegistered"))
		}
		n.waitEvents(t, from, disagree...)
		if err := k.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		started := time.Now()
		for _, c := range all {
			waitCondition(t, n.name, c, corev1.ConditionTrue, "PluginReady")
		}
		t.Logf("kubelet started to every condition True: %s", time.Since(started).Round(time.Millisecond))
		// The new kubelet wipes the node's ResourceSlices as it starts, and
		// the slices of a DRA driver it has not connected to 30s after its
		// registration (its wipingDelay); the driver publishes them again.
		// Neither is a disagreement; the DRA driver is not usable while its
		// slices are gone (NoResourceSlices, a reason of False that may be
		// written once it has held 3s), and its True comes once they are
		// back: the window measured runs past that 30s and plugd's grace
		// twice over.
		// (A window to show an absence in, not a wait for something.)
		time.Sleep(time.Until(started.Add(30*time.Second + 2*2*time.Second + time.Second)))
		// Each write of True came while the new kubelet held the plugin's
		// socket (expectWrites checks it); a False reason's message may be
		// written again, where it held 3s while the kubelet came back
		// ("not running" to "restarted at T").
		for _, c := range all {
			wiped := "False/NoResourceSlices?"
			if c != draCond {
				wiped = "False/KubeletNotRegistered?"
			}
			n.expectWrites(t, c, from, "False/KubeletNotRegistered", "False/KubeletNotRegistered?", wiped, "True/PluginReady")
		}
		want := disagree
		for _, p := range [][2]string{{"CSIPlugin", csiName}, {"DevicePlugin", gpuName}, {"DRAPlugin", draName}} {
			want = append(want, ev("PluginNotReady", p[0], p[1], "KubeletNotRegistered"), ev("PluginReady", p[0], p[1], ""))
		}
		n.expectEvents(t, from, want...)
	})

	t.Run("a device plugin loses and regains health: True within 2s of the kubelet's count", func(t *testing.T) {
		n.ready(t, top)
		from := time.Now()
		n.gpu.setHealthy(1)
		waitCondition(t, n.name, gpuCond, corev1.ConditionFalse, "NoHealthyDevices")
		n.gpu.setHealthy(2)
		var recovered time.Time
		eventually(t, "the kubelet's count back to 2", func() (bool, string) {
			c, err := allocatable(t, k.PodResources, gpuName)
			recovered = time.Now()
			return c == 2, fmt.Sprint(c, err)
		})
		c := waitCondition(t, n.name, gpuCond, corev1.ConditionTrue, "PluginReady")
		n.caughtUp(t, gpuCond)
		tr := n.conds.since(gpuCond, recovered.Add(-2*time.Second))
		if len(tr) == 0 {
			t.Fatalf("no transition seen; condition %+v", c)
		}
		d := tr[len(tr)-1].at.Sub(recovered)
		if d > 2*time.Second {
			t.Errorf("True %s after the kubelet's count recovered; want within 2s", d)
		}
		t.Logf("kubelet's count recovered to condition True: %s", d.Round(time.Millisecond))
		n.expectWrites(t, gpuCond, from, "False/NoHealthyDevices", "True/PluginReady")
		n.expectWrites(t, csiCond, from)
		n.expectWrites(t, draCond, from)
		// The same plugd as the kubelet's restart: a second PluginReady is
		// a series of 2, and this PluginNotReady, of another cause, an
		// event of its own.
		n.expectEvents(t, from,
			ev("PluginNotReady", "DevicePlugin", gpuName, "NoHealthyDevices"),
			ev("PluginReady", "DevicePlugin", gpuName, ""))
		// Two causes of one plugin, within one plugd: two events in the
		// API, each with the note of its own cause (client-go folds events
		// by their action, not their note).
		notes := map[string]string{}
		for _, e := range nodeEvents(t, n.name) {
			if e.Reason == "PluginNotReady" && e.EventTime.After(n.pd.started) && strings.HasPrefix(e.Action, "Check DevicePlugin "+gpuName+": ") {
				notes[strings.TrimPrefix(e.Action, "Check DevicePlugin "+gpuName+": ")] = e.Note
			}
		}
		for _, cause := range []string{"KubeletNotRegistered", "NoHealthyDevices"} {
			if !strings.HasSuffix(notes[cause], "("+cause+")") {
				t.Errorf("the PluginNotReady event of %s in the API: %q (all: %q)", cause, notes[cause], notes)
			}
		}
	})

	t.Run("a driver back with another node id: TopologyConflict, named, with its remedy", func(t *testing.T) {
		n.ready(t, top)
		n.freshPlugd(t, top)
		from := time.Now()
		if got := getNode(t, n.name).Labels[topologyKey]; got != "id-a" {
			t.Fatalf("the kubelet labelled the Node %s=%q", topologyKey, got)
		}
		n.csi.registrar.signal(syscall.SIGTERM)
		n.csi.driver.signal(syscall.SIGTERM)
		n.csi.startDriver(top, "id-b")
		reg := n.csi.startRegistrar(top)
		if code := reg.exited(t); code != 1 {
			t.Errorf("the registrar exited %d; want 1, as node-driver-registrar does when refused", code)
		}
		c := waitCondition(t, n.name, csiCond, corev1.ConditionFalse, "TopologyConflict")
		for _, want := range []string{topologyKey + "=id-b", topologyKey + "=id-a", "kubectl label node " + n.name + " " + topologyKey + "-"} {
			if !strings.Contains(c.Message, want) {
				t.Errorf("the condition's message does not say %q: %s", want, c.Message)
			}
		}
		out, _ := plugctl(t, "--socket", n.pd.socket, "doctor")
		if !strings.Contains(out, "topology-conflict") || !strings.Contains(out, "remove the stale label") {
			t.Errorf("plugctl doctor:\n%s", out)
		}
		// The remedy: the old label goes; the registrar starts again.
		patch := fmt.Sprintf(`{"metadata":{"labels":{%q:null}}}`, topologyKey)
		if _, err := admin.CoreV1().Nodes().Patch(context.Background(), n.name, types.StrategicMergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
		registers := n.kubeletRegistrations(n.csi.socket())
		n.csi.startRegistrar(top)
		waitCondition(t, n.name, csiCond, corev1.ConditionTrue, "PluginReady")
		// The kubelet, still retrying the registration it refused, may
		// register the new socket twice, a reconciler pass apart: the
		// condition must not follow that. What must not happen is watched
		// for over a few of its passes.
		<-time.After(4 * time.Second)
		t.Logf("the kubelet began %d registrations of the new socket", n.kubeletRegistrations(n.csi.socket())-registers)
		// False at once when the registrar and the driver go (the first
		// look's reason, as in the registrar's restart), unless plugd
		// found the new registrar's socket first and waited for its answer
		// (then the conflict is the first reason); the new registrar's
		// socket goes through other reasons for False before the kubelet
		// refuses it, written where one held 3s; then the conflict, until
		// the label goes; then True, once.
		n.caughtUp(t, csiCond)
		got := n.writes(csiCond, from)
		until := time.Now()
		if want := []string{"False/[A-Za-z]+*", "False/TopologyConflict", "True/PluginReady"}; !seqMatch(got, want) {
			t.Errorf("%s was written %q; want %q", csiCond, got, want)
		}
		t.Logf("%s: %s", csiCond, strings.Join(got, " -> "))
		n.expectWrites(t, gpuCond, from)
		n.expectWrites(t, draCond, from)
		notReady := ev("PluginNotReady", "CSIPlugin", csiName, "(SocketMissing|NotAnswering|TopologyConflict)")
		n.waitEvents(t, from, notReady, ev("PluginReady", "CSIPlugin", csiName, ""))
		var evs []occurrence
		for _, o := range n.events.since(from) {
			if !o.at.After(until) {
				evs = append(evs, o)
			}
		}
		want := []string{notReady, ev("PluginReady", "CSIPlugin", csiName, "")}
		// Twice a registrar answers while the kubelet has not registered
		// it: the refused one, until the kubelet refuses it; the new one,
		// while the kubelet backs off from its refusal and then while its
		// retry's registration waits to be replaced. Whether each outlasts
		// the test's 2s grace varies: one disagreement each, told once, if
		// it does.
		d := ev("KubeletDisagrees", "CSIPlugin", csiName, "NotRegistered")
		for _, o := range evs {
			if regexpMatch("^"+d+"$", o.String()) && len(want) < 4 {
				want = append(want, d)
			}
		}
		if missing, extra := matchEvents(evs, want); len(missing)+len(extra) > 0 {
			t.Errorf("plugd's events: missing %q, not expected %q", missing, extra)
		}
	})

	t.Run("the API server away while a registrar goes: the doctor names the stale CSINode entry", func(t *testing.T) {
		n.ready(t, top)
		// A clean start of the registrar first: a registration the kubelet
		// failed before (the topology conflict) leaves it retrying the old
		// socket's, and it registers the new one twice.
		n.csi.registrar.signal(syscall.SIGTERM)
		waitCondition(t, n.name, csiCond, corev1.ConditionFalse, "SocketMissing")
		n.csi.startRegistrar(top)
		waitCondition(t, n.name, csiCond, corev1.ConditionTrue, "PluginReady")
		// A fresh plugd after it: that start's events (and the last
		// subtest's, where the kubelet registered the socket twice) must
		// not leave this one's in client-go's series.
		n.freshPlugd(t, top)
		from := time.Now()
		deregistered := n.kubeletLogCount("DeRegisterPlugin failed")
		cp.StopAPIServer()
		restarted := false
		defer func() {
			if !restarted {
				cp.StartAPIServer(context.Background())
			}
		}()
		n.csi.registrar.signal(syscall.SIGTERM)
		if out := n.csi.registrar.out.String(); !strings.Contains(out, "removed ") {
			t.Fatalf("the registrar did not end by SIGTERM (the kubelet registered it again while the API server was away, and it failed?):\n%s", out)
		}
		// The kubelet lets it go; the Node still says True, and the write
		// of False waits for the API server.
		eventually(t, "the doctor showing the Node's condition and the pending write apart", func() (bool, string) {
			out, _ := plugctl(t, "--socket", n.pd.socket, "doctor")
			return strings.Contains(out, "condition-pending") && strings.Contains(out, "says True, but plugd finds False (SocketMissing)"), out
		})
		// The kubelet deregisters the driver while the API server is away:
		// it tries to remove its CSINode entry a few times within a second,
		// and gives up.
		eventually(t, "the kubelet failing to deregister the driver from CSINode", func() (bool, string) {
			return n.kubeletLogCount("DeRegisterPlugin failed") > deregistered, n.k.Tail(5)
		})
		if err := cp.StartAPIServer(context.Background()); err != nil {
			t.Fatal(err)
		}
		restarted = true
		waitCondition(t, n.name, csiCond, corev1.ConditionFalse, "SocketMissing")
		cn, err := admin.StorageV1().CSINodes().Get(context.Background(), n.name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if !slices.ContainsFunc(cn.Spec.Drivers, func(d storagev1.CSINodeDriver) bool { return d.Name == csiName }) {
			t.Fatalf("the kubelet removed the driver from CSINode after the outage: %+v", cn.Spec.Drivers)
		}
		var remedy string
		eventually(t, "the doctor's stale-csinode-entry finding", func() (bool, string) {
			out, _ := plugctl(t, "--socket", n.pd.socket, "doctor", "-o", "json")
			var l api.FindingList
			decode(t, out, &l)
			for _, f := range l.Findings {
				if f.Check == "stale-csinode-entry" && f.Name == csiName {
					remedy = f.Remedy
					return true, ""
				}
			}
			return false, out
		})
		e := waitEvent(t, n.name, "KubeletDisagrees", "CSIPlugin "+csiName+": StaleCSINodeEntry")
		if !strings.Contains(e.Note, "holds no registration of it") {
			t.Errorf("event: %q", e.Note)
		}
		_, args, ok := strings.Cut(remedy, "kubectl patch csinode "+n.name+" --type=json -p '")
		if !ok {
			t.Fatalf("remedy %q", remedy)
		}
		args = args[:strings.Index(args, "'")]
		var ops []map[string]any
		if err := json.Unmarshal([]byte(args), &ops); err != nil {
			t.Fatalf("the remedy's patch %q: %v", args, err)
		}
		if _, err := admin.StorageV1().CSINodes().Patch(context.Background(), n.name, types.JSONPatchType, []byte(args), metav1.PatchOptions{}); err != nil {
			t.Fatalf("the remedy's patch: %v", err)
		}
		eventually(t, "the finding gone", func() (bool, string) {
			out, _ := plugctl(t, "--socket", n.pd.socket, "doctor")
			return !strings.Contains(out, "stale-csinode-entry"), out
		})
		n.csi.startRegistrar(top)
		waitCondition(t, n.name, csiCond, corev1.ConditionTrue, "PluginReady")
		// The write of False waited for the API server; the stale entry's
		// disagreement outlasted its outage and plugd's backoff: told
		// once, counting a series' occurrences too.
		n.expectWrites(t, csiCond, from, "False/SocketMissing", "True/PluginReady")
		n.expectWrites(t, gpuCond, from)
		n.expectWrites(t, draCond, from)
		n.expectEvents(t, from,
			ev("PluginNotReady", "CSIPlugin", csiName, "SocketMissing"),
			ev("KubeletDisagrees", "CSIPlugin", csiName, "StaleCSINodeEntry"),
			ev("PluginReady", "CSIPlugin", csiName, ""))
	})

	t.Run("plugctl cluster and doctor on the node", func(t *testing.T) {
		n.ready(t, top)
		admincfg := filepath.Join(n.dir, "admin.kubeconfig")
		if err := cp.WriteKubeconfig(admincfg, cp.AdminToken); err != nil {
			t.Fatal(err)
		}
		// Other tests' nodes share the cluster: this node is ready for each.
		out, code := plugctl(t, "cluster", "--kubeconfig", admincfg, "-o", "json")
		var v nodecond.ClusterView
		decode(t, out, &v)
		for _, name := range []string{csiName, gpuName, draName} {
			i := slices.IndexFunc(v.Plugins, func(p nodecond.ClusterPlugin) bool { return p.Name == name })
			if code != 0 || i < 0 || slices.ContainsFunc(v.Plugins[i].NotReady, func(c nodecond.NodeCondition) bool { return c.Node == n.name }) {
				t.Errorf("plugctl cluster (%d) on %s:\n%s", code, name, out)
			}
		}
		out, _ = plugctl(t, "cluster", "--kubeconfig", admincfg)
		t.Logf("plugctl cluster:\n%s", out)
		// plugd's reads of the API server come back with backoff after
		// an outage: the doctor is clean once they have.
		eventually(t, "plugctl doctor with nothing to say but info", func() (bool, string) {
			out, _ := plugctl(t, "--socket", n.pd.socket, "doctor", "-o", "json")
			var l api.FindingList
			decode(t, out, &l)
			for _, f := range l.Findings {
				// This cluster has none of the chart's admission policies
				// (TestAdmissionPolicies installs them for itself), so the
				// doctor rightly warns that none confines plugd's token; a
				// v1.36 kubelet asks the DRA driver, which has no health
				// service, for one every 5 s (TestDRADisagreements).
				expected := f.Check == "health-service-expected" && !kubeletBin.AtLeast("1.37")
				if f.Severity != api.SeverityInfo && f.Check != "admission-policy" && !expected {
					return false, fmt.Sprintf("%+v", f)
				}
			}
			return true, ""
		})
	})

	t.Run("a rolling restart of plugd does not flap", func(t *testing.T) {
		n.ready(t, top)
		from := time.Now()
		n.pd.stop(t)
		n.pd = startPlugd(top, n.dir, n.config)
		for _, name := range []string{csiName, gpuName, draName} {
			n.pd.waitKubelet(t, name, api.KubeletRegistered, "")
		}
		eventually(t, "plugd compared every condition", func() (bool, string) {
			out, _ := plugctl(t, "--socket", n.pd.socket, "doctor")
			return !strings.Contains(out, "condition-pending"), out
		})
		for _, c := range all {
			n.expectWrites(t, c, from)
		}
		n.expectEvents(t, from)
		if p := n.plugdPatches(t, from); p != 0 {
			t.Errorf("plugd patched the Node %d times over its restart", p)
		}
	})

	t.Run("an idle minute: no writes, the cost of the kubelet's reads", func(t *testing.T) {
		n.ready(t, top)
		idleMinute(t, n)
	})

	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGKILL} {
		t.Run("plugd stopped by "+sig.String()+" and a plugin gone meanwhile", func(t *testing.T) {
			n.ready(t, top)
			n.pd.cmd.Process.Signal(sig)
			<-n.pd.done
			from := time.Now()
			n.csi.registrar.signal(syscall.SIGTERM)
			stopped := time.Now()
			if c := condition(getNode(t, n.name), csiCond); c.Status != corev1.ConditionTrue {
				t.Fatalf("the condition changed with plugd stopped: %+v", c)
			}
			// Nobody maintains it: plugctl cluster says so once it is older
			// than it allows (here 2s, for the test; 11m by default).
			admincfg := filepath.Join(n.dir, "admin.kubeconfig")
			eventually(t, "plugctl cluster calling the condition unmaintained", func() (bool, string) {
				out, _ := plugctl(t, "cluster", "--kubeconfig", admincfg, "-o", "wide", "--stale-after", "2s")
				return regexpMatch(n.name+`\s+Unknown\s+NotMaintained`, out), out
			})
			// In a DaemonSet its pod comes back: False at once.
			n.pd = startPlugd(top, n.dir, n.config)
			waitCondition(t, n.name, csiCond, corev1.ConditionFalse, "SocketMissing")
			t.Logf("plugd started %s after the plugin went; False %s after its start", time.Since(stopped).Round(time.Millisecond), time.Since(n.pd.started).Round(time.Millisecond))
			n.csi.startRegistrar(top)
			waitCondition(t, n.name, csiCond, corev1.ConditionTrue, "PluginReady")
			// Nothing while plugd was away (its stop writes nothing either
			// way); the new one finds the socket gone.
			n.expectWrites(t, csiCond, from, "False/SocketMissing", "True/PluginReady")
			n.expectWrites(t, gpuCond, from)
			n.expectWrites(t, draCond, from)
			n.expectEvents(t, from,
				ev("PluginNotReady", "CSIPlugin", csiName, "SocketMissing"),
				ev("PluginReady", "CSIPlugin", csiName, ""))
		})
	}

	t.Run("the Node and CSINode deleted and re-created", func(t *testing.T) {
		n.ready(t, top)
		n.freshPlugd(t, top)
		from := time.Now()
		ctx := context.Background()
		if err := admin.CoreV1().Nodes().Delete(ctx, n.name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		if err := admin.StorageV1().CSINodes().Delete(ctx, n.name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		// A kubelet registers its Node when it starts.
		k.Stop()
		if err := k.Start(ctx); err != nil {
			t.Fatal(err)
		}
		waitNodeReady(t, n.name)
		for _, c := range all {
			waitCondition(t, n.name, c, corev1.ConditionTrue, "PluginReady")
		}
		eventually(t, "the startup taint removed again", func() (bool, string) {
			has := slices.ContainsFunc(getNode(t, n.name).Spec.Taints, func(tt corev1.Taint) bool { return tt.Key == taintKey })
			return !has, fmt.Sprint(getNode(t, n.name).Spec.Taints)
		})
		if _, err := admin.StorageV1().CSINodes().Get(ctx, n.name, metav1.GetOptions{}); err != nil {
			t.Errorf("CSINode: %v", err)
		}
		// The conditions go with the Node. The new Node has none: plugd
		// writes what it finds, False where the new kubelet had not yet
		// registered the plugin when its Node came (its plugin manager
		// and its Node's registration race), then True; never a
		// PluginNotReady, there was no True to fall from. The kubelet was
		// down for as long as its restart took, which may outlast the
		// grace while its Node is there: a disagreement each, maybe. The
		// new kubelet wipes the node's ResourceSlices as it starts: the DRA
		// driver is not usable until it has published them again
		// (NoResourceSlices, written where it held 3s).
		var want []string
		for _, p := range [][3]string{{csiCond, "CSIPlugin", csiName}, {gpuCond, "DevicePlugin", gpuName}, {draCond, "DRAPlugin", draName}} {
			wiped := "False/KubeletNotRegistered*"
			if p[0] == draCond {
				wiped = "False/NoResourceSlices?"
			}
			n.expectWrites(t, p[0], from, "Absent", "False/KubeletNotRegistered*", wiped, "True/PluginReady")
			want = append(want, ev("PluginReady", p[1], p[2], ""))
		}
		// The new Node's registration taint goes as a startup taint (not a
		// re-add: the memory of the taints is of one Node).
		want = append(want, regexp.QuoteMeta("TaintRemoved Remove taint "+taintKey+":NoSchedule"))
		got := n.events.since(from)
		for _, p := range [][2]string{{"CSIPlugin", csiName}, {"DevicePlugin", gpuName}, {"DRAPlugin", draName}} {
			if d := ev("KubeletDisagrees", p[0], p[1], "NotRegistered"); slices.ContainsFunc(got, func(o occurrence) bool { return regexpMatch("^"+d+"$", o.String()) }) {
				want = append(want, d)
			}
		}
		n.expectEvents(t, from, want...)
	})
}

// idleMinute measures a quiet minute beside the real kubelet: plugd's
// requests to the API server (no write but a heartbeat due in it), its
// reads of the kubelet, and the CPU plugd and the kubelet use; then the
// kubelet's CPU and the bytes one read of its /metrics cost.
func idleMinute(t *testing.T, n *truthNode) {
	ctx := context.Background()
	var oldest time.Time
	for _, c := range getNode(t, n.name).Status.Conditions {
		if nodecond.Owned(c) && (oldest.IsZero() || c.LastHeartbeatTime.Time.Before(oldest)) {
			oldest = c.LastHeartbeatTime.Time
		}
	}
	m0, _ := plugctlMetrics(t, n.pd)
	wctx, stop := context.WithCancel(ctx)
	w, err := admin.CoreV1().Nodes().Watch(wctx, metav1.ListOptions{FieldSelector: "metadata.name=" + n.name})
	if err != nil {
		t.Fatal(err)
	}
	updates := make(chan int)
	go func() {
		c := 0
		for range w.ResultChan() {
			c++
		}
		updates <- c
	}()
	plugdCPU, kubeletCPU := cpuTime(t, n.pd.cmd.Process.Pid), cpuTime(t, n.k.Pid())
	from := time.Now()
	time.Sleep(time.Minute) // the window measured, not a wait for something
	to := time.Now()
	stop()
	nodeUpdates := <-updates - 1 // the watch's first event is the Node as it is
	plugdCPU, kubeletCPU = cpuTime(t, n.pd.cmd.Process.Pid)-plugdCPU, cpuTime(t, n.k.Pid())-kubeletCPU
	m1, _ := plugctlMetrics(t, n.pd)
	by, err := auditCount(plugdUser, from, to)
	if err != nil {
		t.Fatal(err)
	}
	beats := 0
	if due := oldest.Add(5 * time.Minute); !oldest.IsZero() && !due.Before(from.Add(-time.Second)) && due.Before(to) {
		beats = 1
	}
	writes := by["create"] + by["update"] + by["patch"] + by["delete"]
	if writes > beats {
		t.Errorf("plugd wrote %d times in an idle minute (%v); want %d (a heartbeat due in it)", writes, by, beats)
	}
	readsOf := func(m, what string) float64 {
		v, _ := metric(m, "plugd_kubelet_reads_total", `what="`+what+`"`, `result="ok"`)
		var f float64
		fmt.Sscan(v, &f)
		return f
	}
	bytesRead := func(m string) float64 {
		v, _ := metric(m, "plugd_kubelet_read_bytes_total")
		var f float64
		fmt.Sscan(v, &f)
		return f
	}
	t.Logf("idle minute: plugd CPU %s, kubelet CPU %s; plugd's API requests %v (writes %d, heartbeats due %d); reads of the kubelet's metrics %.0f (%.0f bytes), of pod-resources %.0f; the kubelet updated the Node %d times",
		plugdCPU, kubeletCPU, by, writes, beats, readsOf(m1, "metrics")-readsOf(m0, "metrics"), bytesRead(m1)-bytesRead(m0),
		readsOf(m1, "pod_resources")-readsOf(m0, "pod_resources"), nodeUpdates)
	if r := readsOf(m1, "metrics") - readsOf(m0, "metrics"); r > 2 {
		t.Errorf("plugd read the kubelet's metrics %.0f times in an idle minute; want at most the resync's", r)
	}

	// One read of the kubelet's /metrics: its CPU, and its size.
	const n20 = 20
	before := cpuTime(t, n.k.Pid())
	size := 0
	for range n20 {
		body, code, err := n.k.Get(ctx, "/metrics", cp.AdminToken)
		if err != nil || code != 200 {
			t.Fatalf("GET /metrics: %d %v", code, err)
		}
		size = len(body)
	}
	perRead := (cpuTime(t, n.k.Pid()) - before) / n20
	mr, _ := plugctlMetrics(t, n.pd)
	wire := bytesRead(mr) / max(1, readsOf(mr, "metrics"))
	t.Logf("one read of the kubelet's /metrics: about %s of its CPU (%d reads), %d bytes, %.0f bytes gzipped as plugd reads it",
		perRead, n20, size, wire)
}

// The figures of docs/kubernetes.md, medians of several runs beside the
// real kubelet: a registration socket's appearance to its condition True,
// and a kubelet's stop to every condition False (and its start to every
// condition True). PLUGD_KUBE_FIGURES=N runs it N times (it is skipped
// otherwise: a few minutes).
func TestKubeletFigures(t *testing.T) {
	runs, _ := strconv.Atoi(os.Getenv("PLUGD_KUBE_FIGURES"))
	if runs <= 0 {
		t.Skip("set PLUGD_KUBE_FIGURES=N to measure, N runs each")
	}
	top := t
	n := newTruthNode(t, "k-figures")
	k := n.k
	n.pd = startPlugd(t, n.dir, n.config)
	n.csi.startDriver(top, "id-a")
	n.csi.startRegistrar(top)
	n.gpu = startHealthPlugin(top, k.RegistryDir, gpuName, 2)
	startDRA(top, k.RegistryDir, filepath.Join(n.dir, "dra"), n.name)
	all := []string{csiCond, gpuCond, draCond}
	for _, c := range all {
		waitCondition(t, n.name, c, corev1.ConditionTrue, "PluginReady")
	}
	median := func(ds []time.Duration) time.Duration {
		s := slices.Clone(ds)
		slices.Sort(s)
		return s[len(s)/2]
	}
	var toTrue, toNotified, toFalse, toTrueAgain []time.Duration
	for range runs {
		n.csi.registrar.signal(syscall.SIGTERM)
		waitCondition(t, n.name, csiCond, corev1.ConditionFalse, "SocketMissing")
		from := time.Now()
		n.csi.startRegistrar(top)
		fi, err := os.Stat(n.csi.socket())
		if err != nil {
			t.Fatal(err)
		}
		made := time.Unix(fi.Sys().(*syscall.Stat_t).Ctim.Unix())
		waitCondition(t, n.name, csiCond, corev1.ConditionTrue, "PluginReady")
		tr := n.conds.since(csiCond, from)
		toTrue = append(toTrue, tr[len(tr)-1].at.Sub(made))
		// When the kubelet told the registrar it registered it.
		for l := range strings.Lines(n.csi.registrar.out.String()) {
			if ts, ok := strings.CutSuffix(strings.TrimSpace(l), " registered"); ok {
				at, err := time.ParseInLocation("15:04:05.000000", ts, time.Local)
				if err == nil {
					y, m, d := made.Date()
					at = time.Date(y, m, d, at.Hour(), at.Minute(), at.Second(), at.Nanosecond(), time.Local)
					toNotified = append(toNotified, at.Sub(made))
				}
				break
			}
		}
	}
	for range runs {
		from := time.Now()
		stopped := from // SIGTERM: the kubelet closes its port, then finishes
		k.Stop()
		for _, c := range all {
			waitCondition(t, n.name, c, corev1.ConditionFalse, "KubeletNotRegistered")
		}
		var last time.Time
		for _, c := range all {
			tr := n.conds.since(c, from)
			last = latest(last, tr[len(tr)-1].at)
		}
		toFalse = append(toFalse, last.Sub(stopped))
		if err := k.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		started := time.Now().Add(-k.StartupTime)
		for _, c := range all {
			waitCondition(t, n.name, c, corev1.ConditionTrue, "PluginReady")
		}
		last = time.Time{}
		for _, c := range all {
			tr := n.conds.since(c, stopped)
			last = latest(last, tr[len(tr)-1].at)
		}
		toTrueAgain = append(toTrueAgain, last.Sub(started))
	}
	t.Logf("%d runs each (medians; all runs):", runs)
	t.Logf("  registration socket made -> its condition True: %s; %v", median(toTrue).Round(time.Millisecond), toTrue)
	if len(toNotified) > 0 {
		t.Logf("  registration socket made -> the kubelet told the registrar it registered it: %s; %v", median(toNotified).Round(time.Millisecond), toNotified)
	}
	t.Logf("  kubelet sent SIGTERM -> every condition False: %s; %v", median(toFalse).Round(time.Millisecond), toFalse)
	t.Logf("  kubelet started -> every condition True:       %s; %v", median(toTrueAgain).Round(time.Millisecond), toTrueAgain)
	m, _ := plugctlMetrics(t, n.pd)
	for line := range strings.Lines(m) {
		if strings.HasPrefix(line, "plugd_kubelet_registration") && (strings.Contains(line, "_sum") || strings.Contains(line, "_count")) {
			t.Logf("  %s", strings.TrimSpace(line))
		}
	}
}

func latest(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}
