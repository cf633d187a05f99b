// Package kubeletstate reads what the running kubelet holds, and keeps
// what the reads showed: the kubelet's own evidence of the node's plugins,
// for kubenode to judge.
//
//	its /metrics (secure port)   plugin_manager_total_plugins: the sockets its
//	                             plugin manager has registered (actual state) and
//	                             seen (desired state); process_start_time_seconds
//	its pod-resources socket     the devices it can allocate now
//
// Files by job: client.go reads the kubelet once (Client: /metrics, the
// devices, a held connection) and names why a read failed (classify);
// peer.go checks that what answers at the kubelet's address is the
// kubelet; watch.go says when to read (Watch: reads that follow change, a
// held connection, a slow resync) and keeps what the reads showed (the
// runs of each socket path, a restart, an impostor); Now is what kubenode
// reads of it, at one instant.
package kubeletstate

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"k8s.io/client-go/rest"
	podresv1 "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/plugd/plugd/internal/kubeconfig"
	"github.com/plugd/plugd/internal/smallfile"
)

// Config says where plugd reads what the running kubelet holds: its
// /metrics on its secure port (the sockets its plugin manager has seen and
// registered, and when it started) and its pod-resources socket (the
// devices it can allocate).
type Config struct {
	// Address is the kubelet's secure port, HOST:PORT. Empty: plugd does
	// not read the kubelet, and infers what it registered from the API's
	// objects (reason Inferred).
	Address string
	// ServerName is the name the kubelet's serving certificate must hold.
	// Empty means NodeName (a self-signed kubelet certificate holds the
	// node's hostname).
	ServerName string
	// CAFile verifies the kubelet's serving certificate: for a self-signed
	// one, the kubelet's own kubelet.crt (in its --cert-dir). Empty means
	// the API server's CA, which signs the kubelet's certificate when
	// serverTLSBootstrap is on.
	CAFile string
	// InsecureSkipVerify reads the kubelet without verifying who answers.
	// plugd warns when it is set.
	InsecureSkipVerify bool
	// PodResources is the kubelet's pod-resources socket. Empty: a device
	// plugin's healthy devices are the Node's allocatable, which the
	// kubelet reports every nodeStatusUpdateFrequency.
	PodResources string
	// RegistryDir is the registry directory as the kubelet names it (the
	// paths in its metrics), when plugd sees it under another path. Empty
	// means Config.RegistryDir.
	RegistryDir string
	// Resync is how often the kubelet is read when nothing says it
	// changed. Zero means 5 minutes.
	Resync time.Duration
}

// Bounds of the reads of the kubelet.
const (
	// maxMetricsWire and maxMetricsText bound the kubelet's /metrics as
	// sent (gzipped) and as text; a kubelet with many pods serves a few
	// MB of text. An answer larger is an error, not cut.
	maxMetricsWire = 16 << 20
	maxMetricsText = 64 << 20
	// maxMetricsLine bounds one line of it; longer ones are skipped.
	maxMetricsLine = 64 << 10
	// maxMetricsChunk is how much of the text of the metrics plugd reads
	// is parsed at once (scanMetrics).
	maxMetricsChunk = 256 << 10
	// maxKubeletSockets bounds the sockets taken from its metrics;
	// maxPluginSamples the plugin manager's samples parsed, two a socket.
	maxKubeletSockets = 20000
	maxPluginSamples  = 2 * maxKubeletSockets
)

// The metric names plugd reads. The kubelet's plugin manager's gauge is
// registered without a subsystem; both spellings are taken.
var kubeletMetrics = map[string]bool{
	"plugin_manager_total_plugins":         true,
	"kubelet_plugin_manager_total_plugins": true,
	"process_start_time_seconds":           true,
}

