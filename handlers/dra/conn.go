package dra

import (
	"context"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	drahealthv1 "k8s.io/kubelet/pkg/apis/dra-health/v1"
	drahealthv1alpha1 "k8s.io/kubelet/pkg/apis/dra-health/v1alpha1"
)

// How long to wait before opening a health stream again after it ended: the
// first retry is quick (a plugin restarting), later ones back off so that a
// plugin whose stream keeps failing costs little.
const (
	healthRetryMin = time.Second
	healthRetryMax = 30 * time.Second
)

// dialer connects to unix sockets and keeps the last failure, so that an
// unreachable endpoint can be reported with its reason rather than just the
// connection's state.
type dialer struct {
	lastErr atomic.Pointer[error]
}

func (d *dialer) dial(ctx context.Context, addr string) (net.Conn, error) {
	var nd net.Dialer
	c, err := nd.DialContext(ctx, "unix", addr)
	if err != nil {
		d.lastErr.Store(&err)
	}
	return c, err
}

// connect opens a connection to endpoint and waits until it is ready, for at
// most Options.CallTimeout. A connection that fails is not waited for: the
// manager retries Register with its own backoff.
func (h *Handler) connect(ctx context.Context, endpoint string) (*grpc.ClientConn, error) {
	ctx, cancel := context.WithTimeoutCause(ctx, h.opts.CallTimeout,
		fmt.Errorf("endpoint not ready within %s", h.opts.CallTimeout))
	defer cancel()

	d := new(dialer)
	conn, err := grpc.NewClient("passthrough:///"+endpoint,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(d.dial),
		// A unix socket path is no authority; gRPC would otherwise send it as one.
		grpc.WithAuthority("localhost"),
		// The connection's state is the instance's liveness: it must not go
		// idle merely because nobody called the driver for a while.
		grpc.WithIdleTimeout(0),
		// Reconnecting to a local socket is cheap, and a restarted plugin
		// should be seen well within the grace period: retry sooner and more
		// often than gRPC's defaults (1s, growing to 2m).
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff: backoff.Config{
				BaseDelay:  250 * time.Millisecond,
				Multiplier: 1.6,
				Jitter:     0.2,
				MaxDelay:   5 * time.Second,
			},
			MinConnectTimeout: h.opts.CallTimeout,
		}),
	)
	if err != nil {
		return nil, fmt.Errorf("connect to DRA endpoint %s: %w", endpoint, err)
	}
	conn.Connect()
	for {
		state := conn.GetState()
		switch state {
		case connectivity.Ready:
			return conn, nil
		case connectivity.TransientFailure:
			conn.Close()
			reason := "connection failed"
			if err := d.lastErr.Load(); err != nil {
				reason = (*err).Error()
			}
			return nil, fmt.Errorf("connect to DRA endpoint %s: %s", endpoint, reason)
		case connectivity.Idle:
			conn.Connect()
		}
		if !conn.WaitForStateChange(ctx, state) {
			conn.Close()
			return nil, fmt.Errorf("connect to DRA endpoint %s: %w", endpoint, context.Cause(ctx))
		}
	}
}

// start runs the instance's goroutines: one watching its connection and, if
// it advertises a health service, one following its devices' health. Both end
// when ctx is cancelled (Deregister, Close); in.done is closed then.
func (h *Handler) start(ctx context.Context, in *instance) {
	h.wg.Add(1)
	go func() {
		defer h.wg.Done()
		defer close(in.done)
		var wg sync.WaitGroup
		if in.healthService != "" {
			wg.Go(func() { h.followHealth(ctx, in) })
		}
		h.watch(ctx, in)
		wg.Wait()
	}()
}

// watch follows the connection's state until ctx is done: ready is connected,
// anything else is not.
func (h *Handler) watch(ctx context.Context, in *instance) {
	for {
		state := in.conn.GetState()
		if state == connectivity.Shutdown {
			return
		}
		h.setConnected(in, state == connectivity.Ready)
		if state == connectivity.Idle {
			// A channel that lost its connection waits, idle, for a call
			// before reconnecting; reconnect now, so that the instance is
			// known to be back without anyone calling it.
			in.conn.Connect()
		}
		if !in.conn.WaitForStateChange(ctx, state) {
			return
		}
	}
}

