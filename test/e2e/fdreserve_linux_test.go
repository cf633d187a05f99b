package e2e

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/peer"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"

	"github.com/plugd/plugd/api"
	"github.com/plugd/plugd/internal/testenv"
	"github.com/plugd/plugd/plugin"
)

// byAddress answers GetInfo with the name of the socket the call came in
// on: one gRPC server for many plugins' sockets, in the test's process, so
// that their descriptors are not plugd's.
type byAddress struct {
	registerapi.UnimplementedRegistrationServer
}

const cheapType = "example.com/Cheap"

func (byAddress) GetInfo(ctx context.Context, _ *registerapi.InfoRequest) (*registerapi.PluginInfo, error) {
	p, _ := peer.FromContext(ctx)
	name := strings.TrimSuffix(filepath.Base(p.LocalAddr.String()), ".sock")
	return &registerapi.PluginInfo{Type: cheapType, Name: name, SupportedVersions: []string{"1.0.0"}}, nil
}

func (byAddress) NotifyRegistrationStatus(context.Context, *registerapi.RegistrationStatus) (*registerapi.RegistrationStatusResponse, error) {
	return &registerapi.RegistrationStatusResponse{}, nil
}

// At a limit of 1024 open files, plugd held a connection to each of a
// thousand plugins, ran out of descriptors, and then no new plugin
// registered: its dial failed with EMFILE, counted as the plugin's failure.
// Now plugd keeps a reserve for new registrations: the plugins beyond it
// are registered and watched by their probes, without a held connection.
func TestPluginRegistersWithFDsShort(t *testing.T) {
	const plugins = 1100
	n, args := newNode(t, "handlers:\n- {type: "+cheapType+", handler: accept}\n", nil)
	n.plugd = startCmd(t, exec.Command("/bin/sh", append([]string{"-c", `ulimit -n 1024 && exec "$@"`, "sh", filepath.Join(bin, "plugd")}, args...)...))
	n.waitReady(t, 10*time.Millisecond)
	s := startSampler(t, n.plugd.cmd.Process.Pid, 1<<30)

	srv := grpc.NewServer()
	registerapi.RegisterRegistrationServer(srv, byAddress{})
	served := make(chan error, plugins)
	for i := range plugins {
		l, err := net.Listen("unix", filepath.Join(n.reg, fmt.Sprintf("cheap-%04d.sock", i)))
		if err != nil {
			t.Fatal(err)
		}
		go func() { served <- srv.Serve(l) }()
	}
	t.Cleanup(func() {
		srv.Stop()
		for range plugins {
			if err := <-served; err != nil && !errors.Is(err, grpc.ErrServerStopped) {
				t.Errorf("serving: %v", err)
			}
		}
	})

	// Every one of them is looked at, and (with the reserve) registered.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var last string
	for {
		ps, err := n.client.Plugins(ctx, api.Filter{Type: cheapType})
		if err != nil {
			t.Fatalf("listing: %v; last: %s; %s\nplugd's log ends:\n%s", err, last, s.figures(), tail(n.plugd.out.String(), 10))
		}
		byState := map[string]int{}
		for _, p := range ps {
			byState[p.State]++
		}
		last = fmt.Sprintf("%d plugins: %v", len(ps), byState)
		if len(ps) == plugins && byState[api.StateRegistered]+byState[api.StateFailed] == plugins {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%d plugins not all looked at: %s; %s\nplugd's log ends:\n%s", plugins, last, s.figures(), tail(n.plugd.out.String(), 10))
		case <-time.After(100 * time.Millisecond): // a poll, bounded by ctx
		}
	}
	t.Logf("at a limit of 1024 open files: %s; %s", last, s.figures())

	p := testenv.StartPlugin(t, plugin.Config{Dir: n.reg, Socket: "late.sock", Type: cheapType, Name: "late", Versions: []string{"1.0.0"}})
	lateCtx, cancel := context.WithTimeout(context.Background(), testenv.Timeout)
	defer cancel()
	if err := p.WaitRegistered(lateCtx); err != nil {
		t.Fatalf("a plugin that came after %d: %v; %s; %s\nplugd's log ends:\n%s", plugins, err, last, s.figures(), tail(n.plugd.out.String(), 10))
	}
	if !strings.Contains(last, fmt.Sprintf("%s:%d", api.StateRegistered, plugins)) {
		t.Errorf("want all %d registered: %s", plugins, last)
	}

	_, metrics := n.get(t, "/metrics")
	held, hits := metricValue(metrics, "plugd_held_connections"), metricValue(metrics, "plugd_fd_reserve_hits_total")
	t.Logf("plugd_held_connections %v, plugd_fd_reserve_hits_total %v, plugd_fd_exhausted_total %v", held, hits, metricValue(metrics, "plugd_fd_exhausted_total"))
	if held <= 0 || held > 1024-128 || hits <= 0 {
		t.Errorf("plugd_held_connections %v, plugd_fd_reserve_hits_total %v: want some connections held, at most 1024 less the reserve of 128, and the rest not", held, hits)
	}
	if !strings.Contains(n.plugd.out.String(), "file descriptors are short") {
		t.Error("plugd did not say that it holds no more connections for want of file descriptors")
	}
	s.finish()
	if code := n.plugd.stop(t, syscall.SIGTERM); code != 0 {
		t.Errorf("plugd exit code %d", code)
	}
}

// metricValue is the value of a metric without labels in an exposition, -1
// if it is not there.
func metricValue(exposition, name string) float64 {
	for line := range strings.Lines(exposition) {
		if v, ok := strings.CutPrefix(line, name+" "); ok {
			f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			if err == nil {
				return f
			}
		}
	}
	return -1
}
