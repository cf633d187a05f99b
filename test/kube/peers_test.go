//go:build linux

package kube

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"
	dpapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/plugd/plugd/internal/nodecond"
	"github.com/plugd/plugd/internal/testenv"
	"github.com/plugd/plugd/plugin"
)

// proc is a test peer running as a process (testplugin), so that it can be
// killed as a container's process is.
type proc struct {
	name string
	cmd  *exec.Cmd
	out  *testenv.Buffer
	done chan struct{}
}

// startProc runs testplugin with args until the test ends.
func startProc(t *testing.T, name string, args ...string) *proc {
	t.Helper()
	p := &proc{name: name, out: &testenv.Buffer{}, done: make(chan struct{})}
	p.cmd = exec.Command(filepath.Join(dirs.Bin, "testplugin"), args...)
	p.cmd.Stdout, p.cmd.Stderr = p.out, p.out
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		p.cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		p.signal(syscall.SIGKILL)
		if t.Failed() {
			t.Logf("%s's log:\n%s", name, p.out)
		}
	})
	return p
}

// signal sends sig and waits for the process to end.
func (p *proc) signal(sig syscall.Signal) {
	select {
	case <-p.done:
		return
	default:
	}
	p.cmd.Process.Signal(sig)
	select {
	case <-p.done:
	case <-time.After(wait):
		p.cmd.Process.Kill()
		<-p.done
	}
}

// exited waits for the process to end by itself, and returns its status.
func (p *proc) exited(t *testing.T) int {
	t.Helper()
	select {
	case <-p.done:
		return p.cmd.ProcessState.ExitCode()
	case <-time.After(wait):
		t.Fatalf("%s did not exit: %s", p.name, p.out)
		return 0
	}
}

// csiPeer is a CSI driver and its node-driver-registrar, as processes.
type csiPeer struct {
	t                  *testing.T
	endpoint, registry string
	driver, registrar  *proc
}

func newCSIPeer(t *testing.T, dir, registry string) *csiPeer {
	return &csiPeer{t: t, endpoint: filepath.Join(dir, "csi.sock"), registry: registry}
}

// startDriver starts the CSI driver, answering nodeID (and the topology
// topology.example.com/node=nodeID), and waits for its socket.
func (c *csiPeer) startDriver(t *testing.T, nodeID string) {
	t.Helper()
	os.Remove(c.endpoint)
	c.driver = startProc(c.t, "csi driver", "csi", "--endpoint", c.endpoint, "--name", csiName, "--node-id", nodeID, "--topology-key", topologyKey)
	eventually(t, "the CSI driver's socket", func() (bool, string) {
		_, err := os.Stat(c.endpoint)
		return err == nil, fmt.Sprint(err)
	})
}

// startRegistrar starts node-driver-registrar's stand-in, and waits until
// it serves its registration socket.
func (c *csiPeer) startRegistrar(t *testing.T) *proc {
	t.Helper()
	c.registrar = startProc(c.t, "registrar", "registrar", "--csi-address", c.endpoint, "--plugin-registration-path", c.registry,
		"--kubelet-registration-path", c.endpoint)
	eventually(t, "the registrar serving", func() (bool, string) {
		return strings.Contains(c.registrar.out.String(), "serving "), c.registrar.out.String()
	})
	return c.registrar
}

// socket is the registrar's registration socket.
func (c *csiPeer) socket() string { return filepath.Join(c.registry, csiName+"-reg.sock") }

// healthPlugin is a device plugin (k8s.io/kubelet's deviceplugin v1beta1)
// whose devices' health the test sets.
type healthPlugin struct {
	dpapi.UnimplementedDevicePluginServer
	devices int

	mu      sync.Mutex
	healthy int
	changed chan struct{} // closed and replaced at each change
}

func (d *healthPlugin) GetDevicePluginOptions(context.Context, *dpapi.Empty) (*dpapi.DevicePluginOptions, error) {
	return &dpapi.DevicePluginOptions{}, nil
}

func (d *healthPlugin) list() (*dpapi.ListAndWatchResponse, chan struct{}) {
	d.mu.Lock()
	defer d.mu.Unlock()
	var devs []*dpapi.Device
	for i := range d.devices {
		h := dpapi.Healthy
		if i >= d.healthy {
			h = dpapi.Unhealthy
		}
		devs = append(devs, &dpapi.Device{ID: fmt.Sprintf("gpu-%d", i), Health: h})
	}
	return &dpapi.ListAndWatchResponse{Devices: devs}, d.changed
}

func (d *healthPlugin) ListAndWatch(_ *dpapi.Empty, s grpc.ServerStreamingServer[dpapi.ListAndWatchResponse]) error {
	for {
		r, changed := d.list()
		if err := s.Send(r); err != nil {
			return err
		}
		select {
		case <-changed:
		case <-s.Context().Done():
			return nil
		}
	}
}

