//go:build unix

package daemon

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/plugd/plugd/internal/testenv"
)

// Issue 13, item 10: the status socket's directory is held to the registry
// directory's rule (internal/dirtrust): a private directory inside a parent
// anyone may write to could be renamed away and replaced, and with it the
// socket that plugctl and probes trust; one of another user's could be made
// writable. The registry directory itself is the manager's check
// (pluginmanager's dirtrust tests); here, that plugd's configuration reaches
// it, and its override.
// runBounded runs d, which should refuse to start: an accepted configuration
// runs until the test's bound, and fails.
func runBounded(t *testing.T, d *Daemon) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := d.Run(ctx)
	if ctx.Err() != nil {
		t.Error("Run started with a configuration it should refuse")
	}
	return err
}

func TestStatusAndRegistryDirsInWritableParent(t *testing.T) {
	parent := testenv.ShortDir(t, "wp")
	run := filepath.Join(parent, "run")
	if err := os.Mkdir(run, 0o750); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(parent, 0o777); err != nil {
		t.Fatal(err)
	}
	d, err := New(Config{RegistryDir: testenv.ShortDir(t, "pd"), Status: StatusConfig{Socket: filepath.Join(run, "plugd.sock")}}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if err := runBounded(t, d); err == nil || !strings.Contains(err.Error(), "status.socket") || !strings.Contains(err.Error(), parent) || !strings.Contains(err.Error(), "no sticky bit") {
		t.Errorf("Run with the status socket's directory in a 0777 parent = %v", err)
	}

	reg := filepath.Join(parent, "plugins")
	if err := os.Mkdir(reg, 0o750); err != nil {
		t.Fatal(err)
	}
	d, err = New(Config{RegistryDir: reg, Status: StatusConfig{Socket: filepath.Join(testenv.ShortDir(t, "pd"), "plugd.sock")}}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if err := runBounded(t, d); err == nil || !strings.Contains(err.Error(), parent) || !strings.Contains(err.Error(), "policy.allowWritableRegistryDir") {
		t.Errorf("Run with the registry directory in a 0777 parent = %v", err)
	}
	if os.Geteuid() != 0 {
		return
	}
	own := testenv.ShortDir(t, "pd")
	if err := os.Chown(own, 54321, 54321); err != nil {
		t.Fatal(err)
	}
	d, err = New(Config{RegistryDir: testenv.ShortDir(t, "pd"), Status: StatusConfig{Socket: filepath.Join(own, "plugd.sock")}}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if err := runBounded(t, d); err == nil || !strings.Contains(err.Error(), "belongs to uid 54321") {
		t.Errorf("Run with the status socket's directory of uid 54321's = %v", err)
	}
}
