package testenv

import (
	"net"
	"os"
	"path/filepath"
	"testing"
)

// UnixListener is a listener on a unix socket whose file appeared already
// listening (see ListenUnix).
type UnixListener struct {
	*net.UnixListener
	path   string
	unlink bool
}

// ListenUnix listens on a unix socket at path whose file is listening from
// the moment it appears, as the plugin SDK's sockets are: it is bound and
// listened on at a hidden name beside path (a manager ignores dot-names),
// then renamed into place. A socket bound in place refuses connections
// between its bind and its listen; a manager that finds it then tries it
// again 20 ms later by its clock, which a test's fake clock never reaches
// unless the test moves it (issue 36: a test that waited for Registered
// saw the socket Pending, with no attempt counted, until it timed out).
// Closing the listener removes the socket file at path, as net.Listen's
// does, unless SetUnlinkOnClose(false) said to leave it there, as a plugin
// that is killed does.
func ListenUnix(t testing.TB, path string) *UnixListener {
	t.Helper()
	hidden := filepath.Join(filepath.Dir(path), "."+filepath.Base(path)+".listening")
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: hidden, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	l.SetUnlinkOnClose(false) // its name is path's once renamed; Close removes that
	if err := os.Rename(hidden, path); err != nil {
		l.Close()
		os.Remove(hidden)
		t.Fatal(err)
	}
	return &UnixListener{UnixListener: l, path: path, unlink: true}
}

// SetUnlinkOnClose says whether Close removes the socket file at path.
func (l *UnixListener) SetUnlinkOnClose(unlink bool) { l.unlink = unlink }

// Close stops listening and, unless SetUnlinkOnClose(false), removes the
// socket file. A second Close returns an error and removes nothing.
func (l *UnixListener) Close() error {
	err := l.UnixListener.Close()
	if err == nil && l.unlink { // once: a second Close leaves a new socket at path alone
		os.Remove(l.path)
	}
	return err
}
