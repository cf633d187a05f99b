package conformance

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	deviceapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/plugd/plugd/pluginmanager"
)

// kubeletSocketName is the device manager's socket in the device plugin
// directory, which device plugins call Register on.
const kubeletSocketName = "kubelet.sock"

// kubeletReregisterBound is how long the kubelet, restarted, waits for a
// device plugin to register again before it drops the plugin's resource
// from the Node's capacity (pkg/kubelet/cm/devicemanager/types.go
// endpointStopGracePeriod; readCheckpoint starts each resource stopped, at
// zero capacity, until its plugin registers).
const kubeletReregisterBound = 5 * time.Minute

// deviceManager plays the kubelet's device manager: it serves the device
// plugin Registration service on kubelet.sock in the endpoint directory,
// and hands on every Register it is sent.
type deviceManager struct {
	path string
	// requests has every Register call, in order; a call that finds it
	// full is refused.
	requests chan registerCall
	// connectWait bounds Register's connection to the plugin's endpoint:
	// the kubelet's 10 s, or the kit's timeout if shorter.
	connectWait time.Duration
	// first is closed at the first Register.
	first     chan struct{}
	firstOnce sync.Once

	mu   sync.Mutex
	srv  *grpc.Server
	done chan struct{} // closed when srv's Serve has returned
}

// registerCall is one Register call: its request, and the kubelet's
// answer to it (nil: registered).
type registerCall struct {
	req *deviceapi.RegisterRequest
	err error
}

// kubeletConnectWait is how long the kubelet's Register waits for the
// plugin's endpoint to accept a connection
// (pkg/kubelet/cm/devicemanager/plugin/v1beta1/client.go dial: 10 s).
const kubeletConnectWait = 10 * time.Second

// startDeviceManager serves kubelet.sock in dir; timeout is the kit's.
func startDeviceManager(dir string, timeout time.Duration) (*deviceManager, error) {
	dm := &deviceManager{path: filepath.Join(dir, kubeletSocketName),
		requests: make(chan registerCall, 16), first: make(chan struct{}), connectWait: min(timeout, kubeletConnectWait)}
	if c, err := net.DialTimeout("unix", dm.path, time.Second); err == nil {
		c.Close()
		return nil, fmt.Errorf("%s is served, by a kubelet most likely: the kit would take its place; name another --endpoint-dir", dm.path)
	}
	return dm, dm.serve()
}

// serve makes kubelet.sock anew and serves it, as the kubelet does at its
// start: a plugin watching the directory sees the socket made.
func (dm *deviceManager) serve() error {
	if err := os.Remove(dm.path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("removing %s: %w", dm.path, err)
	}
	l, err := net.Listen("unix", dm.path)
	if err != nil {
		return fmt.Errorf("serving the device manager's socket: %w", err)
	}
	srv := grpc.NewServer()
	deviceapi.RegisterRegistrationServer(srv, dmRegistration{dm: dm})
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(l)
	}()
	dm.mu.Lock()
	dm.srv, dm.done = srv, done
	dm.mu.Unlock()
	return nil
}

// stop stops serving and removes the socket, and waits for the server.
func (dm *deviceManager) stop() {
	dm.mu.Lock()
	srv, done := dm.srv, dm.done
	dm.srv = nil
	dm.mu.Unlock()
	if srv == nil {
		return
	}
	srv.Stop()
	<-done
	os.Remove(dm.path)
}

// restart plays a kubelet restart: the socket goes and is made anew.
func (dm *deviceManager) restart() error {
	dm.stop()
	return dm.serve()
}

// firstChan is closed at the first Register; nil (never) without a
// device manager.
func (dm *deviceManager) firstChan() <-chan struct{} {
	if dm == nil {
		return nil
	}
	return dm.first
}

type dmRegistration struct {
	deviceapi.UnimplementedRegistrationServer
	dm *deviceManager
}

// Register answers as the kubelet does: it refuses what it cannot take
// (judgeRegister), and answers only once it has connected to the plugin's
// endpoint and had its options (server.go Register, connectClient): a
// plugin that serves its endpoint only after Register returned is refused.
func (d dmRegistration) Register(ctx context.Context, req *deviceapi.RegisterRequest) (*deviceapi.Empty, error) {
	d.dm.firstOnce.Do(func() { close(d.dm.first) })
	dir := filepath.Dir(d.dm.path)
	err := judgeRegister(req, dir)
	if err == nil {
		err = d.dm.connect(ctx, filepath.Join(dir, req.GetEndpoint()))
	}
	select {
	case d.dm.requests <- registerCall{req, err}:
	default:
		return nil, errors.New("plugd conformance: too many Register calls")
	}
	if err != nil {
		return nil, err
	}
	return &deviceapi.Empty{}, nil
}

