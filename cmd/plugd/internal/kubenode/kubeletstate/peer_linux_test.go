package kubeletstate

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/binary"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/client-go/rest"

	"github.com/plugd/plugd/internal/testenv"
)

// Issue 33, item 6: once the kubelet has exited, any local user may
// listen on its port. A listener there whose owner the kubelet does not
// run as is not the kubelet: plugd sends it nothing (no token, with
// verified TLS or with insecureSkipTLSVerify), and the kubelet counts as
// not running (before, the condition went from False "the kubelet is not
// running" to True/Inferred, and with insecureSkipTLSVerify the listener
// got plugd's token). The listener is the test's own TLS server on
// loopback; the owners taken for the kubelet's are narrowed to exclude
// the test's user, since a listener of another user needs root to start.
func TestKubeletImpostor(t *testing.T) {
	var mu sync.Mutex
	var seen []string // the Authorization headers the listener got
	srv, ca := tlsServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen = append(seen, r.Header.Get("Authorization"))
		mu.Unlock()
		fmt.Fprint(w, metricsText)
	}))
	addr := srv.Listener.Addr().String()
	me := uint32(os.Geteuid())
	notMe := func(uid uint32) bool { return uid != me }
	for _, cfg := range []Config{{Address: addr, CAFile: ca}, {Address: addr, InsecureSkipVerify: true}} {
		c, err := NewClient(cfg, &rest.Config{BearerToken: "secret"}, "example.com", "/r")
		if err != nil {
			t.Fatal(err)
		}
		defer c.close()
		c.trusted = notMe
		if _, err = c.readMetrics(context.Background()); err == nil {
			t.Errorf("insecure %v: read what is not the kubelet", cfg.InsecureSkipVerify)
			continue
		}
		p := classify(cfg, err, time.Now())
		if want := fmt.Sprintf("runs as uid %d", me); p.Reason != ReasonNotRunning || !strings.Contains(p.Message, want) {
			t.Errorf("insecure %v: read: %v: %s: %s; want %s saying %q", cfg.InsecureSkipVerify, err, p.Reason, p.Message, ReasonNotRunning, want)
		}
		connected := false
		if err := c.hold(context.Background(), func() { connected = true }); connected || err == nil {
			t.Errorf("insecure %v: the held connection was made (%v)", cfg.InsecureSkipVerify, err)
		}

		// What plugd makes of it: not running, and why.
		w, clk := newTestWatch(t, c, cfg)
		w.read(context.Background(), clk.Now(), true, false)
		ev := w.Evidence()
		if ev.Problem == nil || ev.Problem.Reason != ReasonNotRunning || !strings.Contains(ev.Impostor, "is not the kubelet") {
			t.Errorf("insecure %v: evidence %+v, impostor %q", cfg.InsecureSkipVerify, ev.Problem, ev.Impostor)
		}
	}
	mu.Lock()
	if len(seen) != 0 {
		t.Errorf("the listener that is not the kubelet got %d requests, with Authorization %q", len(seen), seen)
	}
	mu.Unlock()

	// The same listener, owned by a user the kubelet may run as: read, with
	// the token.
	c, err := NewClient(Config{Address: addr, InsecureSkipVerify: true}, &rest.Config{BearerToken: "secret"}, "example.com", "/r")
	if err != nil {
		t.Fatal(err)
	}
	defer c.close()
	if _, err := c.readMetrics(context.Background()); err != nil {
		t.Fatalf("a listener of a trusted user: %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(seen) != 1 || seen[0] != "Bearer secret" {
		t.Errorf("a listener of a trusted user got %q", seen)
	}
}

