//go:build linux

// Package controlplane runs a real Kubernetes control plane for tests:
// etcd and kube-apiserver, built from the Go module proxy (the mains in
// ../cmd) and started on loopback with RBAC on, service-account token
// signing, an admin token and an audit log.
//
// Build compiles the binaries into a cache directory with testenv.Build,
// so that only the first run pays for the compilation (several minutes on
// two cores) and later runs take them from the Go build cache.
package controlplane

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"time"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/plugd/plugd/internal/testenv"
)

// Dirs are where the sources and the built binaries are.
type Dirs struct {
	Module string // this module (test/kube)
	Repo   string // the repository's root: the main module
	Bin    string // the binaries
}

// Locate finds the module and the binary cache: $PLUGD_KUBE_BIN if set,
// else plugd/test-kube in the user's cache directory.
func Locate() (Dirs, error) {
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		return Dirs{}, errors.New("cannot find the controlplane package's source")
	}
	mod := filepath.Dir(filepath.Dir(file))
	d := Dirs{Module: mod, Repo: filepath.Dir(filepath.Dir(mod)), Bin: os.Getenv("PLUGD_KUBE_BIN")}
	if d.Bin == "" {
		cache, err := os.UserCacheDir()
		if err != nil {
			return Dirs{}, fmt.Errorf("no cache directory for the binaries (%w): set PLUGD_KUBE_BIN", err)
		}
		d.Bin = filepath.Join(cache, "plugd", "test-kube")
	}
	return d, os.MkdirAll(d.Bin, 0o755)
}

// Build compiles etcd, kube-apiserver, the kubelet, privatemounts and
// testplugin (from this module) and plugd, plugctl and kubectl-plugd (from
// the repository) into d.Bin with testenv.Build, the one builder of the
// suites' binaries: the same go build, without -race, as every suite's;
// it builds a package of this module in this module. The go command
// relinks only what changed; the first build of kube-apiserver and the
// kubelet takes minutes.
func Build(d Dirs, log io.Writer) error {
	for _, pkgs := range [][]string{
		{"test/kube/cmd/etcd", "test/kube/cmd/kube-apiserver", "test/kube/cmd/kubelet", "test/kube/cmd/privatemounts", "test/kube/cmd/testplugin"},
		{"cmd/plugd", "cmd/plugctl", "cmd/kubectl-plugd"},
	} {
		start := time.Now()
		if err := testenv.Build(d.Bin, pkgs...); err != nil {
			return err
		}
		fmt.Fprintf(log, "built %s in %s\n", strings.Join(pkgs, " "), time.Since(start).Round(time.Second))
	}
	return nil
}

// ControlPlane is a running etcd and kube-apiserver.
type ControlPlane struct {
	// URL is the API server's address, https://127.0.0.1:PORT.
	URL string
	// CA is the API server's (self-signed) serving certificate.
	CA []byte
	// AdminToken authenticates as a member of system:masters.
	AdminToken string
	// AuditLog is the API server's audit log: every request, at Metadata
	// level, one JSON object per line.
	AuditLog string

	dir, bin  string
	etcd, api *process
	clientCA  *x509.Certificate
	clientKey *rsa.PrivateKey
	apiArgs   []string
	// StartupTime is how long the API server took to be ready.
	StartupTime time.Duration
}

// process is a started binary and its log.
type process struct {
	cmd  *exec.Cmd
	log  string
	done chan struct{}
}

