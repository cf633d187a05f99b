//go:build unix

package doctor

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/plugd/plugd/api"
)

// A directory below the registry directory that anyone may write to is an
// error when plugd registers (it registers nothing there) and a warning
// when it observes the kubelet (which does); a safe one, one below an
// unsafe one, and a hidden one are not reported, nor anything with
// AllowWritableDir.
func TestUnsafeSubdirectory(t *testing.T) {
	reg := t.TempDir()
	open := filepath.Join(reg, "open")
	for _, d := range []string{open, filepath.Join(open, "deeper"), filepath.Join(reg, "safe"), filepath.Join(reg, ".hidden")} {
		if err := os.Mkdir(d, 0o750); err != nil {
			t.Fatal(err)
		}
	}
	for _, d := range []string{open, filepath.Join(open, "deeper"), filepath.Join(reg, ".hidden")} {
		if err := os.Chmod(d, 0o777); err != nil {
			t.Fatal(err)
		}
	}
	listen(t, filepath.Join(open, "planted.sock"))
	// A registry directory reached through a symlink (a moved /var/lib) is
	// looked into as the manager looks into it.
	link := filepath.Join(t.TempDir(), "link")
	if err := os.Symlink(reg, link); err != nil {
		t.Fatal(err)
	}
	if got := findings(Check(context.Background(), Input{RegistryDir: link, KubeletRoots: []string{}}), "unsafe-subdirectory", ""); len(got) != 1 {
		t.Errorf("through a symlink to the registry directory: findings %+v, want one", got)
	}

	for _, tc := range []struct {
		in       Input
		severity string
		says     string
	}{
		{Input{RegistryDir: reg}, api.SeverityError, "plugd registers none of the 1 plugin sockets in it"},
		{Input{RegistryDir: reg, Observe: true}, api.SeverityWarning, "plant a plugin there for the kubelet"},
		{Input{RegistryDir: reg, AllowWritableDir: true}, "", ""},
	} {
		tc.in.KubeletRoots = []string{}
		got := findings(Check(context.Background(), tc.in), "unsafe-subdirectory", "")
		if tc.severity == "" {
			if len(got) != 0 {
				t.Errorf("AllowWritableDir: findings %+v, want none", got)
			}
			continue
		}
		if len(got) != 1 {
			t.Fatalf("%+v: findings %+v, want one, about %s", tc.in, got, open)
		}
		f := got[0]
		text := f.Summary + " " + strings.Join(f.Evidence, " ") + " " + f.Remedy
		for _, want := range []string{tc.says, open, "mode -rwxrwxrwx", "sockets in it: 1", "chmod go-w " + open, "allowWritableRegistryDir"} {
			if !strings.Contains(text, want) {
				t.Errorf("finding %+v does not say %q", f, want)
			}
		}
		if f.Severity != tc.severity {
			t.Errorf("severity %s, want %s", f.Severity, tc.severity)
		}
	}
}