// Reading is what one read of the kubelet found.
type Reading struct {
	At time.Time
	// Started is the kubelet's process_start_time_seconds.
	Started time.Time
	// Registered and Seen are the sockets in its plugin manager's actual
	// and desired states, by plugd's path of them.
	Registered, Seen map[string]bool
	// PluginMetric says the answer held the plugin manager's metric at
	// all. The kubelet leaves it out while its plugin manager holds no
	// socket; a kubelet that renamed it (it is ALPHA: its name may change
	// in any minor) leaves it out always.
	PluginMetric bool
	// Bytes is the size of its /metrics answer, as it came (compressed).
	Bytes int64
	// Devices are its allocatable devices by resource, when pod-resources
	// is configured and answered; DevicesErr when it did not.
	Devices    map[string]int
	DevicesErr error
}

// Client reads the kubelet. Its zero value is not usable: see
// NewClient.
type Client struct {
	cfg      Config
	url      string
	pr       *grpc.ClientConn
	toPlugd  func(string) (string, bool)
	insecure bool
	// trusted says which owners of a listening socket at the address may
	// be the kubelet (peer.go): kubeletUID; tests narrow it.
	trusted func(uid uint32) bool
	// timeout bounds each read and dial (timeout); tests shorten it.
	timeout time.Duration
	// rc is the client configuration the transport is built from; its
	// CAData is replaced when kubernetes.kubelet.caFile changes.
	rc *rest.Config

	mu  sync.Mutex
	hc  *http.Client // guarded by mu
	tls *tls.Config  // guarded by mu: for the held connection
	ca  []byte       // guarded by mu: caFile's content as last read
}

// NewClient builds the client from the API's client configuration
// (its credentials: the ServiceAccount's token) and cfg. Nothing is
// dialled until a read.
func NewClient(cfg Config, api *rest.Config, nodeName, registryDir string) (*Client, error) {
	if _, _, err := net.SplitHostPort(cfg.Address); err != nil {
		return nil, fmt.Errorf("kubernetes.kubelet.address %q: %w: write it as HOST:PORT, such as 10.0.0.5:10250", cfg.Address, err)
	}
	rc := rest.CopyConfig(api)
	rc.Host = "https://" + cfg.Address
	rc.APIPath = ""
	rc.TLSClientConfig = rest.TLSClientConfig{ServerName: cfg.ServerName, Insecure: cfg.InsecureSkipVerify,
		// The client's own certificate, if the kubeconfig has one: the
		// kubelet accepts it when its client CA signed it.
		CertFile: api.CertFile, KeyFile: api.KeyFile, CertData: api.CertData, KeyData: api.KeyData}
	if rc.TLSClientConfig.ServerName == "" {
		rc.TLSClientConfig.ServerName = nodeName
	}
	c := &Client{cfg: cfg, url: rc.Host, insecure: cfg.InsecureSkipVerify, trusted: kubeletUID, rc: rc, timeout: timeout}
	switch {
	case cfg.InsecureSkipVerify:
	case cfg.CAFile != "":
		// Read here, bounded and without blocking, as the kubeconfig's
		// files are: client-go would read /dev/zero until memory ran out,
		// and wait on a FIFO for ever. Read again when the kubelet's
		// certificate does not verify (reloadCA).
		pem, err := kubeconfig.ReadFile(cfg.CAFile, "a PEM file (the kubelet's kubelet.crt)")
		if err != nil {
			return nil, fmt.Errorf("kubernetes.kubelet.caFile: %w", err)
		}
		rc.TLSClientConfig.CAData, c.ca = pem, pem
	default:
		rc.TLSClientConfig.CAFile, rc.TLSClientConfig.CAData = api.CAFile, api.CAData
	}
	// Who listens is checked before TLS, and so before the token.
	rc.Dial = func(ctx context.Context, _, addr string) (net.Conn, error) {
		return c.dial(ctx, addr)
	}
	if err := c.buildTransport(rc); err != nil {
		return nil, err
	}
	from := cmpOr(cfg.RegistryDir, registryDir)
	c.toPlugd = func(p string) (string, bool) {
		rel, err := filepath.Rel(from, p)
		if err != nil || rel == ".." || strings.HasPrefix(rel, "../") {
			return "", false
		}
		return filepath.Join(registryDir, rel), true
	}
	if cfg.PodResources != "" {
		var err error
		if c.pr, err = grpc.NewClient("unix://"+cfg.PodResources, grpc.WithTransportCredentials(insecure.NewCredentials())); err != nil {
			return nil, fmt.Errorf("kubernetes.kubelet.podResources: %w", err)
		}
	}
	return c, nil
}

