//go:build linux

// Package kubelet runs a real kubelet for tests: k8s.io/kubernetes's
// cmd/kubelet, built from source by controlplane.Build, against the test's
// control plane, with k8s.io/cri-client's fake runtime (served by the test
// process on a unix socket) as its container runtime.
//
// The kubelet would change the host: it writes six /proc/sys entries at
// start (vm.overcommit_memory, vm.panic_on_oom, kernel.panic,
// kernel.panic_on_oops, kernel.keys.root_maxkeys and root_maxbytes) and
// keeps state under the hard-coded /var/lib/kubelet (device-plugins) and
// /var/log (pods, containers). So it runs in a mount namespace of its own
// (privatemounts): files holding the values it wants are bind-mounted over
// those /proc/sys entries, so it finds them set and writes nothing, and
// /var/lib and /var/log are overlays whose changes land in the test's
// directory. Its --root-dir and --cert-dir are in the test's directory
// too, where plugd and the plugins, outside the namespace, see them. Its
// ports are on 127.0.0.1, with webhook authentication and authorization:
// a bearer token is checked by the API server (TokenReview), and its
// permission on nodes/metrics and the like (SubjectAccessReview).
package kubelet

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"k8s.io/cri-client/pkg/fake"
)

// Config is what a kubelet needs. Every field is required except
// Kubelet, Taints and StatusUpdate.
type Config struct {
	// Bin holds the kubelet and privatemounts binaries.
	Bin string
	// Kubelet is the kubelet binary to run, when not Bin's: one of another
	// minor (test/kube/minors). Empty means Bin's kubelet.
	Kubelet string
	// Dir holds everything the kubelet writes; it must be short enough for
	// unix socket paths below it.
	Dir string
	// Node is the Node's name, and the kubelet's --hostname-override (so
	// the name in its self-signed serving certificate).
	Node string
	// Kubeconfig reaches the API server as system:node:Node.
	Kubeconfig string
	// Taints are registered with the Node (registerWithTaints), as
	// KEY:EFFECT.
	Taints []string
	// StatusUpdate is nodeStatusUpdateFrequency: how soon a device
	// plugin's capacity reaches the Node. Zero means the kubelet's default
	// (10s).
	StatusUpdate time.Duration
}

// Kubelet is a running kubelet, and its fake container runtime.
type Kubelet struct {
	cfg Config
	// Addr is the kubelet's secure port, 127.0.0.1:PORT: /metrics,
	// authorised by nodes/metrics.
	Addr string
	// RootDir is its --root-dir; RegistryDir the plugins_registry in it,
	// where plugins put their registration sockets; PodResources the
	// pod-resources socket.
	RootDir, RegistryDir, PodResources string
	// CertFile is its self-signed serving certificate (kubelet.crt in its
	// --cert-dir), to verify its secure port with.
	CertFile string

	runtime *fake.RemoteRuntime
	args    []string
	healthz string

	mu   sync.Mutex
	proc *process // the kubelet now; nil while stopped; guarded by mu
	// StartupTime is how long the last start took to serve /healthz.
	StartupTime time.Duration
}

type process struct {
	cmd  *exec.Cmd
	done chan struct{}
}

// desiredSysctls are the values the kubelet sets at start, by /proc/sys
// entry (k8s.io/component-helpers/node/util/sysctl).
var desiredSysctls = map[string]string{
	"vm/overcommit_memory":      "1",
	"vm/panic_on_oom":           "0",
	"kernel/panic":              "10",
	"kernel/panic_on_oops":      "1",
	"kernel/keys/root_maxkeys":  "1000000",
	"kernel/keys/root_maxbytes": "25000000",
}