// Start runs etcd and kube-apiserver from bin with their state in dir,
// and waits until the API server is ready.
func Start(ctx context.Context, bin, dir string) (cp *ControlPlane, err error) {
	cp = &ControlPlane{dir: dir, bin: bin, AdminToken: "admin-" + randomHex(8), AuditLog: filepath.Join(dir, "audit.log")}
	defer func() {
		if err != nil {
			cp.Stop()
		}
	}()
	ports, err := freePorts(3)
	if err != nil {
		return nil, err
	}
	etcdURL := fmt.Sprintf("http://127.0.0.1:%d", ports[0])
	peerURL := fmt.Sprintf("http://127.0.0.1:%d", ports[1])
	cp.etcd, err = cp.start("etcd", "--name=test", "--data-dir="+filepath.Join(dir, "etcd"),
		"--listen-client-urls="+etcdURL, "--advertise-client-urls="+etcdURL,
		"--listen-peer-urls="+peerURL, "--initial-advertise-peer-urls="+peerURL,
		"--initial-cluster=test="+peerURL, "--unsafe-no-fsync", "--log-level=warn",
		// fleetbench's 65,000 Nodes of 22 KB, created and then patched,
		// pass etcd's default quota of 2 GiB.
		"--quota-backend-bytes=8589934592")
	if err != nil {
		return nil, err
	}
	if err := writeFiles(dir, cp.AdminToken); err != nil {
		return nil, err
	}
	if cp.clientCA, cp.clientKey, err = writeClientCA(filepath.Join(dir, "client-ca.crt")); err != nil {
		return nil, err
	}
	cp.URL = fmt.Sprintf("https://127.0.0.1:%d", ports[2])
	cp.apiArgs = []string{
		"--etcd-servers=" + etcdURL,
		"--bind-address=127.0.0.1", fmt.Sprintf("--secure-port=%d", ports[2]),
		"--advertise-address=127.0.0.1", "--endpoint-reconciler-type=none",
		"--cert-dir=" + filepath.Join(dir, "certs"),
		"--authorization-mode=Node,RBAC",
		"--token-auth-file=" + filepath.Join(dir, "tokens.csv"),
		// Kubelets authenticate with client certificates signed by this CA
		// (WriteNodeKubeconfig), as system:node:NAME.
		"--client-ca-file=" + filepath.Join(dir, "client-ca.crt"),
		"--service-account-issuer=https://kubernetes.default.svc",
		"--service-account-key-file=" + filepath.Join(dir, "sa.pub"),
		"--service-account-signing-key-file=" + filepath.Join(dir, "sa.key"),
		"--service-cluster-ip-range=10.0.0.0/24",
		"--audit-policy-file=" + filepath.Join(dir, "audit-policy.yaml"),
		"--audit-log-path=" + cp.AuditLog, "--audit-log-mode=blocking",
	}
	if err := cp.StartAPIServer(ctx); err != nil {
		return nil, err
	}
	return cp, nil
}

// StartAPIServer starts kube-apiserver (again, after StopAPIServer) on the
// same port and storage, and waits until it is ready.
func (cp *ControlPlane) StartAPIServer(ctx context.Context) error {
	start := time.Now()
	var err error
	if cp.api, err = cp.start("kube-apiserver", cp.apiArgs...); err != nil {
		return err
	}
	if err := cp.waitReady(ctx); err != nil {
		return fmt.Errorf("%w; kube-apiserver's log ends:\n%s", err, tail(cp.api.log, 30))
	}
	cp.StartupTime = time.Since(start)
	return nil
}

// APIServerPID is the running kube-apiserver's process id (fleetbench
// reads its CPU time from /proc).
func (cp *ControlPlane) APIServerPID() int { return cp.api.cmd.Process.Pid }

// StopAPIServer stops kube-apiserver; etcd keeps the cluster's state.
func (cp *ControlPlane) StopAPIServer() { cp.api.stop() }

// Stop stops both, API server first. It may be called more than once.
func (cp *ControlPlane) Stop() {
	if cp.api != nil {
		cp.api.stop()
	}
	if cp.etcd != nil {
		cp.etcd.stop()
	}
}

// Config is a client configuration with the given bearer token.
func (cp *ControlPlane) Config(token string) *rest.Config {
	return &rest.Config{Host: cp.URL, BearerToken: token, TLSClientConfig: rest.TLSClientConfig{CAData: cp.CA}}
}

// WriteKubeconfig writes a kubeconfig for token to path.
func (cp *ControlPlane) WriteKubeconfig(path, token string) error {
	c := clientcmdapi.NewConfig()
	c.Clusters["test"] = &clientcmdapi.Cluster{Server: cp.URL, CertificateAuthorityData: cp.CA}
	c.AuthInfos["user"] = &clientcmdapi.AuthInfo{Token: token}
	c.Contexts["test"] = &clientcmdapi.Context{Cluster: "test", AuthInfo: "user"}
	c.CurrentContext = "test"
	return clientcmd.WriteToFile(*c, path)
}

