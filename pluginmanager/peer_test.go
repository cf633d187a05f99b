//go:build linux || darwin

package pluginmanager

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"testing"

	"github.com/plugd/plugd/internal/testenv"
)

// The peer is read on the connection GetInfo was answered on, and, once
// that is closed, on a connection of its own to the same socket file.
func TestPeerOf(t *testing.T) {
	dir := testenv.ShortDir(t, "peer")
	path, srv := serveInfo(t, dir)
	defer srv.Stop()
	m, err := New(Options{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	id, ok := statSocket(path)
	if !ok {
		t.Fatal("no socket")
	}
	e := &entry{id: id}
	ctx := context.Background()
	_, conn, err := m.client.ask(ctx, e, path, nil)
	if err != nil {
		t.Fatal(err)
	}
	me := uint32(os.Getuid())
	if who := m.client.peerOf(ctx, e, conn, path); !who.known || who.uid != me || who.pid != uint32(os.Getpid()) {
		t.Errorf("on the open connection: %+v, want this process (uid %d)", who, me)
	}
	conn.Close()
	if who := m.client.peerOf(ctx, e, conn, path); !who.known || who.uid != me {
		t.Errorf("after the connection closed: %+v, want this process (uid %d)", who, me)
	}
	// Another socket in its place is not asked.
	other := filepath.Join(dir, "other.sock")
	l2, err := net.Listen("unix", other)
	if err != nil {
		t.Fatal(err)
	}
	defer l2.Close()
	if err := os.Rename(other, path); err != nil {
		t.Fatal(err)
	}
	if who := m.client.peerOf(ctx, e, nil, path); who.known {
		t.Errorf("another socket at the path: %+v, want unknown", who)
	}
}
