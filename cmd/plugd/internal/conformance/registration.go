package conformance

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials/insecure"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"

	"github.com/plugd/plugd/handlers/csi"
	"github.com/plugd/plugd/handlers/deviceplugin"
	"github.com/plugd/plugd/handlers/dra"
	"github.com/plugd/plugd/pluginmanager"
)

// dialUnix connects to the unix socket at path and waits, until ctx ends,
// for the connection to be ready: gRPC's own reconnection (a short backoff)
// follows a socket that does not accept yet, so an endpoint that comes up
// late is met as soon as it listens.
func dialUnix(ctx context.Context, path string) (*grpc.ClientConn, error) {
	conn, err := grpc.NewClient("unix://"+path,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 20 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: time.Second},
			MinConnectTimeout: time.Second,
		}))
	if err != nil {
		return nil, fmt.Errorf("connecting to %s: %w", path, err)
	}
	conn.Connect()
	for s := conn.GetState(); s != connectivity.Ready; s = conn.GetState() {
		if !conn.WaitForStateChange(ctx, s) {
			conn.Close()
			return nil, fmt.Errorf("%w: %s", context.Cause(ctx), whyNotConnecting(path))
		}
	}
	return conn, nil
}

// whyNotConnecting is what a plain connection to path says now.
func whyNotConnecting(path string) string {
	c, err := net.DialTimeout("unix", path, 100*time.Millisecond)
	if err != nil {
		return err.Error()
	}
	c.Close()
	return "it accepts connections, but no gRPC connection was made on them"
}

// regConn is a connection to a registration socket, as the kubelet makes
// one for each registration.
type regConn struct {
	conn   *grpc.ClientConn
	client registerapi.RegistrationClient
}

func dialRegistration(ctx context.Context, path string) (*regConn, error) {
	conn, err := dialUnix(ctx, path)
	if err != nil {
		return nil, err
	}
	return &regConn{conn: conn, client: registerapi.NewRegistrationClient(conn)}, nil
}

func (c *regConn) close() { c.conn.Close() }

// getInfo asks GetInfo, allowing wait, and says how long the answer took.
func (c *regConn) getInfo(ctx context.Context, socket string, wait time.Duration) (PluginInfo, time.Duration, error) {
	ctx, cancel := withDeadline(ctx, wait, "GetInfo to answer")
	defer cancel()
	began := time.Now()
	in, err := c.client.GetInfo(ctx, &registerapi.InfoRequest{})
	took := time.Since(began)
	if err != nil {
		return PluginInfo{}, took, fmt.Errorf("GetInfo: %w", err)
	}
	return PluginInfo{Socket: socket, Type: quote(in.GetType()), Name: quote(in.GetName()),
		Endpoint: quote(in.GetEndpoint()), Versions: quoteAll(in.GetSupportedVersions())}, took, nil
}

func quoteAll(ss []string) []string {
	out := make([]string, len(ss))
	for i, s := range ss {
		out[i] = quote(s)
	}
	return out
}

// notify sends NotifyRegistrationStatus within the kubelet's deadline.
func (c *regConn) notify(ctx context.Context, registered bool, why string) error {
	ctx, cancel := withDeadline(ctx, notifyDeadline, "NotifyRegistrationStatus to be answered")
	defer cancel()
	_, err := c.client.NotifyRegistrationStatus(ctx, &registerapi.RegistrationStatus{PluginRegistered: registered, Error: why})
	if err != nil {
		return fmt.Errorf("NotifyRegistrationStatus(%t): %w", registered, err)
	}
	return nil
}