// connect plays the kubelet's connection to a device plugin that called
// Register: a connection to its endpoint, and GetDevicePluginOptions,
// before Register is answered.
func (dm *deviceManager) connect(ctx context.Context, endpoint string) error {
	ctx, cancel := withDeadline(ctx, dm.connectWait, "the endpoint "+endpoint+" to accept a connection while Register waited (the kubelet connects before it answers)")
	defer cancel()
	conn, err := dialUnix(ctx, endpoint)
	if err != nil {
		return err
	}
	defer conn.Close()
	if _, err := deviceapi.NewDevicePluginClient(conn).GetDevicePluginOptions(ctx, &deviceapi.Empty{}); err != nil {
		return fmt.Errorf("GetDevicePluginOptions, asked while Register waited (the kubelet asks before it answers): %w", err)
	}
	return nil
}

// judgeRegister says what the kubelet refuses in a Register request: a
// version it does not speak, a name that is not an extended resource name
// (by plugd's device plugin handler, which reads them as the kubelet does),
// an endpoint that is not a socket's name in the device plugin directory.
func judgeRegister(req *deviceapi.RegisterRequest, dir string) error {
	p := pluginmanager.Plugin{Type: typeDevice, Name: req.GetResourceName(), Versions: []string{req.GetVersion()},
		Endpoint: filepath.Join(dir, req.GetEndpoint()), Socket: filepath.Join(dir, kubeletSocketName)}
	if err := validateAs(p); err != nil {
		return err
	}
	if ep := req.GetEndpoint(); ep == "" || strings.ContainsRune(ep, '/') || ep == kubeletSocketName {
		return fmt.Errorf("endpoint %q: want the file name of the plugin's socket in the device plugin directory, other than %s", quote(ep), kubeletSocketName)
	}
	return nil
}

// nextRegister waits until ctx ends for the next Register.
func (dm *deviceManager) nextRegister(ctx context.Context) (registerCall, error) {
	select {
	case call := <-dm.requests:
		return call, nil
	case <-ctx.Done():
		return registerCall{}, context.Cause(ctx)
	}
}

// kubeletSockSuite checks a device plugin that registered by calling
// Register on kubelet.sock: the request, the plugin's services, a kubelet
// restart, and SIGTERM.
func (r *runner) kubeletSockSuite(ctx context.Context) {
	began := time.Now()
	// The first call, which ended the wait for a socket, once the kit has
	// connected to its endpoint, or given up.
	wctx, cancel := withDeadline(ctx, r.dm.connectWait+time.Second, "the kit to answer the plugin's Register")
	call, err := r.dm.nextRegister(wctx)
	cancel()
	if err != nil {
		r.fail(checkDPRegister, err.Error(), began)
		return
	}
	req := call.req
	dir := filepath.Dir(r.dm.path)
	info := PluginInfo{Socket: r.dm.path, Type: typeDevice, Name: quote(req.GetResourceName()),
		Endpoint: filepath.Join(dir, quote(req.GetEndpoint())), Versions: []string{quote(req.GetVersion())}, Via: viaKubeletSock}
	r.rep.Plugin = &info
	err = call.err
	var ep *grpc.ClientConn
	if err == nil {
		wctx, cancel := withDeadline(ctx, r.cfg.Timeout, "the endpoint "+info.Endpoint+" to accept a connection")
		ep, err = dialUnix(wctx, info.Endpoint)
		cancel()
	}
	if !r.check(checkDPRegister, err, fmt.Sprintf("Register: %s %q at %s", info.Versions[0], info.Name, info.Endpoint), began) {
		r.skipWhy = "not run: the kubelet refuses the plugin's Register"
		return
	}
	r.devicePluginSuite(ctx, ep)
	ep.Close()
	began = time.Now()
	r.check(checkDPRestart, r.kubeletRestart(ctx, req), "Register called again, with the same request, "+time.Since(began).Round(time.Millisecond).String()+" after kubelet.sock was made anew", began)
	if r.target != nil {
		began = time.Now()
		r.check(checkSIGTERM, r.sigterm(ctx, info.Endpoint), "the plugin exited on SIGTERM and removed "+info.Endpoint, began)
	}
}

// kubeletRestart makes kubelet.sock anew, as a restarted kubelet does, and
// waits for the plugin to call Register again with the same request.
func (r *runner) kubeletRestart(ctx context.Context, first *deviceapi.RegisterRequest) error {
	for len(r.dm.requests) > 0 { // calls made before the restart do not count
		<-r.dm.requests
	}
	if err := r.dm.restart(); err != nil {
		return err
	}
	wctx, cancel := withDeadline(ctx, r.cfg.ReregisterWait, "the plugin to call Register on the new "+r.dm.path)
	defer cancel()
	call, err := r.dm.nextRegister(wctx)
	if err != nil {
		return err
	}
	req := call.req
	if call.err != nil {
		return fmt.Errorf("Register again: the kubelet refuses it: %w", call.err)
	}
	if req.GetResourceName() != first.GetResourceName() || req.GetEndpoint() != first.GetEndpoint() || req.GetVersion() != first.GetVersion() {
		return fmt.Errorf("Register again: %s %q at %q; before: %s %q at %q", quote(req.GetVersion()), quote(req.GetResourceName()), quote(req.GetEndpoint()),
			quote(first.GetVersion()), quote(first.GetResourceName()), quote(first.GetEndpoint()))
	}
	return nil
}
