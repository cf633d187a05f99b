//go:build unix

package daemon

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/plugd/plugd/api"
	"github.com/plugd/plugd/internal/testenv"
)

// Issue 13, item 10: --config reads regular files only, of a bounded size,
// and never blocks: /dev/zero, a FIFO nobody writes to, a directory and a
// huge file are refused at once, on SIGHUP too.
func TestConfigFileMustBeARegularFile(t *testing.T) {
	dir := testenv.ShortDir(t, "pd")
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	huge := filepath.Join(dir, "huge.yaml")
	if err := os.WriteFile(huge, []byte("# "+strings.Repeat("x", 2<<20)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	load := func(path string) error {
		done := make(chan error, 1)
		go func() { _, err := LoadConfig(path); done <- err }()
		select {
		case err := <-done:
			return err
		case <-time.After(testenv.Timeout):
			os.WriteFile(fifo, nil, 0) // let the read end, so that the goroutine does
			t.Fatalf("LoadConfig(%s) did not return", path)
			return nil
		}
	}
	for path, want := range map[string]string{
		"/dev/zero": "config /dev/zero is a device, not a regular file",
		fifo:        "is a named pipe (FIFO), not a regular file",
		dir:         "is a directory, not a regular file",
		huge:        "is larger than 1 MiB",
	} {
		if err := load(path); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("LoadConfig(%s): %v, want it to say %q", path, err, want)
		}
	}

	// A reload from a file replaced by a FIFO is refused, and plugd goes on.
	r := runDaemon(t, Config{})
	reloaded := make(chan struct{})
	go func() {
		defer close(reloaded)
		r.d.reloadFrom(func() (Config, error) { return LoadConfig(fifo) })
	}()
	select {
	case <-reloaded:
	case <-time.After(testenv.Timeout):
		os.WriteFile(fifo, nil, 0)
		t.Fatal("a reload from a FIFO did not return")
	}
	if !strings.Contains(r.logs.String(), "reload refused") || !strings.Contains(r.logs.String(), "named pipe") {
		t.Errorf("the reload is not logged as refused:\n%s", r.logs)
	}
	if _, err := r.client.Plugins(context.Background(), api.Filter{}); err != nil {
		t.Errorf("after the refused reload: %v", err)
	}
}

// Issue 25, item 3: kubernetes.kubeconfig is read as --config is: a FIFO
// or a file over 4 MiB is refused at once, saying what it is; before, the
// FIFO blocked plugd's start and /dev/zero took 3.1 GB in 4 s.
func TestKubeconfigMustBeARegularFile(t *testing.T) {
	dir := testenv.ShortDir(t, "pd")
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	huge := filepath.Join(dir, "huge")
	if err := os.WriteFile(huge, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(huge, 4<<20+1); err != nil { // sparse: costs no disk
		t.Fatal(err)
	}
	for path, want := range map[string]string{
		fifo: "kubernetes.kubeconfig " + fifo + ": " + fifo + " is a named pipe (FIFO), not a regular file: it is read whole",
		huge: huge + " is larger than 4 MiB, more than a kubeconfig file holds",
	} {
		done := make(chan error, 1)
		go func() {
			d, err := New(Config{RegistryDir: filepath.Join(dir, "reg"), Status: StatusConfig{Socket: "none"},
				Kubernetes: &KubernetesConfig{Kubeconfig: path, NodeName: "node-a"}}, io.Discard)
			if d != nil {
				d.closeHandlers()
			}
			done <- err
		}()
		select {
		case err := <-done:
			if err == nil || !strings.Contains(err.Error(), want) {
				t.Errorf("kubeconfig %s: %v, want it to say %q", path, err, want)
			}
		case <-time.After(testenv.Timeout):
			os.WriteFile(fifo, nil, 0) // let the read end, so that the goroutine does
			t.Fatalf("New with kubeconfig %s did not return", path)
		}
	}
}

// Issue 25, item 9: the configuration refuses what is not plugd's to
// write or read: a condition type node-problem-detector or the kubelet
// writes, a nodeName that is no Node's name (and would be a path in the
// URLs plugd builds), a doctor.procDir that is not a proc file system.
func TestConfigRefusesWhatIsNotPlugds(t *testing.T) {
	expect := func(cond string) string {
		return "kubernetes: {nodeName: node-a}\nexpect: [{type: CSIPlugin, name: a.example.com, condition: " + cond + "}]\n"
	}
	cases := []struct{ yaml, want string }{
		{expect("KernelDeadlock"), `expect[0]: condition "KernelDeadlock" is node-problem-detector's`},
		{expect("ReadonlyFilesystem"), "node-problem-detector's"},
		{expect("FrequentKubeletRestart"), "node-problem-detector's"},
		{expect("FrequentDockerRestart"), "node-problem-detector's"},
		{expect("FrequentContainerdRestart"), "node-problem-detector's"},
		{expect("CorruptDockerOverlay2"), "node-problem-detector's"},
		{expect("Ready"), `condition "Ready" is the kubelet's`},
		{expect("MemoryPressure"), "the kubelet's"},
		{expect("DiskPressure"), "the kubelet's"},
		{expect("PIDPressure"), "the kubelet's"},
		{expect("NetworkUnavailable"), "the kubelet's"},
		{"kubernetes: {nodeName: '../../namespaces/kube-system/secrets/x'}\n", `kubernetes.nodeName "../../namespaces/kube-system/secrets/x" is not a Node's name: a lowercase RFC 1123 subdomain`},
		{"kubernetes: {nodeName: Node_A}\n", "is not a Node's name"},
		{"kubernetes: {nodeName: '" + strings.Repeat("a", 254) + "'}\n", "must be no more than 253 characters"},
	}
	if runtime.GOOS == "linux" {
		cases = append(cases,
			struct{ yaml, want string }{"doctor: {procDir: /dev}\n", "doctor.procDir /dev is not a proc file system"},
			struct{ yaml, want string }{"doctor: {procDir: /nonexistent}\n", "doctor.procDir /nonexistent cannot be read"})
	}
	dir := t.TempDir()
	for _, tc := range cases {
		path := filepath.Join(dir, "c.yaml")
		if err := os.WriteFile(path, []byte(tc.yaml), 0o600); err != nil {
			t.Fatal(err)
		}
		cfg, err := LoadConfig(path)
		if err == nil {
			_, err = cfg.WithDefaults()
		}
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: error %v, want it to say %q", tc.yaml, err, tc.want)
		}
	}
	// What is plugd's passes: its own conditions, a Node's name, a procfs.
	ok := Config{RegistryDir: filepath.Join(dir, "reg"), Kubernetes: &KubernetesConfig{NodeName: "node-a.example.com"},
		Expect: []ExpectConfig{{Type: "CSIPlugin", Name: "a.example.com", Condition: "a.example.com/KernelDeadlock"}}}
	if runtime.GOOS == "linux" {
		ok.Doctor.ProcDir = "/proc"
	}
	if _, err := ok.WithDefaults(); err != nil {
		t.Errorf("%+v: %v", ok, err)
	}
}