// A server at the kubelet's address whose certificate does not verify is
// taken for an impostor (the kubelet not running) only once plugd has
// seen the kubelet go and verified none since; while the kubelet runs
// (plugd read it, nothing said it went), it is the kubelet's certificate
// that plugd cannot verify (expired, rotated, a new CA): the kubelet
// unreadable, as before any kubelet was read.
func TestKubeletImpostorUnverified(t *testing.T) {
	kubeletCA := filepath.Join(t.TempDir(), "kubelet.crt") // the kubelet that exited: its own certificate
	if err := os.WriteFile(kubeletCA, selfSigned(t), 0o600); err != nil {
		t.Fatal(err)
	}
	srv, _ := tlsServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, metricsText) }))
	cfg := Config{Address: srv.Listener.Addr().String(), CAFile: kubeletCA}
	for _, tc := range []struct {
		name       string
		read, gone bool
	}{{"never read", false, false}, {"read, running", true, false}, {"read, then gone", true, true}} {
		c, err := NewClient(cfg, &rest.Config{BearerToken: "secret"}, "example.com", "/r")
		if err != nil {
			t.Fatal(err)
		}
		defer c.close()
		w, clk := newTestWatch(t, c, cfg)
		if tc.read {
			w.rec.started = clk.Now().Add(-time.Hour)
		}
		w.rec.gone = tc.gone
		w.read(context.Background(), clk.Now(), true, false)
		ev := w.Evidence()
		switch {
		case tc.gone && (ev.Problem == nil || !strings.Contains(ev.Impostor, "cannot show a certificate plugd verifies")):
			t.Errorf("%s: evidence %+v, impostor %q", tc.name, ev.Problem, ev.Impostor)
		case !tc.gone && (ev.Impostor != "" || ev.Problem == nil || ev.Problem.Reason != ReasonTLS):
			t.Errorf("%s: impostor %q, problem %+v", tc.name, ev.Impostor, ev.Problem)
		}
	}
}

// A kubelet whose serving certificate is regenerated while it runs: plugd
// cannot verify it (the kubelet unreadable, not gone) until caFile holds
// the new one, which plugd reads again when verification fails.
func TestKubeletCARotated(t *testing.T) {
	oldPEM, oldCert := selfSignedPair(t)
	newPEM, newCert := selfSignedPair(t)
	srv, serve := certServer(t, &oldCert)
	caFile := filepath.Join(t.TempDir(), "kubelet.crt")
	if err := os.WriteFile(caFile, oldPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := Config{Address: srv.Listener.Addr().String(), CAFile: caFile}
	c, err := NewClient(cfg, &rest.Config{BearerToken: "secret"}, "example.com", "/r")
	if err != nil {
		t.Fatal(err)
	}
	defer c.close()
	w, clk := newTestWatch(t, c, cfg)
	read := func() Evidence {
		t.Helper()
		w.read(context.Background(), clk.Now(), true, false)
		return w.Evidence()
	}
	if ev := read(); !live(ev) {
		t.Fatalf("the kubelet not read: %+v", ev.Problem)
	}
	serve(&newCert)
	if ev := read(); ev.Impostor != "" || ev.Problem == nil || ev.Problem.Reason != ReasonTLS {
		t.Errorf("a certificate rotated while the kubelet runs: impostor %q, problem %+v; want the kubelet unverified, not gone", ev.Impostor, ev.Problem)
	}
	if err := os.WriteFile(caFile, newPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	if ev := read(); !live(ev) {
		t.Errorf("the new certificate in caFile not used: %+v", ev.Problem)
	}
}

// The owners of the listening sockets at an address are read from the
// kernel's tables; an address nobody listens on has none.
func TestListenerUIDs(t *testing.T) {
	srv, _ := tlsServer(t, http.NotFoundHandler())
	uids, local := listenerUIDs(srv.Listener.Addr())
	if !local || len(uids) != 1 || uids[0] != uint32(os.Geteuid()) {
		t.Errorf("listenerUIDs(%s) = %v, %v; want [%d], true", srv.Listener.Addr(), uids, local, os.Geteuid())
	}
	a := *srv.Listener.Addr().(*net.TCPAddr)
	srv.Close()
	if uids, local := listenerUIDs(&a); local || len(uids) != 0 {
		t.Errorf("a closed port: %v, %v", uids, local)
	}
}

// certServer is a kubelet's /metrics on loopback, serving cert until
// serve says another; each request on a new connection.
func certServer(t *testing.T, cert *tls.Certificate) (*httptest.Server, func(*tls.Certificate)) {
	t.Helper()
	var mu sync.Mutex
	serving := cert
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, metricsText) }))
	srv.TLS = &tls.Config{GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
		mu.Lock()
		defer mu.Unlock()
		return serving, nil
	}}
	srv.Config.SetKeepAlivesEnabled(false) // each read a new connection, and a handshake
	srv.StartTLS()
	t.Cleanup(srv.Close)
	return srv, func(c *tls.Certificate) {
		mu.Lock()
		defer mu.Unlock()
		serving = c
	}
}