// Start starts the fake runtime and the kubelet, and waits until the
// kubelet serves /healthz.
func Start(ctx context.Context, cfg Config) (k *Kubelet, err error) {
	k = &Kubelet{cfg: cfg, RootDir: filepath.Join(cfg.Dir, "root")}
	k.RegistryDir = filepath.Join(k.RootDir, "plugins_registry")
	k.PodResources = filepath.Join(k.RootDir, "pod-resources", "kubelet.sock")
	certDir := filepath.Join(cfg.Dir, "pki")
	k.CertFile = filepath.Join(certDir, "kubelet.crt")
	defer func() {
		if err != nil {
			k.Close()
		}
	}()
	var binds []string
	for entry, v := range desiredSysctls {
		f := filepath.Join(cfg.Dir, "sysctl", strings.ReplaceAll(entry, "/", "."))
		if err := os.MkdirAll(filepath.Dir(f), 0o755); err != nil {
			return nil, err
		}
		if err := os.WriteFile(f, []byte(v+"\n"), 0o644); err != nil {
			return nil, err
		}
		binds = append(binds, "--bind", f+"=/proc/sys/"+entry)
	}
	for _, d := range []string{k.RootDir, certDir} {
		if err := os.MkdirAll(d, 0o750); err != nil {
			return nil, err
		}
	}
	criSock := filepath.Join(cfg.Dir, "cri.sock")
	k.runtime = fake.NewFakeRemoteRuntime()
	if err := k.runtime.Start("unix://" + criSock); err != nil {
		k.runtime = nil
		return nil, fmt.Errorf("fake container runtime: %w", err)
	}
	ports, err := freePorts(2)
	if err != nil {
		return nil, err
	}
	k.Addr = fmt.Sprintf("127.0.0.1:%d", ports[0])
	k.healthz = fmt.Sprintf("http://127.0.0.1:%d/healthz", ports[1])
	config := filepath.Join(cfg.Dir, "kubelet.yaml")
	if err := os.WriteFile(config, k.configFile(ports, "unix://"+criSock), 0o600); err != nil {
		return nil, err
	}
	k.args = append([]string{
		"--overlay", "/var/lib=" + filepath.Join(cfg.Dir, "var-lib"),
		"--overlay", "/var/log=" + filepath.Join(cfg.Dir, "var-log"),
	}, binds...)
	bin := cfg.Kubelet
	if bin == "" {
		bin = filepath.Join(cfg.Bin, "kubelet")
	}
	k.args = append(k.args, "--", bin,
		"--config="+config, "--kubeconfig="+cfg.Kubeconfig, "--root-dir="+k.RootDir, "--cert-dir="+certDir,
		"--hostname-override="+cfg.Node, "--node-ip=127.0.0.1", "--v=2")
	if err := k.Start(ctx); err != nil {
		return nil, err
	}
	return k, nil
}

// configFile is the KubeletConfiguration: what works on a small machine
// without systemd or a cgroup hierarchy of the kubelet's own, no pods of
// its own, and every port on loopback.
func (k *Kubelet) configFile(ports []int, cri string) []byte {
	var b bytes.Buffer
	fmt.Fprintf(&b, `apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: 127.0.0.1
port: %d
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: %d
containerRuntimeEndpoint: %s
imageServiceEndpoint: %s
cgroupDriver: cgroupfs
cgroupsPerQOS: false
enforceNodeAllocatable: []
failSwapOn: false
failCgroupV1: false
resolvConf: ""
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
authorization:
  mode: Webhook
`, ports[0], ports[1], cri, cri)
	if k.cfg.StatusUpdate > 0 {
		fmt.Fprintf(&b, "nodeStatusUpdateFrequency: %s\n", k.cfg.StatusUpdate)
	}
	if len(k.cfg.Taints) > 0 {
		b.WriteString("registerWithTaints:\n")
		for _, t := range k.cfg.Taints {
			key, effect, _ := strings.Cut(t, ":")
			fmt.Fprintf(&b, "  - {key: %q, effect: %q}\n", key, effect)
		}
	}
	return b.Bytes()
}

// Start starts the kubelet (again, after Stop or Kill) and waits until it
// serves /healthz.
func (k *Kubelet) Start(ctx context.Context) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.proc != nil {
		return errors.New("the kubelet is running")
	}
	log, err := os.OpenFile(k.LogFile(), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	fmt.Fprintf(log, "\n=== started at %s\n", time.Now().Format(time.RFC3339Nano))
	cmd := exec.Command(filepath.Join(k.cfg.Bin, "privatemounts"), k.args...)
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Unshareflags: syscall.CLONE_NEWNS,
		Pdeathsig:    syscall.SIGKILL, // never outlive the test
	}
	start := time.Now()
	if err := cmd.Start(); err != nil {
		log.Close()
		return fmt.Errorf("starting the kubelet: %w", err)
	}
	p := &process{cmd: cmd, done: make(chan struct{})}
	go func() {
		cmd.Wait()
		log.Close()
		close(p.done)
	}()
	k.proc = p
	if err := k.waitHealthy(ctx, p); err != nil {
		return fmt.Errorf("%w; the kubelet's log ends:\n%s", err, k.Tail(40))
	}
	k.StartupTime = time.Since(start)
	return nil
}

