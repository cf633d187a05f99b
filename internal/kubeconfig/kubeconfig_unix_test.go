//go:build unix

package kubeconfig

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// A kubeconfig that is not a regular file, or is larger than MaxSize, is
// refused at once: given explicitly, in $KUBECONFIG, and as a file the
// kubeconfig names. Before, /dev/zero was read until memory ran out and a
// FIFO blocked until someone wrote to it.
func TestBoundedKubeconfig(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	huge := filepath.Join(dir, "huge")
	if err := os.WriteFile(huge, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(huge, MaxSize+1); err != nil {
		t.Fatal(err)
	}
	good := filepath.Join(dir, "good")
	write := func(path, ca string) {
		t.Helper()
		kc := "apiVersion: v1\nkind: Config\ncurrent-context: c\n" +
			"clusters: [{name: k, cluster: {server: 'https://127.0.0.1:1', certificate-authority: '" + ca + "'}}]\n" +
			"contexts: [{name: c, context: {cluster: k, user: u}}]\nusers: [{name: u, user: {token: t}}]\n"
		if err := os.WriteFile(path, []byte(kc), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	ca := filepath.Join(dir, "ca.crt")
	if err := os.WriteFile(ca, []byte("not checked here"), 0o600); err != nil {
		t.Fatal(err)
	}
	write(good, ca)
	zeroCA := filepath.Join(dir, "zero-ca")
	write(zeroCA, "/dev/zero")

	for _, tc := range []struct {
		name, explicit, env, want string
	}{
		{"/dev/zero", "/dev/zero", "", "/dev/zero is a device, not a regular file: it is read whole; give the path of a kubeconfig file"},
		{"a FIFO", fifo, "", fifo + " is a named pipe (FIFO), not a regular file"},
		{"a directory", dir, "", "is a directory, not a regular file"},
		{"too large", huge, "", huge + " is larger than 4 MiB, more than a kubeconfig file holds"},
		{"a FIFO in $KUBECONFIG", "", good + ":" + fifo, fifo + " is a named pipe (FIFO)"},
		{"a missing file", filepath.Join(dir, "missing"), "", "no such file"},
		{"a certificate authority of /dev/zero", zeroCA, "", "the kubeconfig's certificate-authority: /dev/zero is a device, not a regular file: it is read whole; give the path of a PEM file"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("KUBECONFIG", tc.env)
			done := make(chan error, 1)
			go func() { _, err := RESTConfig(ClientConfig(tc.explicit, "")); done <- err }()
			select {
			case err := <-done:
				if err == nil || !strings.Contains(err.Error(), tc.want) {
					t.Errorf("%v, want an error that says %q", err, tc.want)
				}
			case <-time.After(10 * time.Second):
				os.WriteFile(fifo, nil, 0) // let the read end, so that the goroutine does
				t.Fatal("did not return")
			}
		})
	}

	// A sound one, given or in $KUBECONFIG with a missing one, is read as kubectl reads it.
	t.Setenv("KUBECONFIG", filepath.Join(dir, "missing")+":"+good)
	for _, explicit := range []string{good, ""} {
		rc, err := RESTConfig(ClientConfig(explicit, ""))
		if err != nil || rc.Host != "https://127.0.0.1:1" || rc.TLSClientConfig.CAFile != ca {
			t.Errorf("ClientConfig(%q): %+v, %v", explicit, rc, err)
		}
	}
}
