package testenv

import (
	"errors"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// Count counts every connection made before it, accepted yet or not.
func TestCountCountsConnectionsNotYetAccepted(t *testing.T) {
	path := filepath.Join(ShortDir(t, "tenv"), "evil.sock")
	a := CountAccepts(t, path)
	const n = 50
	for range n {
		c, err := net.Dial("unix", path)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
	}
	if got := a.Count(); got != n {
		t.Errorf("Count = %d right after %d connections, want %d", got, n, n)
	}
	if got := a.Count(); got != n {
		t.Errorf("Count again = %d, want %d: its own connections are not counted", got, n)
	}
}

// WaitConns sees a client's connection open, and closed once the client
// closes it; Stop removes the socket.
func TestServeGRPCCountsOpenConnections(t *testing.T) {
	path := filepath.Join(ShortDir(t, "tenv"), "grpc.sock")
	srv := ServeGRPC(t, path, nil)
	conn, err := grpc.NewClient("unix://"+path, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	conn.Connect()
	srv.WaitConns(t, 1, Timeout)
	conn.Close()
	srv.WaitConns(t, 0, Timeout)
	srv.Stop()
	if _, err := os.Stat(path); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("after Stop, the socket: %v, want it gone", err)
	}
	srv.Stop() // again: a no-op
}