// checkSocket waits for the registration socket and asks GetInfo on it. It
// returns nil when there is none, or when the plugin called Register on
// the device manager's kubelet.sock instead (r.via says so).
func (r *runner) checkSocket(ctx context.Context) (*regConn, PluginInfo) {
	began := time.Now()
	wait, what := r.cfg.Timeout, "a registration socket in "+r.cfg.RegistryDir
	if r.dm != nil {
		what = "a Register call on " + r.dm.path
		if r.cfg.RegistryDir != "" {
			what = "a registration socket in " + r.cfg.RegistryDir + " or " + what
		}
		if r.target == nil {
			// Attached, the plugin registers when it sees kubelet.sock
			// made, after its own delay.
			wait = r.cfg.ReregisterWait
		}
	}
	wctx, cancel := withDeadline(ctx, wait, what)
	defer cancel()
	path, _, err := waitSocket(wctx, r.cfg.RegistryDir, nil, r.target.exitedChan(), r.dm.firstChan())
	if errors.Is(err, errRegisteredByCall) {
		r.via = viaKubeletSock
		return nil, PluginInfo{}
	}
	var c *regConn
	if err == nil {
		c, err = dialRegistration(wctx, path)
	}
	var info PluginInfo
	var took time.Duration
	if err == nil {
		info, took, err = c.getInfo(ctx, path, r.cfg.Timeout)
		if err != nil {
			c.close()
			err = fmt.Errorf("the socket %s does not serve the Registration service: %w", path, err)
		}
	}
	if !r.check(checkSocket, err, "the socket "+path+" serves GetInfo", began) {
		r.skipWhy = "not run: no registration socket served GetInfo"
		return nil, PluginInfo{}
	}
	if took > getInfoDeadline {
		r.record(checkGetInfoTime, statusFail, fmt.Sprintf("GetInfo answered after %s; the kubelet gives up after %s and tries again later", took.Round(time.Millisecond), getInfoDeadline), took)
	} else {
		r.record(checkGetInfoTime, statusPass, fmt.Sprintf("GetInfo answered in %s", took.Round(time.Millisecond)), took)
	}
	return c, info
}

// validateAs validates p as the handler of p.Type would: plugd's reading
// of the kubelet's rules for each type (each handler's doc names the
// kubelet's code it follows). The handler is made for the one call and
// closed.
func validateAs(p pluginmanager.Plugin) error {
	var h interface {
		Validate(context.Context, pluginmanager.Plugin) error
		Close()
	}
	switch p.Type {
	case typeCSI:
		h = csi.New(csi.Options{})
	case typeDRA:
		h = dra.New(dra.Options{})
	default:
		h = deviceplugin.New(deviceplugin.Options{})
	}
	defer h.Close()
	return h.Validate(context.Background(), p)
}

// accepted are registrations the kubelet accepts, one per type, whose
// fields stand in for those not under test.
var accepted = map[string]pluginmanager.Plugin{
	typeCSI:    {Type: typeCSI, Name: "conformance.example.com", Versions: []string{"1.0.0"}},
	typeDRA:    {Type: typeDRA, Name: "conformance.example.com", Versions: []string{"v1.DRAPlugin"}},
	typeDevice: {Type: typeDevice, Name: "example.com/conformance", Versions: []string{"v1beta1"}},
}

// checkInfo judges what GetInfo said: the type, the name and the versions,
// each on its own.
func (r *runner) checkInfo(info PluginInfo) {
	began := time.Now()
	good, ok := accepted[info.Type]
	if !ok {
		r.fail(checkType, fmt.Sprintf("type %q: the kubelet has no handler for it and answers NotifyRegistrationStatus(false)", info.Type), began)
		r.skipWhy = "not run: the type is not one the kubelet knows"
		return
	}
	r.pass(checkType, fmt.Sprintf("type %q", info.Type), began)
	good.Endpoint, good.Socket = "/run/conformance/plugin.sock", "/run/conformance/reg.sock"
	p := good
	p.Name = info.Name
	r.check(checkName, validateAs(p), fmt.Sprintf("name %q", info.Name), began)
	p = good
	p.Versions = info.Versions
	r.check(checkVersions, validateAs(p), fmt.Sprintf("versions %q", info.Versions), began)
}