// buildTransport makes the HTTP client and the held connection's TLS
// configuration from rc.
func (c *Client) buildTransport(rc *rest.Config) error {
	rt, err := rest.TransportFor(rc)
	if err != nil {
		return fmt.Errorf("kubernetes.kubelet: %w", err)
	}
	tc, err := rest.TLSConfigFor(rc)
	if err != nil {
		return fmt.Errorf("kubernetes.kubelet: %w", err)
	}
	if tc == nil {
		tc = &tls.Config{}
	}
	tc = tc.Clone()
	// HTTP/1.1 only on the held connection: an HTTP/2 server closes a
	// connection that sends no preface within seconds.
	tc.NextProtos = []string{"http/1.1"}
	c.mu.Lock()
	old := c.hc
	c.tls, c.hc = tc, &http.Client{Transport: rt, Timeout: c.timeout}
	c.mu.Unlock()
	if old != nil {
		old.CloseIdleConnections()
	}
	return nil
}

// transport is the HTTP client and the held connection's TLS
// configuration in use.
func (c *Client) transport() (*http.Client, *tls.Config) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.hc, c.tls
}

// reloadCA reads kubernetes.kubelet.caFile again, as a certificate of the
// kubelet's failed to verify: the kubelet's kubelet.crt, regenerated or
// rotated while plugd runs, would otherwise never verify again. It says
// whether the file changed, and the transport with it.
func (c *Client) reloadCA() (bool, error) {
	if c.cfg.CAFile == "" || c.insecure {
		return false, nil
	}
	pem, err := kubeconfig.ReadFile(c.cfg.CAFile, "a PEM file (the kubelet's kubelet.crt)")
	if err != nil {
		return false, fmt.Errorf("kubernetes.kubelet.caFile: %w", err)
	}
	c.mu.Lock()
	same := bytes.Equal(pem, c.ca)
	c.mu.Unlock()
	if same {
		return false, nil
	}
	rc := rest.CopyConfig(c.rc)
	rc.TLSClientConfig.CAData = pem
	if err := c.buildTransport(rc); err != nil {
		return false, err
	}
	c.mu.Lock()
	c.ca = pem
	c.mu.Unlock()
	return true, nil
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

func (c *Client) close() {
	hc, _ := c.transport()
	hc.CloseIdleConnections()
	if c.pr != nil {
		c.pr.Close()
	}
}

// readMetrics GETs /metrics and keeps the samples plugd needs.
func (c *Client) readMetrics(ctx context.Context) (Reading, error) {
	s := Reading{Registered: map[string]bool{}, Seen: map[string]bool{}}
	ctx, cancel := context.WithTimeoutCause(ctx, c.timeout, fmt.Errorf("the kubelet did not answer within %s", c.timeout))
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.url+"/metrics", nil)
	if err != nil {
		return s, err
	}
	req.Header.Set("Accept", string(expfmt.NewFormat(expfmt.TypeTextPlain)))
	req.Header.Set("Accept-Encoding", "gzip") // set by hand, so that the wire size can be counted
	hc, _ := c.transport()
	resp, err := hc.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			err = fmt.Errorf("%w (%w)", err, context.Cause(ctx))
		}
		return s, err
	}
	defer resp.Body.Close()
	counted := &countingReader{r: resp.Body, max: maxMetricsWire, what: "as sent"}
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(counted, 512))
		return s, &httpError{code: resp.StatusCode, body: strings.TrimSpace(string(b))}
	}
	var body io.Reader = counted
	if resp.Header.Get("Content-Encoding") == "gzip" {
		zr, err := gzip.NewReader(counted)
		if err != nil {
			return s, fmt.Errorf("the kubelet's /metrics: %w", err)
		}
		body = zr
	}
	body = &countingReader{r: body, max: maxMetricsText, what: "uncompressed"}
	err = scanMetrics(body, func(families map[string]*dto.MetricFamily) { c.fold(&s, families) })
	s.Bytes = counted.n
	if err != nil {
		return s, fmt.Errorf("reading the kubelet's /metrics: %w", err)
	}
	if s.Started.IsZero() {
		return s, errors.New("the kubelet's /metrics has no process_start_time_seconds")
	}
	return s, nil
}

