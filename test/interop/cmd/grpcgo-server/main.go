// Command grpcgo-server is a plugin's registration server written with
// grpc-go as plugd links it, for the interop tests (package interop starts
// it): it serves pluginregistration.Registration on a unix socket and
// reports each call on standard output as a JSON line. SIGTERM stops it
// gracefully.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
)

type server struct {
	registerapi.UnimplementedRegistrationServer
	info         *registerapi.PluginInfo
	trailerBytes int
	notifyError  string
}

var out struct {
	sync.Mutex
	enc *json.Encoder
}

func emit(ev map[string]any) {
	out.Lock()
	defer out.Unlock()
	out.enc.Encode(ev)
}

func (s *server) trailer(ctx context.Context) {
	if s.trailerBytes > 0 {
		grpc.SetTrailer(ctx, metadata.Pairs("x-interop-big", strings.Repeat("{}", s.trailerBytes/2))) // what Huffman coding does not shorten
	}
}

func (s *server) GetInfo(ctx context.Context, _ *registerapi.InfoRequest) (*registerapi.PluginInfo, error) {
	emit(map[string]any{"event": "GetInfo"})
	s.trailer(ctx)
	return s.info, nil
}

func (s *server) NotifyRegistrationStatus(ctx context.Context, st *registerapi.RegistrationStatus) (*registerapi.RegistrationStatusResponse, error) {
	emit(map[string]any{"event": "NotifyRegistrationStatus", "registered": st.PluginRegistered, "error": st.Error})
	s.trailer(ctx)
	if s.notifyError != "" {
		return nil, status.Error(codes.FailedPrecondition, s.notifyError)
	}
	return &registerapi.RegistrationStatusResponse{}, nil
}

func main() {
	out.enc = json.NewEncoder(os.Stdout)
	socket := flag.String("socket", "", "unix socket to listen on")
	typ := flag.String("type", "CSIPlugin", "PluginInfo.type")
	name := flag.String("name", "interop.example.com", "PluginInfo.name")
	endpoint := flag.String("endpoint", "", "PluginInfo.endpoint")
	versions := flag.String("versions", "", "PluginInfo.supported_versions, comma-separated")
	gzip := flag.Bool("gzip", false, "compress every answer with gzip, whatever the client offers")
	trailerBytes := flag.Int("trailer-bytes", 0, "a trailer of this many bytes on every answer")
	notifyError := flag.String("notify-error", "", "answer NotifyRegistrationStatus with this error")
	flag.Parse()

	s := &server{
		info:         &registerapi.PluginInfo{Type: *typ, Name: *name, Endpoint: *endpoint},
		trailerBytes: *trailerBytes,
		notifyError:  *notifyError,
	}
	if *versions != "" {
		s.info.SupportedVersions = strings.Split(*versions, ",")
	}
	var opts []grpc.ServerOption
	if *gzip {
		opts = append(opts, grpc.RPCCompressor(grpc.NewGZIPCompressor())) //nolint:staticcheck // the forcing one, on purpose
	}
	l, err := net.Listen("unix", *socket)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	srv := grpc.NewServer(opts...)
	registerapi.RegisterRegistrationServer(srv, s)
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM)
	go func() {
		<-sigs
		srv.GracefulStop()
	}()
	emit(map[string]any{"event": "listening"})
	if err := srv.Serve(l); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	emit(map[string]any{"event": "stopped"})
}
