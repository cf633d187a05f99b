package testenv

import (
	"errors"
	"net"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
)

// GRPCServer is a gRPC server on a unix socket, as a plugin's endpoint
// serves one, that counts the connections open to it. Make one with
// ServeGRPC.
type GRPCServer struct {
	*grpc.Server
	served chan struct{} // closed when Serve has returned

	mu      sync.Mutex
	open    int           // connections accepted and not yet closed
	changed chan struct{} // closed and made anew when open changes
}

// ServeGRPC serves a gRPC server on a new unix socket at path until Stop,
// or the end of the test. register, if not nil, registers the server's
// services; with none, every call is Unimplemented, and the server is only
// there to be connected to.
func ServeGRPC(t testing.TB, path string, register func(grpc.ServiceRegistrar)) *GRPCServer {
	t.Helper()
	l, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	s := &GRPCServer{Server: grpc.NewServer(), served: make(chan struct{}), changed: make(chan struct{})}
	if register != nil {
		register(s.Server)
	}
	go func() {
		defer close(s.served)
		if err := s.Serve(counting{l, s}); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			t.Errorf("testenv: serving gRPC at %s: %v", path, err)
		}
	}()
	t.Cleanup(s.Stop)
	return s
}

// Stop stops the server at once, as a plugin killed stops: it closes the
// connections and the listener, which removes the socket file, and waits
// for the server to have stopped serving. It may be called more than once.
func (s *GRPCServer) Stop() {
	s.Server.Stop()
	<-s.served
}

// WaitConns waits until exactly n connections are open to the server,
// failing the test after timeout (a failure bound, not a pace). A
// connection counts from its acceptance until the server closes it, which
// it does once the client has closed its end.
func (s *GRPCServer) WaitConns(t testing.TB, n int, timeout time.Duration) {
	t.Helper()
	deadline := time.After(timeout)
	for {
		s.mu.Lock()
		open, changed := s.open, s.changed
		s.mu.Unlock()
		if open == n {
			return
		}
		select {
		case <-changed:
		case <-deadline:
			t.Fatalf("testenv: %d connections open to the gRPC server after %s, want %d", open, timeout, n)
		}
	}
}

func (s *GRPCServer) add(d int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.open += d
	close(s.changed)
	s.changed = make(chan struct{})
}

// counting is a listener whose connections count in the server's open
// connections while they are.
type counting struct {
	net.Listener
	s *GRPCServer
}

func (l counting) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	l.s.add(1)
	return &countedConn{Conn: c, s: l.s}, nil
}

type countedConn struct {
	net.Conn
	s    *GRPCServer
	once sync.Once
}

func (c *countedConn) Close() error {
	c.once.Do(func() { c.s.add(-1) })
	return c.Conn.Close()
}