// fold takes into s what families, one chunk's parse of the kubelet's
// metrics, say: the first start time, and the sockets of its plugin
// manager, at most maxKubeletSockets of them.
func (c *Client) fold(s *Reading, families map[string]*dto.MetricFamily) {
	if f := families["process_start_time_seconds"]; f != nil && len(f.Metric) > 0 && s.Started.IsZero() {
		v := f.Metric[0].GetGauge().GetValue()
		if v > 0 && v < math.MaxInt32 {
			sec, frac := math.Modf(v)
			s.Started = time.Unix(int64(sec), int64(frac*1e9))
		}
	}
	for name, f := range families {
		if !strings.HasSuffix(name, "plugin_manager_total_plugins") {
			continue
		}
		s.PluginMetric = true
		for _, m := range f.Metric {
			var path, state string
			for _, l := range m.Label {
				switch l.GetName() {
				case "socket_path":
					path = l.GetValue()
				case "state":
					state = l.GetValue()
				}
			}
			p, ok := c.toPlugd(path)
			if !ok || m.GetGauge().GetValue() < 1 || len(s.Registered)+len(s.Seen) >= maxKubeletSockets {
				continue
			}
			switch state {
			case "actual_state_of_world":
				s.Registered[p] = true
			case "desired_state_of_world":
				s.Seen[p] = true
			}
		}
	}
}

// scanMetrics reads the exposition text r and hands the metrics plugd reads
// to fold, parsed by expfmt a chunk of at most maxMetricsChunk bytes at a
// time, each chunk headed by the # TYPE lines seen so far. The parser's
// objects are about 11 times the text they come from: parsed whole, a
// kubelet's (or an impostor's) answer of 64 MiB took gigabytes; a chunk at
// a time, memory stays within a few MiB whatever the answer's size. Lines
// of other metrics are skipped unparsed, and so are lines longer than
// maxMetricsLine and the plugin manager's samples past maxPluginSamples
// (each socket is at most two: plugd takes maxKubeletSockets).
func scanMetrics(r io.Reader, fold func(map[string]*dto.MetricFamily)) error {
	br := bufio.NewReaderSize(r, maxMetricsLine)
	var types, chunk bytes.Buffer
	typed := map[string]bool{}
	samples := 0
	flush := func() error {
		if chunk.Len() == 0 {
			return nil
		}
		parser := expfmt.NewTextParser(model.UTF8Validation)
		families, err := parser.TextToMetricFamilies(io.MultiReader(bytes.NewReader(types.Bytes()), &chunk))
		chunk.Reset()
		if err != nil {
			return err
		}
		fold(families)
		return nil
	}
	skipping := false
	for {
		line, err := br.ReadSlice('\n')
		switch {
		case errors.Is(err, bufio.ErrBufferFull):
			skipping = true
			continue
		case skipping:
			skipping = false
			if err == nil {
				continue
			}
		case len(line) > 0:
			keepLine(line, &types, &chunk, typed, &samples)
		}
		if err != nil && !errors.Is(err, io.EOF) {
			return err
		}
		if chunk.Len() >= maxMetricsChunk || err != nil {
			if ferr := flush(); ferr != nil {
				return ferr
			}
		}
		if err != nil {
			return nil
		}
	}
}