// WriteNodeKubeconfig writes a kubeconfig for a kubelet of node name to
// path: a client certificate of system:node:NAME in the group
// system:nodes, as kubelets are authenticated, so that the Node
// authorizer gives it what a kubelet may do and nothing more.
func (cp *ControlPlane) WriteNodeKubeconfig(path, node string) error {
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return err
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()),
		Subject:      pkix.Name{CommonName: "system:node:" + node, Organization: []string{"system:nodes"}},
		NotBefore:    time.Now().Add(-time.Minute), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage:    x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, cp.clientCA, &key.PublicKey, cp.clientKey)
	if err != nil {
		return err
	}
	c := clientcmdapi.NewConfig()
	c.Clusters["test"] = &clientcmdapi.Cluster{Server: cp.URL, CertificateAuthorityData: cp.CA}
	c.AuthInfos["kubelet"] = &clientcmdapi.AuthInfo{
		ClientCertificateData: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		ClientKeyData:         pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key)}),
	}
	c.Contexts["test"] = &clientcmdapi.Context{Cluster: "test", AuthInfo: "kubelet"}
	c.CurrentContext = "test"
	return clientcmd.WriteToFile(*c, path)
}

// writeClientCA writes a new CA for client certificates to path.
func writeClientCA(path string) (*x509.Certificate, *rsa.PrivateKey, error) {
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return nil, nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test-client-ca"},
		NotBefore: time.Now().Add(-time.Minute), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature, BasicConstraintsValid: true, IsCA: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, nil, err
	}
	ca, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, nil, err
	}
	return ca, key, os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600)
}

// Get fetches path from the API server as the admin (for /metrics).
func (cp *ControlPlane) Get(ctx context.Context, path string) (string, error) {
	hc, err := cp.httpClient()
	if err != nil {
		return "", err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, cp.URL+path, nil)
	if err != nil {
		return "", err
	}
	req.Header.Set("Authorization", "Bearer "+cp.AdminToken)
	resp, err := hc.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return string(b), fmt.Errorf("GET %s: %s", path, resp.Status)
	}
	return string(b), err
}

func (cp *ControlPlane) httpClient() (*http.Client, error) {
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(cp.CA) {
		return nil, errors.New("the API server's certificate is not PEM")
	}
	return &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}, nil
}

// waitReady polls /readyz until it answers ok. The serving certificate is
// written by kube-apiserver when it starts; until then there is nothing to
// trust.
func (cp *ControlPlane) waitReady(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	var last error
	for {
		select {
		case <-ctx.Done():
			return fmt.Errorf("kube-apiserver was not ready in time: %v", last)
		case <-cp.api.done:
			return errors.New("kube-apiserver exited")
		case <-tick.C:
		}
		if ca, err := os.ReadFile(filepath.Join(cp.dir, "certs", "apiserver.crt")); err == nil {
			cp.CA = ca
			var body string
			if body, last = cp.Get(ctx, "/readyz"); last == nil && strings.TrimSpace(body) == "ok" {
				return nil
			}
		}
	}
}

func (cp *ControlPlane) start(name string, args ...string) (*process, error) {
	log := filepath.Join(cp.dir, name+".log")
	f, err := os.Create(log)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(filepath.Join(cp.bin, name), args...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL} // never outlive the test
	if err := cmd.Start(); err != nil {
		f.Close()
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	p := &process{cmd: cmd, log: log, done: make(chan struct{})}
	go func() {
		cmd.Wait()
		f.Close()
		close(p.done)
	}()
	return p, nil
}

// stop ends the process: SIGTERM, then SIGKILL after 15s.
func (p *process) stop() {
	select {
	case <-p.done:
		return
	default:
	}
	p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(15 * time.Second):
		p.cmd.Process.Kill()
		<-p.done
	}
}

// writeFiles writes the API server's inputs: the admin's token, a
// service-account signing key, and the audit policy.
func writeFiles(dir, adminToken string) error {
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return err
	}
	pub, err := x509.MarshalPKIXPublicKey(&key.PublicKey)
	if err != nil {
		return err
	}
	files := map[string][]byte{
		"tokens.csv": fmt.Appendf(nil, "%s,admin,admin,system:masters\n", adminToken),
		"sa.key":     pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key)}),
		"sa.pub":     pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pub}),
		// Every request's metadata: who, with which user agent, what.
		"audit-policy.yaml": []byte("apiVersion: audit.k8s.io/v1\nkind: Policy\nomitStages: [RequestReceived]\nrules:\n- level: Metadata\n"),
	}
	for name, b := range files {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
			return err
		}
	}
	return nil
}

// freePorts finds n free loopback ports.
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

func randomHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return fmt.Sprintf("%x", b)
}

// tail is the last n lines of a file.
func tail(path string, n int) string {
	b, _ := os.ReadFile(path)
	lines := bytes.Split(bytes.TrimRight(b, "\n"), []byte("\n"))
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return string(bytes.Join(lines, []byte("\n")))
}
