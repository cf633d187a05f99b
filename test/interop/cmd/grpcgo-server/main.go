// Command grpcgo-server is a plugin's registration server written with
// grpc-go as plugd links it, for the interop tests (package interop starts
// it): it serves pluginregistration.Registration on a unix socket and
// reports each call on standard output as a JSON line. SIGTERM stops it
// gracefully.
package main

import (
	"context"
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"syscall"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"

	"github.com/plugd/plugd/test/interop/internal/server"
)

type registration struct {
	registerapi.UnimplementedRegistrationServer
	server.Config
}

func (r *registration) trailer(ctx context.Context) {
	if r.TrailerBytes > 0 {
		grpc.SetTrailer(ctx, metadata.Pairs("x-interop-big", server.BigTrailer(r.TrailerBytes)))
	}
}

func (r *registration) GetInfo(ctx context.Context, _ *registerapi.InfoRequest) (*registerapi.PluginInfo, error) {
	server.Emit("GetInfo", nil)
	r.trailer(ctx)
	return r.Info, nil
}

func (r *registration) NotifyRegistrationStatus(ctx context.Context, st *registerapi.RegistrationStatus) (*registerapi.RegistrationStatusResponse, error) {
	server.Emit("NotifyRegistrationStatus", map[string]any{"registered": st.PluginRegistered, "error": st.Error})
	r.trailer(ctx)
	if r.NotifyError != "" {
		return nil, status.Error(codes.FailedPrecondition, r.NotifyError)
	}
	return &registerapi.RegistrationStatusResponse{}, nil
}

func main() {
	config := server.Flags()
	flag.Parse()
	r := &registration{Config: config()}
	var opts []grpc.ServerOption
	if r.Gzip {
		opts = append(opts, grpc.RPCCompressor(grpc.NewGZIPCompressor())) //nolint:staticcheck // the forcing one, on purpose
	}
	l, err := net.Listen("unix", r.Socket)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	srv := grpc.NewServer(opts...)
	registerapi.RegisterRegistrationServer(srv, r)
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM)
	go func() {
		<-sigs
		srv.GracefulStop()
	}()
	server.Emit("listening", nil)
	if err := srv.Serve(l); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	server.Emit("stopped", nil)
}