// setHealthy makes n of the devices healthy, and tells every stream.
func (d *healthPlugin) setHealthy(n int) {
	d.mu.Lock()
	d.healthy = n
	close(d.changed)
	d.changed = make(chan struct{})
	d.mu.Unlock()
}

// startHealthPlugin registers a device plugin of resource with devices
// healthy devices in reg.
func startHealthPlugin(t *testing.T, reg, resource string, devices int) *healthPlugin {
	t.Helper()
	d := &healthPlugin{devices: devices, healthy: devices, changed: make(chan struct{})}
	testenv.StartPlugin(t, plugin.Config{Dir: reg, Socket: "gpu.sock", Type: "DevicePlugin", Name: resource, Versions: []string{"v1beta1"},
		Services: func(s grpc.ServiceRegistrar) { dpapi.RegisterDevicePluginServer(s, d) }})
	return d
}

// transition is a write of one of plugd's conditions on a Node (a change of
// its status, reason or message), or its going with the Node, as a watch of
// the Node saw it.
type transition struct {
	at                      time.Time
	cond                    string
	status, reason, message string
	// held is, for a write of True, whether the kubelet held the plugin's
	// socket when the watch brought the write (the probe's answer).
	held bool
}

// String is STATUS/REASON, or Absent where the Node went (and the
// condition with it) or came back without it.
func (tr transition) String() string {
	if tr.status == "" {
		return "Absent"
	}
	return tr.status + "/" + tr.reason
}

// conditionLog records every write of plugd's conditions on a Node, as a
// watch delivers them, until the test ends. A write that changes only
// lastHeartbeatTime is a heartbeat: counted apart, not a transition.
type conditionLog struct {
	mu    sync.Mutex
	log   []transition
	beats []time.Time // Node updates that were only plugd's heartbeats
}

// watchConditions records node's conditions. probe, if not nil, is asked
// for each write of True whether the kubelet holds the condition's plugin;
// it runs on the watch's goroutine, at once, before the next update.
func watchConditions(t *testing.T, node string, probe func(cond string) bool) *conditionLog {
	t.Helper()
	cl := &conditionLog{}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	t.Cleanup(func() {
		cancel()
		<-done
	})
	go func() {
		defer close(done)
		last := map[string]corev1.NodeCondition{}
		for ctx.Err() == nil {
			w, err := admin.CoreV1().Nodes().Watch(ctx, metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("metadata.name", node).String()})
			if err != nil {
				select {
				case <-ctx.Done():
				case <-time.After(100 * time.Millisecond): // the API server restarting: watch again
				}
				continue
			}
			for ev := range w.ResultChan() {
				n, ok := ev.Object.(*corev1.Node)
				if !ok || (ev.Type != watch.Added && ev.Type != watch.Modified && ev.Type != watch.Deleted) {
					continue
				}
				now := time.Now()
				var trs []transition
				beat := false
				seen := map[string]bool{}
				for _, c := range n.Status.Conditions {
					if !nodecond.Owned(c) || ev.Type == watch.Deleted {
						continue
					}
					typ := string(c.Type)
					seen[typ] = true
					l, had := last[typ]
					last[typ] = c
					if had && l.Status == c.Status && l.Reason == c.Reason && l.Message == c.Message {
						beat = beat || !l.LastHeartbeatTime.Equal(&c.LastHeartbeatTime)
						continue
					}
					tr := transition{at: now, cond: typ, status: string(c.Status), reason: c.Reason, message: c.Message}
					if probe != nil && c.Status == corev1.ConditionTrue {
						tr.held = probe(typ)
					}
					trs = append(trs, tr)
				}
				for typ := range last {
					if !seen[typ] {
						delete(last, typ)
						trs = append(trs, transition{at: now, cond: typ})
					}
				}
				cl.mu.Lock()
				cl.log = append(cl.log, trs...)
				if beat && len(trs) == 0 {
					cl.beats = append(cl.beats, now)
				}
				cl.mu.Unlock()
			}
			w.Stop()
		}
	}()
	return cl
}

// since is the condition's writes after from.
func (cl *conditionLog) since(cond string, from time.Time) []transition {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	var out []transition
	for _, tr := range cl.log {
		if tr.cond == cond && tr.at.After(from) {
			out = append(out, tr)
		}
	}
	return out
}

// last is the condition's last write (or going), if the log has one.
func (cl *conditionLog) last(cond string) (transition, bool) {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	for i := len(cl.log) - 1; i >= 0; i-- {
		if cl.log[i].cond == cond {
			return cl.log[i], true
		}
	}
	return transition{}, false
}

