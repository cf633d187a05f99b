package pluginmanager_test

import (
	"context"
	"errors"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"

	"github.com/plugd/plugd/internal/testenv"
	"github.com/plugd/plugd/plugin"
	"github.com/plugd/plugd/pluginmanager"
)

// registrar serves a registration socket as node-driver-registrar does for a
// CSI driver: type CSIPlugin, versions ["1.0.0"], the endpoint the driver's own
// socket, and it counts what it is told.
type registrar struct {
	registerapi.UnimplementedRegistrationServer
	endpoint string
	told     atomic.Int32
	last     atomic.Value // *registerapi.RegistrationStatus
}

func (r *registrar) GetInfo(context.Context, *registerapi.InfoRequest) (*registerapi.PluginInfo, error) {
	return &registerapi.PluginInfo{Type: "CSIPlugin", Name: "csi.example.com", Endpoint: r.endpoint, SupportedVersions: []string{"1.0.0"}}, nil
}

func (r *registrar) NotifyRegistrationStatus(_ context.Context, s *registerapi.RegistrationStatus) (*registerapi.RegistrationStatusResponse, error) {
	r.told.Add(1)
	r.last.Store(s)
	return &registerapi.RegistrationStatusResponse{}, nil
}

// An observer beside the manager that registers: it sees every plugin and
// whether it answers, and no plugin hears from it.
func TestObserverBesideARegisteringManager(t *testing.T) {
	const probe = 100 * time.Millisecond
	rec := newRecorder()
	owner := start(t, pluginmanager.Options{}, map[string]pluginmanager.Handler{"CSIPlugin": rec, "example.com/Greeter": rec})
	obs := start(t, pluginmanager.Options{Dir: owner.dir, Observe: true, ProbeInterval: probe}, nil)

	reg := &registrar{endpoint: filepath.Join(testenv.ShortDir(t, "csi"), "csi.sock")}
	regPath := filepath.Join(owner.dir, "csi.example.com-reg.sock")
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: regPath, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	l.SetUnlinkOnClose(false) // killed below: its socket stays, as a crashed registrar's would
	srv := grpc.NewServer()
	registerapi.RegisterRegistrationServer(srv, reg)
	served := make(chan struct{})
	go func() { defer close(served); srv.Serve(l) }()
	t.Cleanup(func() { srv.Stop(); <-served; os.Remove(regPath) })
	greeter := startPlugin(t, plugin.Config{Dir: owner.dir, Type: "example.com/Greeter", Name: "greeter", Versions: []string{"v1"}})

	owner.status(regPath, pluginmanager.StateRegistered)
	owner.status(greeter.Path(), pluginmanager.StateRegistered)
	seen := obs.status(regPath, pluginmanager.StateAnswering)
	if seen.Type != "CSIPlugin" || seen.Name != "csi.example.com" || seen.Endpoint != reg.endpoint {
		t.Errorf("the observer saw %+v", seen.Plugin)
	}
	obs.status(greeter.Path(), pluginmanager.StateAnswering)

	// Several looks later, each plugin was still told once, by its manager.
	obs.pollUntil("three looks at each plugin", func(ps []pluginmanager.PluginStatus) bool {
		n := 0
		for _, p := range ps {
			if p.Attempts >= 3 {
				n++
			}
		}
		return n == 2
	})
	if n := reg.told.Load(); n != 1 {
		t.Errorf("the registrar was told %d times, want once", n)
	}
	if st := reg.last.Load().(*registerapi.RegistrationStatus); !st.PluginRegistered {
		t.Errorf("the registrar was told %+v", st)
	}
	if n := greeter.Notifications(); n != 1 {
		t.Errorf("the SDK plugin was told %d times, want once", n)
	}
	if n := len(rec.Calls()); n != 4 {
		t.Errorf("the owner's handler calls = %q; the observer must call none", rec.Calls())
	}

	// Killed: not answering within one probe interval.
	killed := time.Now()
	srv.Stop()
	<-served
	ev := obs.waitEvent(regPath, pluginmanager.EventNotAnswering)
	if took := ev.Time.Sub(killed); took > probe*11/10+500*time.Millisecond {
		t.Errorf("the observer saw it stop answering %s after the kill, want within a probe interval (%s)", took, probe)
	}
	if ev.State != pluginmanager.StateStale {
		t.Errorf("a socket nobody listens on is %s to the observer, want Stale", ev.State)
	}

	// Removed: gone from the observer too.
	greeter.Close()
	obs.gone(greeter.Path())
}

// snapshot records everything about a directory tree that a writer could
// change: names, types, modes, inodes, sizes and times.
func snapshot(t *testing.T, dir string) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		st := fi.Sys().(*syscall.Stat_t)
		out = append(out, path+" "+fi.Mode().String()+" "+time.Unix(st.Ctim.Unix()).String()+" "+fi.ModTime().String()+
			" ino="+itoa(st.Ino)+" size="+itoa(uint64(fi.Size())))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(out)
	return out
}

func itoa(v uint64) string { return time.Duration(v).String() } // any stable rendering will do

