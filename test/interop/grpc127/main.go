// Command grpc127 is a plugin's registration server written with grpc-go
// v1.27.1 (January 2020, the vintage of node-driver-registrar v1.3), for
// the interop tests (package interop starts it). It is a module of its own
// so that the main module's grpc stays current.
//
// k8s.io/kubelet's generated code needs a newer grpc, so the service is
// declared here by hand, with a codec that hands the handlers the raw
// message and protowire to read and write the registration's few fields.
package main

import (
	"context"
	"encoding/json"
	"errors"
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
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
)

// raw is a message as it is on the wire.
type raw []byte

// codec replaces grpc's "proto" codec: messages are raw.
type codec struct{}

func (codec) Name() string { return "proto" }

func (codec) Marshal(v interface{}) ([]byte, error) {
	m, ok := v.(raw)
	if !ok {
		return nil, fmt.Errorf("cannot marshal %T", v)
	}
	return m, nil
}

func (codec) Unmarshal(data []byte, v interface{}) error {
	m, ok := v.(*raw)
	if !ok {
		return fmt.Errorf("cannot unmarshal into %T", v)
	}
	*m = append((*m)[:0], data...)
	return nil
}

var out struct {
	sync.Mutex
	enc *json.Encoder
}

func emit(ev map[string]interface{}) {
	out.Lock()
	defer out.Unlock()
	out.enc.Encode(ev)
}

type config struct {
	info         raw // PluginInfo, encoded
	trailerBytes int
	notifyError  string
}

func (c *config) trailer(ctx context.Context) {
	if c.trailerBytes > 0 {
		grpc.SetTrailer(ctx, metadata.Pairs("x-interop-big", strings.Repeat("{}", c.trailerBytes/2))) // what Huffman coding does not shorten
	}
}

func (c *config) getInfo(ctx context.Context, _ raw) (raw, error) {
	emit(map[string]interface{}{"event": "GetInfo"})
	c.trailer(ctx)
	return c.info, nil
}

func (c *config) notify(ctx context.Context, req raw) (raw, error) {
	// RegistrationStatus{plugin_registered = 1 (bool), error = 2 (string)}
	var registered bool
	var reason string
	for b := req; len(b) > 0; {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return nil, status.Error(codes.InvalidArgument, "malformed RegistrationStatus")
		}
		b = b[n:]
		switch {
		case num == 1 && typ == protowire.VarintType:
			v, n := protowire.ConsumeVarint(b)
			if n < 0 {
				return nil, status.Error(codes.InvalidArgument, "malformed plugin_registered")
			}
			registered, b = v != 0, b[n:]
		case num == 2 && typ == protowire.BytesType:
			v, n := protowire.ConsumeBytes(b)
			if n < 0 {
				return nil, status.Error(codes.InvalidArgument, "malformed error")
			}
			reason, b = string(v), b[n:]
		default:
			n := protowire.ConsumeFieldValue(num, typ, b)
			if n < 0 {
				return nil, status.Error(codes.InvalidArgument, "malformed RegistrationStatus")
			}
			b = b[n:]
		}
	}
	emit(map[string]interface{}{"event": "NotifyRegistrationStatus", "registered": registered, "error": reason})
	c.trailer(ctx)
	if c.notifyError != "" {
		return nil, status.Error(codes.FailedPrecondition, c.notifyError)
	}
	return raw{}, nil
}

func unary(f func(*config, context.Context, raw) (raw, error)) func(interface{}, context.Context, func(interface{}) error, grpc.UnaryServerInterceptor) (interface{}, error) {
	return func(srv interface{}, ctx context.Context, dec func(interface{}) error, _ grpc.UnaryServerInterceptor) (interface{}, error) {
		var in raw
		if err := dec(&in); err != nil {
			return nil, err
		}
		return f(srv.(*config), ctx, in)
	}
}

var service = grpc.ServiceDesc{
	ServiceName: "pluginregistration.Registration",
	HandlerType: (*interface{})(nil),
	Methods: []grpc.MethodDesc{
		{MethodName: "GetInfo", Handler: unary((*config).getInfo)},
		{MethodName: "NotifyRegistrationStatus", Handler: unary((*config).notify)},
	},
	Metadata: "api.proto",
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

	// PluginInfo{type = 1, name = 2, endpoint = 3, repeated supported_versions = 4}
	var info []byte
	for i, v := range []string{*typ, *name, *endpoint} {
		if v != "" {
			info = protowire.AppendTag(info, protowire.Number(i+1), protowire.BytesType)
			info = protowire.AppendString(info, v)
		}
	}
	if *versions != "" {
		for _, v := range strings.Split(*versions, ",") {
			info = protowire.AppendTag(info, 4, protowire.BytesType)
			info = protowire.AppendString(info, v)
		}
	}
	encoding.RegisterCodec(codec{})
	var opts []grpc.ServerOption
	if *gzip {
		opts = append(opts, grpc.RPCCompressor(grpc.NewGZIPCompressor()))
	}
	l, err := net.Listen("unix", *socket)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	srv := grpc.NewServer(opts...)
	srv.RegisterService(&service, &config{info: info, trailerBytes: *trailerBytes, notifyError: *notifyError})
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM)
	go func() {
		<-sigs
		srv.GracefulStop()
	}()
	emit(map[string]interface{}{"event": "listening"})
	if err := srv.Serve(l); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	emit(map[string]interface{}{"event": "stopped"})
}