// The held connection ending says the kubelet went: a server at its
// address whose certificate does not verify after that is not the
// kubelet, though the last read verified one and no read found the port
// closed (another process took it at once).
func TestKubeletGoneByHeldConnection(t *testing.T) {
	kubeletPEM, kubeletCert := selfSignedPair(t)
	_, otherCert := selfSignedPair(t)
	srv, serve := certServer(t, &kubeletCert)
	caFile := filepath.Join(t.TempDir(), "kubelet.crt")
	if err := os.WriteFile(caFile, kubeletPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := Config{Address: srv.Listener.Addr().String(), CAFile: caFile}
	c, err := NewClient(cfg, &rest.Config{BearerToken: "secret"}, "example.com", "/r")
	if err != nil {
		t.Fatal(err)
	}
	defer c.close()
	w, clk := newTestWatch(t, c, cfg)
	w.read(context.Background(), clk.Now(), true, false)
	if ev := w.Evidence(); !live(ev) {
		t.Fatalf("the kubelet not read: %+v", ev.Problem)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); w.holdLoop(ctx) }()
	defer func() { cancel(); <-done }()
	kicked := func(what string) {
		t.Helper()
		select {
		case <-w.kick:
		case <-time.After(testenv.Timeout):
			t.Fatal(what)
		}
	}
	kicked("the held connection not made")
	serve(&otherCert)
	srv.CloseClientConnections()
	kicked("the held connection's end not told")
	w.read(context.Background(), clk.Now(), true, false)
	if ev := w.Evidence(); ev.Impostor == "" {
		t.Errorf("after the held connection ended, a certificate that does not verify: impostor %q, problem %+v", ev.Impostor, ev.Problem)
	}
}

// selfSigned is a new self-signed certificate for example.com, PEM, as a
// kubelet makes its kubelet.crt (httptest's servers share one).
func selfSigned(t *testing.T) []byte {
	t.Helper()
	p, _ := selfSignedPair(t)
	return p
}

// selfSignedPair is selfSigned, and the certificate with its key to serve.
func selfSignedPair(t *testing.T) ([]byte, tls.Certificate) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "example.com"}, DNSNames: []string{"example.com"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

// Addresses as a little-endian kernel prints them in /proc/net/tcp and
// tcp6.
func TestParseProcAddr(t *testing.T) {
	if binary.NativeEndian.Uint16([]byte{1, 0}) != 1 {
		t.Skip("the samples are a little-endian kernel's")
	}
	for _, tc := range []struct{ in, ip string }{
		{"0100007F:2812", "127.0.0.1"},
		{"00000000:2812", "0.0.0.0"},
		{"00000000000000000000000001000000:2812", "::1"},
		{"00000000000000000000000000000000:2812", "::"},
		{"0000000000000000FFFF00000100007F:2812", "127.0.0.1"}, // IPv4-mapped, on a dual-stack socket
		{"B80D0120000000000000000001000000:2812", "2001:db8::1"},
	} {
		ip, port, ok := parseProcAddr(tc.in)
		if !ok || ip.String() != tc.ip || port != 10258 {
			t.Errorf("parseProcAddr(%s) = %v, %d, %v; want %s, 10258", tc.in, ip, port, ok, tc.ip)
		}
	}
	if _, _, ok := parseProcAddr("zz:1"); ok {
		t.Error("parsed a bad address")
	}
}
