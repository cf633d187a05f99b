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

// transition is a change of one of plugd's conditions on a Node, as a
// watch of the Node saw it.
type transition struct {
	at             time.Time
	cond           string
	status, reason string
}

func (tr transition) String() string { return tr.status + "/" + tr.reason }

// conditionLog records every change of status or reason of plugd's
// conditions on a Node, as a watch delivers them, until the test ends.
type conditionLog struct {
	mu  sync.Mutex
	log []transition
}

func watchConditions(t *testing.T, node string) *conditionLog {
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
		last := map[string]transition{}
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
				if !ok || (ev.Type != watch.Added && ev.Type != watch.Modified) {
					continue
				}
				now := time.Now()
				for _, c := range n.Status.Conditions {
					if !nodecond.Owned(c) {
						continue
					}
					tr := transition{now, string(c.Type), string(c.Status), c.Reason}
					if l, ok := last[tr.cond]; ok && l.status == tr.status && l.reason == tr.reason {
						continue
					}
					last[tr.cond] = tr
					cl.mu.Lock()
					cl.log = append(cl.log, tr)
					cl.mu.Unlock()
				}
			}
			w.Stop()
		}
	}()
	return cl
}

// since is the condition's changes after from, as STATUS/REASON.
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
