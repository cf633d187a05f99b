package testenv

import (
	"net"
	"path/filepath"
	"testing"
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