// checkEndpoint checks the endpoint's form and connects to it, waiting for
// it to come up if it is not there yet. It returns the connection, or nil.
func (r *runner) checkEndpoint(ctx context.Context, info PluginInfo) *grpc.ClientConn {
	began := time.Now()
	path := info.Socket
	if info.Endpoint != "" {
		var err error
		if path, err = pluginmanager.EndpointPath(info.Endpoint); err != nil {
			r.fail(checkEndpoint, err.Error(), began)
			return nil
		}
	}
	wctx, cancel := withDeadline(ctx, r.cfg.Timeout, "the endpoint "+path+" to accept a connection")
	defer cancel()
	conn, err := dialUnix(wctx, path)
	if !r.check(checkEndpoint, err, fmt.Sprintf("the endpoint %s accepted a connection %s after GetInfo", path, time.Since(began).Round(time.Millisecond)), began) {
		return nil
	}
	return conn
}

func (r *runner) checkNotify(ctx context.Context, c *regConn) {
	began := time.Now()
	r.check(checkNotify, c.notify(ctx, true, ""), "NotifyRegistrationStatus(true) answered", began)
}

// checkRestart plays a restarted manager: a new connection, GetInfo and
// NotifyRegistrationStatus(true) again, and compares the answers.
func (r *runner) checkRestart(ctx context.Context, first PluginInfo) {
	r.check(checkRestart, r.registerAgain(ctx, first), "registered again with the same answers", time.Now())
}

// lateNotify is how long checkLateNotify holds the notification after
// GetInfo: longer than the kubelet's GetInfo deadline, shorter than its
// notification deadline, as a kubelet whose handler takes its time.
const lateNotify = 2 * time.Second

// checkLateNotify registers the plugin again, with the notification held
// lateNotify after GetInfo.
func (r *runner) checkLateNotify(ctx context.Context, first PluginInfo) {
	began := time.Now()
	r.check(checkLateNotify, r.notifyLate(ctx, first), fmt.Sprintf("the notification %s after GetInfo was answered", lateNotify), began)
}

func (r *runner) notifyLate(ctx context.Context, first PluginInfo) error {
	c, err := r.dialAgain(ctx, first.Socket)
	if err != nil {
		return err
	}
	defer c.close()
	if _, _, err := c.getInfo(ctx, first.Socket, r.cfg.Timeout); err != nil {
		return err
	}
	hold := time.NewTimer(lateNotify)
	defer hold.Stop()
	select {
	case <-r.target.exitedChan():
		return fmt.Errorf("while the notification was held %s after GetInfo, %w", lateNotify, r.target.exitedErr())
	case <-hold.C:
	}
	if err := c.notify(ctx, true, ""); err != nil {
		return fmt.Errorf("held %s after GetInfo: %w", lateNotify, err)
	}
	return nil
}

// registerAgain registers the plugin at first.Socket anew, on a new
// connection, as a restarted kubelet does, and says what differed.
func (r *runner) registerAgain(ctx context.Context, first PluginInfo) error {
	c, err := r.dialAgain(ctx, first.Socket)
	if err != nil {
		return err
	}
	defer c.close()
	return r.registerOn(ctx, c, first)
}

func (r *runner) dialAgain(ctx context.Context, socket string) (*regConn, error) {
	wctx, cancel := withDeadline(ctx, r.cfg.Timeout, "a new connection to "+socket)
	defer cancel()
	return dialRegistration(wctx, socket)
}

// registerOn asks GetInfo on c, compares the answer with first, and
// notifies the plugin it is registered. The notification's answer is
// registration/notify-registered's to judge, not the caller's: the kubelet
// logs it, and keeps the plugin registered.
func (r *runner) registerOn(ctx context.Context, c *regConn, first PluginInfo) error {
	again, _, err := c.getInfo(ctx, first.Socket, r.cfg.Timeout)
	if err != nil {
		return err
	}
	if !sameInfo(first, again) {
		return fmt.Errorf("GetInfo answered %s %q, endpoint %q, versions %q; before: %s %q, endpoint %q, versions %q",
			again.Type, again.Name, again.Endpoint, again.Versions, first.Type, first.Name, first.Endpoint, first.Versions)
	}
	_ = c.notify(ctx, true, "")
	return nil
}

func sameInfo(a, b PluginInfo) bool {
	return a.Type == b.Type && a.Name == b.Name && a.Endpoint == b.Endpoint && slices.Equal(a.Versions, b.Versions)
}