// followHealth keeps a NodeWatchResources stream open to the instance and
// records what it reports, until ctx is done or the plugin answers
// Unimplemented, which is how a driver says it does not report health.
func (h *Handler) followHealth(ctx context.Context, in *instance) {
	var client drahealthv1.DRAResourceHealthClient
	switch in.healthService {
	case drahealthv1alpha1.DRAResourceHealthService:
		client = drahealthv1.V1Alpha1ClientWrapper{Client: drahealthv1alpha1.NewDRAResourceHealthClient(in.conn)}
	default:
		client = drahealthv1.NewDRAResourceHealthClient(in.conn)
	}
	delay := healthRetryMin
	for {
		received, err := h.healthStream(ctx, in, client)
		if ctx.Err() != nil {
			return
		}
		if status.Code(err) == codes.Unimplemented {
			h.healthUnsupported(in, err)
			return
		}
		if received {
			delay = healthRetryMin
		}
		h.log.Debug("DRA health stream ended; reopening", "driver", in.driver.name, "socket", in.socket, "error", err, "after", delay)
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		delay = min(2*delay, healthRetryMax)
	}
}

// healthStream runs one stream until it ends, and says whether it delivered
// anything.
func (h *Handler) healthStream(ctx context.Context, in *instance, client drahealthv1.DRAResourceHealthClient) (received bool, err error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	// A watch has no deadline: it lasts as long as the instance, whose
	// liveness the connection's state tells. WaitForReady makes it wait for a
	// lost connection to come back instead of failing at once.
	stream, err := client.NodeWatchResources(ctx, &drahealthv1.NodeWatchResourcesRequest{}, grpc.WaitForReady(true))
	if err != nil {
		return false, err
	}
	for {
		resp, err := stream.Recv()
		if err != nil {
			return received, err
		}
		received = true
		h.recordHealth(in, resp)
	}
}

// healthUnsupported records that the instance does not report health after all.
func (h *Handler) healthUnsupported(in *instance, err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.sockets[in.socket] != in {
		return
	}
	h.log.Info("DRA driver does not report device health", "driver", in.driver.name, "socket", in.socket, "service", in.healthService, "reason", status.Convert(err).Message())
	in.healthService = ""
	h.notifyLocked()
}

// recordHealth takes a health report into the instance's driver. A report may
// cover only some devices; the others keep what they had until it goes stale.
func (h *Handler) recordHealth(in *instance, resp *drahealthv1.NodeWatchResourcesResponse) {
	now := time.Now()
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.sockets[in.socket] != in {
		return
	}
	d := in.driver
	for _, dh := range resp.GetDevices() {
		pool, name := dh.GetDevice().GetPoolName(), dh.GetDevice().GetDeviceName()
		if pool == "" || name == "" || len(pool) > maxNameLen || len(name) > maxNameLen {
			continue
		}
		k := deviceKey{pool, name}
		dev := d.devices[k]
		if dev == nil {
			if len(d.devices) >= maxDevices {
				d.pruneStale(now)
			}
			if len(d.devices) >= maxDevices {
				if !d.overflow {
					d.overflow = true
					h.log.Warn("DRA driver reports more devices than are kept; ignoring the rest", "driver", d.name, "max", maxDevices)
				}
				continue
			}
			dev = new(device)
			d.devices[k] = dev
		}
		dev.health = healthFromV1(dh.GetHealth())
		dev.message = truncate(dh.GetMessage(), maxMessageLen)
		dev.lastUpdated = time.Time{}
		if s := dh.GetLastUpdatedTime(); s > 0 {
			dev.lastUpdated = time.Unix(s, 0)
		}
		dev.receivedAt = now
		dev.timeout = defaultHealthTimeout
		if s := dh.GetHealthCheckTimeoutSeconds(); s > 0 {
			dev.timeout = time.Duration(s) * time.Second
		}
	}
	h.notifyLocked()
}

// pruneStale forgets devices whose health has not been refreshed in time, to
// make room for new ones.
func (d *driver) pruneStale(now time.Time) {
	for k, dev := range d.devices {
		if now.Sub(dev.receivedAt) > dev.timeout {
			delete(d.devices, k)
		}
	}
}

func healthFromV1(s drahealthv1.HealthStatus) Health {
	switch s {
	case drahealthv1.HealthStatus_HEALTHY:
		return Healthy
	case drahealthv1.HealthStatus_UNHEALTHY:
		return Unhealthy
	default:
		return Unknown
	}
}

// truncate cuts s to at most n bytes, marking the cut with "...", and keeps
// it valid UTF-8.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return strings.ToValidUTF8(s[:n-3], "") + "..."
}
