//go:build unix

package pluginmanager_test

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/peer"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"

	"github.com/plugd/plugd/internal/testenv"
	"github.com/plugd/plugd/pluginmanager"
)

// byAddress answers GetInfo with the name of the socket the call came in on:
// one server for many plugins' sockets.
type byAddress struct {
	registerapi.UnimplementedRegistrationServer
}

func (byAddress) GetInfo(ctx context.Context, _ *registerapi.InfoRequest) (*registerapi.PluginInfo, error) {
	p, _ := peer.FromContext(ctx)
	name := strings.TrimSuffix(filepath.Base(p.LocalAddr.String()), ".sock")
	return &registerapi.PluginInfo{Type: "CSIPlugin", Name: name, SupportedVersions: []string{"1.0.0"}}, nil
}

func (byAddress) NotifyRegistrationStatus(context.Context, *registerapi.RegistrationStatus) (*registerapi.RegistrationStatusResponse, error) {
	return &registerapi.RegistrationStatusResponse{}, nil
}

// slowStart starts a plugin at path as many servers do, bind then listen,
// with up to maxGap between them (the socket file exists, refusing
// connections, meanwhile), serving on srv. stop removes its socket and
// closes its listener, as a plugin that shuts down does.
func slowStart(t testing.TB, srv *grpc.Server, path string, maxGap time.Duration) (stop func()) {
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM, 0)
	if err != nil {
		t.Error(err)
		return func() {}
	}
	unix.CloseOnExec(fd)
	if err := unix.Bind(fd, &unix.SockaddrUnix{Name: path}); err != nil {
		unix.Close(fd)
		t.Error(err)
		return func() {}
	}
	time.Sleep(rand.N(maxGap)) // the plugin's own start-up between bind and listen, not a wait for the manager
	if err := unix.Listen(fd, 128); err != nil {
		unix.Close(fd)
		t.Error(err)
		return func() {}
	}
	f := os.NewFile(uintptr(fd), path)
	l, err := net.FileListener(f)
	f.Close()
	if err != nil {
		t.Error(err)
		return func() {}
	}
	go srv.Serve(l)
	return func() {
		os.Remove(path)
		l.Close()
	}
}

// Plugins whose sockets appear a moment before they listen, 2,000 of them,
// started and restarted for a minute: healthy plugins, each of which the
// manager must register without a warning or a Failed event, however its
// first connection falls in the gap between bind and listen.
func TestBindBeforeListenChurn(t *testing.T) {
	const (
		plugins = 2000
		maxGap  = 20 * time.Millisecond
	)
	duration := time.Minute
	if d, err := time.ParseDuration(os.Getenv("PLUGD_CHURN_DURATION")); err == nil {
		duration = d // for a quicker look while working on it
	}
	var logs testenv.Buffer
	quiet := &countingLog{Handler: slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn}), msg: "not listening yet"}
	h := start(t, pluginmanager.Options{
		Logger:      slog.New(quiet),
		EventBuffer: 1 << 20,
	}, map[string]pluginmanager.Handler{"CSIPlugin": pluginmanager.HandlerFuncs{}})
	h.Timeout = 2 * time.Minute
	failures := watchFailures(h.m)

	srv := grpc.NewServer()
	registerapi.RegisterRegistrationServer(srv, byAddress{})
	defer srv.Stop()
	paths := make([]string, plugins)
	stops := make([]func(), plugins)
	var wg sync.WaitGroup
	sem := make(chan struct{}, 64) // plugins starting at once
	for i := range plugins {
		paths[i] = filepath.Join(h.dir, fmt.Sprintf("p%04d.sock", i))
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			stops[i] = slowStart(t, srv, paths[i], maxGap)
		})
	}
	wg.Wait()

	// Restart plugins, one after another, at random, for the duration.
	restarts := 0
	for end := time.Now().Add(duration); time.Now().Before(end); restarts++ {
		i := rand.N(plugins)
		stops[i]()
		stops[i] = slowStart(t, srv, paths[i], maxGap)
	}
	registered := func(ps []pluginmanager.PluginStatus) bool {
		n := 0
		for _, s := range ps {
			if s.State == pluginmanager.StateRegistered {
				n++
			}
		}
		return n == plugins
	}
	h.Until(fmt.Sprintf("%d plugins registered", plugins), registered)
	h.Stop()
	failed, lost := failures()
	for i := range stops {
		stops[i]()
	}
	t.Logf("%d plugins, %d restarts over %s; %d connections refused between bind and listen, retried quietly", plugins, restarts, duration, quiet.n.Load())
	if quiet.n.Load() == 0 {
		t.Error("no connection fell between a bind and a listen: this tested nothing")
	}
	if lost > 0 {
		t.Errorf("%d events lost: the test cannot tell what it missed", lost)
	}
	for i, ev := range failed {
		if i < 10 {
			t.Errorf("event %s %s %s (%s) for a healthy plugin", ev.Type, ev.State, ev.Plugin.Socket, ev.Error)
		}
	}
	if len(failed) > 0 {
		t.Errorf("%d Failed, Rejected or Stale events in all", len(failed))
	}
	if w := logs.String(); w != "" {
		t.Errorf("warnings (%d lines); the first:\n%s", strings.Count(w, "\n"), firstLines(w, 10))
	}
}

// watchFailures collects the Failed, Rejected and Stale events of m, and
// counts the events lost; the function it returns waits for the stream
// to end (m's Run to return) and returns them.
func watchFailures(m *pluginmanager.Manager) func() (failed []pluginmanager.Event, lost int) {
	sub := m.Subscribe()
	var failed []pluginmanager.Event
	var lost int
	seen := make(chan struct{})
	go func() {
		defer close(seen)
		for ev := range sub.Events() {
			switch {
			case ev.Type == pluginmanager.EventLost:
				lost += ev.Missed
			case ev.Type == pluginmanager.EventFailed, ev.Type == pluginmanager.EventRejected, ev.State == pluginmanager.StateStale:
				failed = append(failed, ev)
			}
		}
	}()
	return func() ([]pluginmanager.Event, int) {
		<-seen
		return failed, lost
	}
}

// countingLog is a slog handler that counts the debug records whose message
// has msg, and passes the rest to Handler.
type countingLog struct {
	slog.Handler
	msg string
	n   atomic.Int64
}

func (c *countingLog) Enabled(ctx context.Context, l slog.Level) bool {
	return l == slog.LevelDebug || c.Handler.Enabled(ctx, l)
}

func (c *countingLog) Handle(ctx context.Context, r slog.Record) error {
	if r.Level == slog.LevelDebug {
		if strings.Contains(r.Message, c.msg) {
			c.n.Add(1)
		}
		return nil
	}
	return c.Handler.Handle(ctx, r)
}

func firstLines(s string, n int) string {
	lines := strings.SplitN(s, "\n", n+1)
	return strings.Join(lines[:min(n, len(lines))], "\n")
}