// waitHealthy polls /healthz until it answers ok.
func (k *Kubelet) waitHealthy(ctx context.Context, p *process) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	hc := &http.Client{Timeout: 2 * time.Second}
	var last error
	for {
		select {
		case <-ctx.Done():
			return fmt.Errorf("the kubelet was not healthy in time: %v", last)
		case <-p.done:
			return fmt.Errorf("the kubelet exited: %v", p.cmd.ProcessState)
		case <-tick.C:
		}
		resp, err := hc.Get(k.healthz)
		if err != nil {
			last = err
			continue
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK && strings.TrimSpace(string(b)) == "ok" {
			return nil
		}
		last = fmt.Errorf("%s: %s", resp.Status, b)
	}
}

// Running says the kubelet runs.
func (k *Kubelet) Running() bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.proc != nil
}

// Pid is the kubelet's process id, 0 while it is stopped.
func (k *Kubelet) Pid() int {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.proc == nil {
		return 0
	}
	return k.proc.cmd.Process.Pid
}

// Stop stops the kubelet with SIGTERM (SIGKILL after 30s), as systemd
// stops it. It may be called when it is not running.
func (k *Kubelet) Stop() { k.signal(syscall.SIGTERM) }

// Kill kills the kubelet with SIGKILL.
func (k *Kubelet) Kill() { k.signal(syscall.SIGKILL) }

func (k *Kubelet) signal(sig syscall.Signal) {
	k.mu.Lock()
	defer k.mu.Unlock()
	p := k.proc
	if p == nil {
		return
	}
	k.proc = nil
	p.cmd.Process.Signal(sig)
	select {
	case <-p.done:
	case <-time.After(30 * time.Second):
		p.cmd.Process.Kill()
		<-p.done
	}
}

// Close stops the kubelet and its runtime. It may be called more than once.
func (k *Kubelet) Close() {
	k.Kill()
	if k.runtime != nil {
		k.runtime.Stop()
		k.runtime = nil
	}
}

// LogFile is where the kubelet logs, every start appended.
func (k *Kubelet) LogFile() string { return filepath.Join(k.cfg.Dir, "kubelet.log") }

// Tail is the last n lines of the kubelet's log.
func (k *Kubelet) Tail(n int) string {
	b, _ := os.ReadFile(k.LogFile())
	lines := bytes.Split(bytes.TrimRight(b, "\n"), []byte("\n"))
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return string(bytes.Join(lines, []byte("\n")))
}

// Get fetches path from the kubelet's secure port with a bearer token,
// verifying its serving certificate, and returns the body and status.
func (k *Kubelet) Get(ctx context.Context, path, token string) (string, int, error) {
	ca, err := os.ReadFile(k.CertFile)
	if err != nil {
		return "", 0, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(ca) {
		return "", 0, fmt.Errorf("%s holds no certificate", k.CertFile)
	}
	hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: pool, ServerName: k.cfg.Node}}}
	defer hc.CloseIdleConnections()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "https://"+k.Addr+path, nil)
	if err != nil {
		return "", 0, err
	}
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := hc.Do(req)
	if err != nil {
		return "", 0, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), resp.StatusCode, err
}

// Sysctls reads the host's values of the entries the kubelet would set,
// to show that it set none of them.
func Sysctls() map[string]string {
	out := map[string]string{}
	for entry := range desiredSysctls {
		b, err := os.ReadFile("/proc/sys/" + entry)
		if err != nil {
			out[entry] = err.Error()
			continue
		}
		out[entry] = strings.TrimSpace(string(b))
	}
	return out
}

func freePorts(n int) ([]int, error) {
	var ports []int
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}
