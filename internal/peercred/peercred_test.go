package peercred

import (
	"net"
	"os"
	"path/filepath"
	"testing"

	"github.com/plugd/plugd/internal/testenv"
)

// The peer of a connection this process made to itself is this process,
// where the OS tells.
func TestOfTellsWhoConnected(t *testing.T) {
	l, err := net.Listen("unix", filepath.Join(testenv.ShortDir(t, "pc"), "p.sock"))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	c, err := net.Dial("unix", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	s, err := l.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	p, ok := Of(s.(*net.UnixConn))
	if ok != Supported {
		t.Fatalf("Of told %v (%+v), Supported is %v", ok, p, Supported)
	}
	if ok && (p.UID != uint32(os.Geteuid()) || p.PID != uint32(os.Getpid())) {
		t.Errorf("peer %+v, want uid %d, pid %d", p, os.Geteuid(), os.Getpid())
	}
	s.Close()
	if _, ok := Of(s.(*net.UnixConn)); ok {
		t.Error("Of told the peer of a closed connection")
	}
}