// keepLine puts line, if it is about a metric plugd reads, where
// scanMetrics wants it: a family's first # TYPE line in types, a sample in
// chunk (a plugin manager's up to maxPluginSamples of them).
func keepLine(line []byte, types, chunk *bytes.Buffer, typed map[string]bool, samples *int) {
	if rest, ok := bytes.CutPrefix(line, []byte("# TYPE ")); ok {
		name, _, _ := bytes.Cut(rest, []byte(" "))
		if kubeletMetrics[string(name)] && !typed[string(name)] {
			typed[string(name)] = true
			writeLine(types, line)
		}
		return
	}
	if line[0] == '#' {
		return
	}
	end := bytes.IndexAny(line, "{ ")
	if end <= 0 || !kubeletMetrics[string(line[:end])] {
		return
	}
	if bytes.HasSuffix(line[:end], []byte("plugin_manager_total_plugins")) {
		if *samples >= maxPluginSamples {
			return
		}
		*samples++
	}
	writeLine(chunk, line)
}

func writeLine(b *bytes.Buffer, line []byte) {
	b.Write(line)
	if line[len(line)-1] != '\n' {
		b.WriteByte('\n')
	}
}

// readDevices asks pod-resources for the devices the kubelet can
// allocate (its healthy devices), by resource.
func (c *Client) readDevices(ctx context.Context) (map[string]int, error) {
	ctx, cancel := context.WithTimeoutCause(ctx, c.timeout, fmt.Errorf("pod-resources did not answer within %s", c.timeout))
	defer cancel()
	r, err := podresv1.NewPodResourcesListerClient(c.pr).GetAllocatableResources(ctx, &podresv1.AllocatableResourcesRequest{},
		grpc.MaxCallRecvMsgSize(16<<20))
	if err != nil {
		return nil, fmt.Errorf("pod-resources %s: GetAllocatableResources: %w", c.cfg.PodResources, err)
	}
	out := map[string]int{}
	for _, d := range r.GetDevices() {
		out[d.GetResourceName()] += len(d.GetDeviceIds())
	}
	return out, nil
}

// hold connects to the kubelet's secure port and holds the connection,
// idle, until it ends: the kubelet's process going away closes it at once.
// It returns when the connection ends or ctx is done, with why; connected
// says the connection was made (and verified).
func (c *Client) hold(ctx context.Context, connected func()) error {
	dctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	raw, err := c.dial(dctx, c.cfg.Address)
	if err != nil {
		return err
	}
	_, tc := c.transport()
	conn := tls.Client(raw, tc)
	defer conn.Close()
	if err := conn.HandshakeContext(dctx); err != nil {
		return err
	}
	cancel()
	connected()
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()
	// The kubelet never writes to a connection that sent no request: a
	// read returns when it is closed. Its server waits 4 hours for a
	// request before it closes one itself.
	_, err = conn.Read(make([]byte, 1))
	if ctx.Err() != nil {
		return ctx.Err()
	}
	if err == nil {
		err = errors.New("the kubelet wrote on an idle connection")
	}
	return err
}

// httpError is an answer of the kubelet other than 200.
type httpError struct {
	code int
	body string
}

func (e *httpError) Error() string {
	return fmt.Sprintf("the kubelet answered %d %s: %s", e.code, http.StatusText(e.code), e.body)
}

// Problem is why the kubelet cannot be read, and what fixes it; it has
// the fields of kubenode's Problem, which converts it.
type Problem struct {
	Operation, Reason, Message string
	// Permission is, for ReasonForbidden, the permission plugd lacks.
	Permission string
	Since      time.Time
}

// The reasons a kubelet cannot be read, also the reasons of a Problem.
const (
	ReasonNotRunning           = "KubeletNotRunning"   // nothing listens at its address
	ReasonUnreachable          = "KubeletUnreachable"  // no answer: a timeout, no route
	ReasonTLS                  = "KubeletTLS"          // its serving certificate is not trusted
	ReasonForbidden            = "KubeletForbidden"    // plugd lacks nodes/metrics
	ReasonUnauthorized         = "KubeletUnauthorized" // it does not accept plugd's credentials
	ReasonDisabled             = "KubeletDisabled"     // kubernetes.kubelet.address is not set
	ReasonBadAnswer            = "KubeletBadAnswer"    // it answered something else
	kubeletPermission          = "get nodes/metrics"
	kubeletMetricsDocumentedAt = "the kubelet's /metrics"
)

