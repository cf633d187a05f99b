package unaryconn

import (
	"context"
	"net"
	"path/filepath"
	"testing"

	"google.golang.org/grpc"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"

	"github.com/plugd/plugd/internal/testenv"
)

// registration is a plugin's registration service.
type registration struct {
	registerapi.UnimplementedRegistrationServer
	getInfo func(context.Context) (*registerapi.PluginInfo, error)
	notify  func(context.Context, *registerapi.RegistrationStatus) error
}

func (r registration) GetInfo(ctx context.Context, _ *registerapi.InfoRequest) (*registerapi.PluginInfo, error) {
	if r.getInfo != nil {
		return r.getInfo(ctx)
	}
	return &registerapi.PluginInfo{Type: "CSIPlugin", Name: "p", SupportedVersions: []string{"1.0.0"}}, nil
}

func (r registration) NotifyRegistrationStatus(ctx context.Context, st *registerapi.RegistrationStatus) (*registerapi.RegistrationStatusResponse, error) {
	if r.notify != nil {
		if err := r.notify(ctx, st); err != nil {
			return nil, err
		}
	}
	return &registerapi.RegistrationStatusResponse{}, nil
}

// serve runs a grpc-go server of r on a unix socket until the test ends and
// returns the socket's path.
func serve(tb testing.TB, r registration, opts ...grpc.ServerOption) string {
	tb.Helper()
	srv, path := newServer(tb, r, opts...)
	tb.Cleanup(srv.Stop)
	return path
}

func newServer(tb testing.TB, r registration, opts ...grpc.ServerOption) (*grpc.Server, string) {
	tb.Helper()
	path := filepath.Join(testenv.ShortDir(tb, "unaryconn"), "p.sock")
	l, err := net.Listen("unix", path)
	if err != nil {
		tb.Fatal(err)
	}
	srv := grpc.NewServer(opts...)
	registerapi.RegisterRegistrationServer(srv, r)
	go srv.Serve(l)
	return srv, path
}
