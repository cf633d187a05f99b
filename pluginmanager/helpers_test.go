package pluginmanager_test

import (
	"errors"
	"os"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	testingclock "k8s.io/utils/clock/testing"

	"github.com/plugd/plugd/internal/testenv"
	"github.com/plugd/plugd/plugin"
	"github.com/plugd/plugd/pluginmanager"
	"github.com/plugd/plugd/plugintest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// harness is a running manager (plugintest's), with its own subscription
// for the tests that read the event stream themselves.
type harness struct {
	*plugintest.Manager
	t   *testing.T
	m   *pluginmanager.Manager
	dir string
	sub *pluginmanager.Subscription
}

// start runs a manager on dir (a fresh one if empty) with fast test timings,
// adds handlers by type, and stops it at the end of the test, checking that
// Run returned.
func start(t *testing.T, opts pluginmanager.Options, handlers map[string]pluginmanager.Handler) *harness {
	t.Helper()
	if opts.Dir == "" {
		opts.Dir = testenv.ShortDir(t, "pm")
	}
	pm := plugintest.NewManagerWith(t, opts, handlers)
	pm.Timeout = testenv.Timeout
	return &harness{Manager: pm, t: t, m: pm.Manager(), dir: pm.Dir, sub: pm.Manager().Subscribe()}
}

// pastBindGrace is more time than the manager gives a socket that just
// appeared and refuses connections (bound, not listening yet) before it
// counts as Stale.
const pastBindGrace = 3 * time.Second

// fakeClock is a fake clock at the time now, for a manager whose time the
// test moves.
func fakeClock() *testingclock.FakeClock { return testingclock.NewFakeClock(time.Now()) }

// told waits for the plugin's next status from the manager.
func told(t *testing.T, c <-chan plugin.Status) plugin.Status {
	t.Helper()
	select {
	case st := <-c:
		return st
	case <-time.After(testenv.Timeout):
		t.Fatal("timed out waiting for the manager to notify the plugin")
		return plugin.Status{}
	}
}

// statuses returns an OnStatus callback and the channel it feeds.
func statuses() (func(plugin.Status), <-chan plugin.Status) {
	c := make(chan plugin.Status, 100)
	return func(st plugin.Status) { c <- st }, c
}

// calls are rec's calls as "op name", in order.
func calls(rec *plugintest.Recorder) []string {
	var out []string
	for _, c := range rec.Calls() {
		out = append(out, c.Op+" "+c.Plugin.Name)
	}
	return out
}

// serveRaw serves srv's services on a socket at path, for plugins the SDK will
// not let us write: hanging, lying or not serving Registration at all.
func serveRaw(t *testing.T, path string, register func(*grpc.Server), opts ...grpc.ServerOption) *grpc.Server {
	t.Helper()
	l := testenv.ListenUnix(t, path)
	srv := grpc.NewServer(opts...)
	if register != nil {
		register(srv)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := srv.Serve(l); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			t.Errorf("serve %s: %v", path, err)
		}
	}()
	t.Cleanup(func() {
		srv.Stop()
		<-done
	})
	return srv
}

// renameOver moves a socket into place over an old one, as a restarting
// plugin using the SDK does.
func renameOver(from, to string) error { return os.Rename(from, to) }

// statPath reports whether anything is at path.
func statPath(path string) (os.FileInfo, bool) {
	fi, err := os.Lstat(path)
	return fi, err == nil
}

// counterFrom reads a counter without labels from reg, as a collector.
func counterFrom(t *testing.T, reg *prometheus.Registry, name string) prometheus.Collector {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	c := prometheus.NewCounter(prometheus.CounterOpts{Name: name, Help: name})
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.Metric) == 1 {
			c.Add(mf.Metric[0].GetCounter().GetValue())
		}
	}
	return c
}