// classify names why the kubelet at addr could not be read, and
// what fixes it.
func classify(cfg Config, err error, since time.Time) *Problem {
	op := "read the kubelet's /metrics at " + cfg.Address
	p := &Problem{Operation: op, Since: since}
	msg := err.Error()
	var he *httpError
	var ua x509.UnknownAuthorityError
	var hn x509.HostnameError
	var ci x509.CertificateInvalidError
	var tlsErr *tls.CertificateVerificationError
	var ne net.Error
	var nk *notKubeletError
	switch {
	case errors.As(err, &nk):
		p.Reason = ReasonNotRunning
		p.Message = nk.Error() + ": the kubelet is not running, or another process took its port; see who listens with ss -ltnp"
	case errors.Is(err, errUnverifiable):
		p.Reason = ReasonTLS
		p.Message = msg
	case errors.Is(err, syscall.ECONNREFUSED):
		p.Reason = ReasonNotRunning
		p.Message = fmt.Sprintf("nothing listens at %s: the kubelet is not running (or kubernetes.kubelet.address is not its secure port): %s", cfg.Address, msg)
	case errors.As(err, &ua) || errors.As(err, &hn) || errors.As(err, &ci) || errors.As(err, &tlsErr):
		p.Reason = ReasonTLS
		p.Message = fmt.Sprintf("cannot verify the kubelet at %s: %s. A self-signed kubelet certificate is its kubelet.crt (in its --cert-dir, /var/lib/kubelet/pki): mount it read-only and set kubernetes.kubelet.caFile to it; "+
			"or turn on the kubelet's serverTLSBootstrap, so that the cluster CA signs it; kubernetes.kubelet.serverName is the name it must hold (default the node name)", cfg.Address, msg)
	case errors.As(err, &he) && he.code == http.StatusForbidden:
		p.Reason, p.Permission = ReasonForbidden, kubeletPermission
		p.Message = fmt.Sprintf("the kubelet refuses plugd its /metrics: plugd lacks the permission %q (the ClusterRole plugd in deploy/kubernetes grants it): %s", kubeletPermission, msg)
	case errors.As(err, &he) && he.code == http.StatusUnauthorized:
		p.Reason = ReasonUnauthorized
		p.Message = fmt.Sprintf("the kubelet does not accept plugd's token: turn on its webhook authentication (authentication.webhook.enabled in its KubeletConfiguration, --authentication-token-webhook) and authorization mode Webhook: %s", msg)
	case errors.As(err, &ne) || errors.Is(err, context.DeadlineExceeded):
		p.Reason = ReasonUnreachable
		p.Message = fmt.Sprintf("the kubelet at %s does not answer: %s (is kubernetes.kubelet.address the node's address and the kubelet's port, and does a firewall or NetworkPolicy let plugd reach it?)", cfg.Address, msg)
	default:
		p.Reason = ReasonBadAnswer
		p.Message = fmt.Sprintf("cannot read %s at %s: %s", kubeletMetricsDocumentedAt, cfg.Address, msg)
	}
	return p
}

// countingReader counts the bytes read through it, and fails a read past
// max of them (zero: no bound) with an error that says which bound (what).
type countingReader struct {
	r    io.Reader
	n    int64
	max  int64
	what string
}

func (c *countingReader) Read(p []byte) (int, error) {
	if c.max > 0 && int64(len(p)) > c.max+1-c.n {
		p = p[:c.max+1-c.n]
	}
	n, err := c.r.Read(p)
	c.n += int64(n)
	if c.max > 0 && c.n > c.max {
		return n, fmt.Errorf("the answer is larger than %s %s, more than a kubelet's /metrics: is kubernetes.kubelet.address the kubelet's?", smallfile.Size(int(c.max)), c.what)
	}
	return n, err
}
