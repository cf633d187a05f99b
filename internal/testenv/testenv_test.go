package testenv

import (
	"errors"
	"fmt"
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

// ListenUnix's socket appears at its path listening, leaves no hidden
// name behind, and goes when closed unless told to stay.
func TestListenUnix(t *testing.T) {
	dir := ShortDir(t, "lu")
	for _, leave := range []bool{false, true} {
		path := filepath.Join(dir, fmt.Sprintf("p%t.sock", leave))
		l := ListenUnix(t, path)
		c, err := net.Dial("unix", path)
		if err != nil {
			t.Fatalf("connecting as soon as it is there: %v", err)
		}
		c.Close()
		if names, _ := filepath.Glob(filepath.Join(dir, ".*")); len(names) > 0 {
			t.Errorf("hidden names left: %q", names)
		}
		l.SetUnlinkOnClose(!leave)
		if err := l.Close(); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Lstat(path); (err == nil) != leave {
			t.Errorf("closed, SetUnlinkOnClose(%t): the socket file is there: %t", !leave, err == nil)
		}
	}
}
