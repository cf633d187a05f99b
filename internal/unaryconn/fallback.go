package unaryconn

import (
	"context"
	"fmt"
	"net"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"
)

// InvokeGRPC makes the call Invoke makes, with grpc-go, on a connection of
// its own to the unix socket at path, closed when the call ends. It is the
// fallback for a call that failed with ErrProtocol (and not
// ErrMaybeDelivered): grpc-go speaks all of gRPC over HTTP/2, at about ten
// times the CPU of a call on a held Conn and a connection's setup, which is
// why it is not the first choice. Its errors are grpc-go's status errors,
// and match none of this package's sentinels.
func InvokeGRPC(ctx context.Context, path, method string, req, resp proto.Message, maxRecv int) error {
	return InvokeGRPCWith(ctx, func(ctx context.Context) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", path)
	}, method, req, resp, maxRecv)
}

// InvokeGRPCWith is InvokeGRPC on a connection made by dial, the caller's
// own way (through a path that cannot follow a swapped symlink, say), as
// NewConn is Dial's.
func InvokeGRPCWith(ctx context.Context, dial func(context.Context) (net.Conn, error), method string, req, resp proto.Message, maxRecv int) error {
	cc, err := grpc.NewClient("passthrough:///localhost",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return dial(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(min(maxRecv, MaxRecvSize))),
	)
	if err != nil {
		return fmt.Errorf("grpc-go client: %w", err)
	}
	defer cc.Close()
	return cc.Invoke(ctx, method, req, resp)
}
