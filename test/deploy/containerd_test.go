package deploy

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// The image's archive is what containerd takes: imported as kind load
// image-archive imports it (ctr images import --all-platforms --digests
// from standard input, into the k8s.io namespace the kubelet's CRI uses),
// it is named ghcr.io/plugd/plugd:VERSION with both platforms, and runs
// under runc: plugd version, from the image's root filesystem. A real
// containerd, started by the test with a root, state and socket of its
// own; it needs root and Debian's containerd (with runc), and skips
// without them unless PLUGD_CONTAINERD=require (.ci/run sets it, and
// installs containerd).
func TestImageInContainerd(t *testing.T) {
	ctr := requireContainerd(t)
	dir, ref := buildImage(t)
	digest := ref[strings.Index(ref, "@")+1:]
	archive, err := os.Open(filepath.Join(dir, "image", "plugd-image.tar"))
	if err != nil {
		t.Fatal(err)
	}
	defer archive.Close()
	sock := startContainerd(t)

	run := func(stdin *os.File, args ...string) string {
		t.Helper()
		cmd := exec.Command(ctr, append([]string{"--address", sock, "--namespace", "k8s.io"}, args...)...)
		if stdin != nil {
			cmd.Stdin = stdin
		}
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("ctr %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	run(archive, "images", "import", "--all-platforms", "--digests", "-")
	image := "ghcr.io/plugd/plugd:" + imageVersion
	list := run(nil, "images", "ls")
	var found bool
	for _, line := range strings.Split(list, "\n") {
		f := strings.Fields(line)
		if len(f) >= 6 && f[0] == image {
			found = true
			if f[2] != digest || !strings.Contains(f[len(f)-2], "linux/amd64,linux/arm64") {
				t.Errorf("containerd has %s as %s for %s; want %s for linux/amd64,linux/arm64", image, f[2], f[len(f)-2], digest)
			}
		}
	}
	if !found {
		t.Fatalf("containerd did not name the image %s:\n%s", image, list)
	}
	out := run(nil, "run", "--rm", image, "plugd-image-test", "/usr/local/bin/plugd", "version")
	if !strings.Contains(out, "plugd "+imageVersion) {
		t.Errorf("plugd version in the image under containerd printed %q", out)
	}
}

// requireContainerd returns ctr's path, or skips the test where containerd
// cannot run (not root, or not installed), unless PLUGD_CONTAINERD=require.
func requireContainerd(t *testing.T) string {
	t.Helper()
	var missing []string
	for _, c := range []string{"containerd", "ctr", "runc"} {
		if _, err := exec.LookPath(c); err != nil {
			missing = append(missing, c)
		}
	}
	why := ""
	switch {
	case os.Geteuid() != 0:
		why = "containerd needs root"
	case len(missing) > 0:
		why = fmt.Sprintf("%s not installed (apt-get install containerd)", strings.Join(missing, ", "))
	}
	if why != "" {
		if os.Getenv("PLUGD_CONTAINERD") == "require" {
			t.Fatalf("PLUGD_CONTAINERD=require, but %s", why)
		}
		t.Skip(why)
	}
	ctr, _ := exec.LookPath("ctr")
	return ctr
}

// startContainerd starts containerd with a root, state and socket in a
// temporary directory, without its CRI plugin, stops it when the test
// ends, and returns its socket once it accepts.
func startContainerd(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "plugd-containerd")
	if err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "containerd.sock")
	config := fmt.Sprintf("version = 2\nroot = %q\nstate = %q\ndisabled_plugins = [\"io.containerd.grpc.v1.cri\"]\n[grpc]\n  address = %q\n",
		filepath.Join(dir, "root"), filepath.Join(dir, "state"), sock)
	if err := os.WriteFile(filepath.Join(dir, "config.toml"), []byte(config), 0o600); err != nil {
		t.Fatal(err)
	}
	logFile, err := os.Create(filepath.Join(dir, "log"))
	if err != nil {
		t.Fatal(err)
	}
	defer logFile.Close() // the child has its own descriptor
	log := func() string { b, _ := os.ReadFile(logFile.Name()); return string(b) }
	cmd := exec.Command("containerd", "--config", filepath.Join(dir, "config.toml"))
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		cmd.Process.Signal(os.Interrupt)
		select {
		case <-exited:
		case <-time.After(30 * time.Second):
			cmd.Process.Kill()
			<-exited
		}
		os.RemoveAll(dir)
	})
	// containerd creates the socket when it is ready to serve: dial it
	// until it answers, or containerd exits, or a minute (a loaded CI
	// machine) passes.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for {
		var d net.Dialer
		c, err := d.DialContext(ctx, "unix", sock)
		if err == nil {
			c.Close()
			return sock
		}
		select {
		case err := <-exited:
			t.Fatalf("containerd exited: %v\n%s", err, log())
		case <-ctx.Done():
			t.Fatalf("containerd did not listen on %s within a minute\n%s", sock, log())
		case <-time.After(50 * time.Millisecond):
		}
	}
}