// An observer creates, removes and changes nothing in the directory: not a
// stale socket, not the directory itself if it is missing; and it works when
// it cannot write there at all.
func TestObserverChangesNothing(t *testing.T) {
	dir := testenv.ShortDir(t, "ro")
	live := startPlugin(t, plugin.Config{Dir: dir, Type: "CSIPlugin", Name: "live"})
	staleSocket(t, filepath.Join(dir, "stale.sock"))
	if err := os.Mkdir(filepath.Join(dir, "sub"), 0o750); err != nil {
		t.Fatal(err)
	}
	startPlugin(t, plugin.Config{Dir: filepath.Join(dir, "sub"), Type: "DevicePlugin", Name: "nested"})
	// As read-only as this process can make it: a read-only bind mount where
	// the test may mount (it runs as root in CI), and no write permission.
	readOnlyMount(t, dir)
	if err := os.Chmod(dir, 0o555); err != nil && !errors.Is(err, syscall.EROFS) {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Chmod(dir, 0o700) })
	before := snapshot(t, dir)

	obs := start(t, pluginmanager.Options{Dir: dir, Observe: true, ProbeInterval: 50 * time.Millisecond, RemoveStaleAfter: time.Nanosecond}, nil)
	obs.status(live.Path(), pluginmanager.StateAnswering)
	obs.status(filepath.Join(dir, "stale.sock"), pluginmanager.StateStale)
	obs.pollUntil("several looks at every socket", func(ps []pluginmanager.PluginStatus) bool {
		if len(ps) != 3 {
			return false
		}
		for _, p := range ps {
			if p.Attempts < 3 {
				return false
			}
		}
		return true
	})
	if after := snapshot(t, dir); !equalStrings(before, after) {
		t.Errorf("the observer changed the directory:\nbefore %q\nafter  %q", before, after)
	}

	missing := filepath.Join(testenv.ShortDir(t, "ro"), "not-there")
	m, err := pluginmanager.New(pluginmanager.Options{Dir: missing, Observe: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Run(context.Background()); err == nil {
		t.Error("an observer ran on a missing directory")
	}
	if _, err := os.Stat(missing); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the observer created the missing directory: %v", err)
	}
}

func equalStrings(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// readOnlyMount bind-mounts dir read-only onto itself, where this process may
// mount, and undoes it at the end of the test; elsewhere it logs that it could
// not, and the test relies on permissions and the snapshot.
func readOnlyMount(t *testing.T, dir string) {
	t.Helper()
	if err := syscall.Mount(dir, dir, "", syscall.MS_BIND, ""); err != nil {
		t.Logf("no read-only bind mount here (%v): checking with permissions and a snapshot only", err)
		return
	}
	if err := syscall.Mount("", dir, "", syscall.MS_BIND|syscall.MS_REMOUNT|syscall.MS_RDONLY, ""); err != nil {
		syscall.Unmount(dir, syscall.MNT_DETACH)
		t.Logf("no read-only remount here (%v): checking with permissions and a snapshot only", err)
		return
	}
	t.Cleanup(func() {
		if err := syscall.Unmount(dir, syscall.MNT_DETACH); err != nil {
			t.Errorf("unmounting %s: %v", dir, err)
		}
	})
	if err := os.WriteFile(filepath.Join(dir, "probe"), nil, 0o600); !errors.Is(err, syscall.EROFS) {
		t.Fatalf("the read-only mount accepts writes: %v", err)
	}
}

// looker is an Observer: it counts looks and can say the endpoint is down.
type looker struct {
	looks, forgets atomic.Int32
	down           atomic.Bool
}

func (l *looker) Observe(context.Context, pluginmanager.Plugin) error {
	l.looks.Add(1)
	if l.down.Load() {
		return errors.New("the driver's Probe says not ready")
	}
	return nil
}

func (l *looker) Forget(pluginmanager.Plugin) { l.forgets.Add(1) }

// In observe mode the observer of a type is asked to look, after every
// answered GetInfo, and the type's handler is never asked to validate or
// register.
func TestObserverLooks(t *testing.T) {
	calls := atomic.Int32{}
	handler := pluginmanager.HandlerFuncs{
		ValidateFunc: func(context.Context, pluginmanager.Plugin) error { calls.Add(1); return nil },
		RegisterFunc: func(context.Context, pluginmanager.Plugin) error { calls.Add(1); return nil },
	}
	l := &looker{}
	dir := testenv.ShortDir(t, "ob")
	obs := start(t, pluginmanager.Options{Dir: dir, Observe: true, ProbeInterval: 50 * time.Millisecond}, map[string]pluginmanager.Handler{"CSIPlugin": handler})
	obs.m.AddObserver("CSIPlugin", l)
	p := startPlugin(t, plugin.Config{Dir: dir, Type: "CSIPlugin", Name: "csi"})
	obs.status(p.Path(), pluginmanager.StateAnswering)

	l.down.Store(true)
	ev := obs.waitEvent(p.Path(), pluginmanager.EventNotAnswering)
	if ev.Reason != pluginmanager.ReasonEndpoint || !strings.Contains(ev.Error, "not ready") {
		t.Errorf("event = %+v, want NotAnswering for the endpoint", ev)
	}
	l.down.Store(false)
	obs.waitEvent(p.Path(), pluginmanager.EventAnswering)

	p.Close()
	obs.gone(p.Path())
	if calls.Load() != 0 || l.looks.Load() < 3 || l.forgets.Load() != 1 {
		t.Errorf("validate/register calls %d, looks %d, forgets %d; want 0, at least 3, 1", calls.Load(), l.looks.Load(), l.forgets.Load())
	}
	if n := p.Notifications(); n != 0 {
		t.Errorf("the observed plugin was told %d times", n)
	}
}