// beatsSince counts the Node updates after from that were only heartbeats
// of plugd's conditions.
func (cl *conditionLog) beatsSince(from time.Time) int {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	n := 0
	for _, at := range cl.beats {
		if at.After(from) {
			n++
		}
	}
	return n
}

// occurrence is one occurrence of an event of plugd's about a Node, as it
// reached the API (a new event, or a series counting up).
type occurrence struct {
	at                   time.Time
	reason, action, note string
}

// String is REASON ACTION, without the action's "Check ".
func (o occurrence) String() string {
	return o.reason + " " + strings.TrimPrefix(o.action, "Check ")
}

// eventLog records every occurrence of plugd's events about a Node that
// reaches the API, as a watch of events.k8s.io delivers them, until the
// test ends: an event created is one, a series whose count goes from n to
// m is m-n more (client-go writes the second occurrence of a series at
// once, later ones when the series ends or is refreshed).
type eventLog struct {
	mu   sync.Mutex
	log  []occurrence
	more chan struct{} // closed and replaced with each occurrence
}

func watchEvents(t *testing.T, node string) *eventLog {
	t.Helper()
	el := &eventLog{more: make(chan struct{})}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	t.Cleanup(func() {
		cancel()
		<-done
	})
	counts := map[string]int32{} // by event name: occurrences seen
	// note records e's occurrences not seen yet.
	note := func(e *eventsv1.Event) {
		if e.ReportingController != "plugd" {
			return
		}
		// A new event: when plugd recorded it (its own clock, the test's
		// machine's), as it reaches the API a moment after; a series
		// counting up: when the API has it.
		c, at := seriesCount(e), e.EventTime.Time
		if c > 1 || at.IsZero() {
			at = time.Now()
		}
		el.mu.Lock()
		if c > counts[e.Name] {
			for range c - counts[e.Name] {
				el.log = append(el.log, occurrence{at, e.Reason, e.Action, e.Note})
			}
			close(el.more)
			el.more = make(chan struct{})
		}
		el.mu.Unlock()
		counts[e.Name] = max(c, counts[e.Name])
	}
	list := func(ctx context.Context) (string, error) {
		l, err := admin.EventsV1().Events("default").List(ctx, metav1.ListOptions{FieldSelector: "regarding.name=" + node})
		if err != nil {
			return "", err
		}
		for i := range l.Items {
			note(&l.Items[i])
		}
		return l.ResourceVersion, nil
	}
	// The events before the log are not its.
	l, err := admin.EventsV1().Events("default").List(ctx, metav1.ListOptions{FieldSelector: "regarding.name=" + node})
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range l.Items {
		counts[e.Name] = seriesCount(&e)
	}
	rv := l.ResourceVersion
	go func() {
		defer close(done)
		var err error
		for ctx.Err() == nil {
			if rv == "" {
				// After an error (the API server restarted, the
				// version too old): what came meanwhile is in a list.
				if rv, err = list(ctx); err != nil {
					select {
					case <-ctx.Done():
					case <-time.After(100 * time.Millisecond): // the API server restarting: list again
					}
					continue
				}
			}
			w, werr := admin.EventsV1().Events("default").Watch(ctx, metav1.ListOptions{FieldSelector: "regarding.name=" + node, ResourceVersion: rv})
			if werr != nil {
				rv = ""
				continue
			}
			for ev := range w.ResultChan() {
				e, ok := ev.Object.(*eventsv1.Event)
				if ev.Type == watch.Error {
					rv = ""
					break
				}
				if !ok || (ev.Type != watch.Added && ev.Type != watch.Modified) {
					continue
				}
				rv = e.ResourceVersion
				note(e)
			}
			w.Stop()
		}
	}()
	return el
}

// seriesCount is how many occurrences an event stands for.
func seriesCount(e *eventsv1.Event) int32 {
	if e.Series != nil {
		return e.Series.Count
	}
	return 1
}

// changed is closed with the next occurrence.
func (el *eventLog) changed() <-chan struct{} {
	el.mu.Lock()
	defer el.mu.Unlock()
	return el.more
}

// since is the occurrences since from that reached the API.
func (el *eventLog) since(from time.Time) []occurrence {
	el.mu.Lock()
	defer el.mu.Unlock()
	var out []occurrence
	for _, o := range el.log {
		if o.at.After(from) {
			out = append(out, o)
		}
	}
	return out
}

// cpuTime is the CPU a process has used so far (user and system), from
// /proc.
func cpuTime(t *testing.T, pid int) time.Duration {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatal(err)
	}
	// The fields after the command (in parentheses, which may hold spaces).
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+2:]))
	utime, _ := strconv.ParseInt(f[11], 10, 64)
	stime, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(utime+stime) * time.Second / 100 // USER_HZ
}
