package pluginmanager

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"testing"

	"google.golang.org/grpc"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
)

type benchInfo struct {
	registerapi.UnimplementedRegistrationServer
}

func (benchInfo) GetInfo(context.Context, *registerapi.InfoRequest) (*registerapi.PluginInfo, error) {
	return &registerapi.PluginInfo{Type: "CSIPlugin", Name: "p", SupportedVersions: []string{"1.0.0"}}, nil
}

// serveInfo serves benchInfo with grpc-go at p.sock in dir.
func serveInfo(tb testing.TB, dir string) (path string, srv *grpc.Server) {
	tb.Helper()
	path = filepath.Join(dir, "p.sock")
	l, err := net.Listen("unix", path)
	if err != nil {
		tb.Fatal(err)
	}
	srv = grpc.NewServer()
	registerapi.RegisterRegistrationServer(srv, benchInfo{})
	go srv.Serve(l)
	return path, srv
}

// BenchmarkAsk is the cost of one liveness probe, client and in-process
// server together: GetInfo on the connection the manager holds to each
// registered plugin, and on a new connection, as when the plugin's server
// closed the idle one or as the observer's look does.
func BenchmarkAsk(b *testing.B) {
	dir, err := os.MkdirTemp("", "ask")
	if err != nil {
		b.Fatal(err)
	}
	defer os.RemoveAll(dir)
	path, srv := serveInfo(b, dir)
	defer srv.Stop()
	m, err := New(Options{Dir: dir})
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()

	b.Run("held", func(b *testing.B) {
		_, conn, err := m.client.ask(ctx, &entry{}, path, nil)
		if err != nil {
			b.Fatal(err)
		}
		b.ReportAllocs()
		for b.Loop() {
			if _, conn, err = m.client.ask(ctx, &entry{}, path, conn); err != nil {
				b.Fatal(err)
			}
		}
		conn.Close()
	})
	b.Run("new", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_, conn, err := m.client.ask(ctx, &entry{}, path, nil)
			if err != nil {
				b.Fatal(err)
			}
			conn.Close()
		}
	})
}
