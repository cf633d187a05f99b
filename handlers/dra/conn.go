package dra

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode"
	"unicode/utf8"

	"google.golang.org/grpc"
	grpcbackoff "google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	drahealthv1 "k8s.io/kubelet/pkg/apis/dra-health/v1"
	drahealthv1alpha1 "k8s.io/kubelet/pkg/apis/dra-health/v1alpha1"

	"github.com/plugd/plugd/handlers/internal/pacing"
	"github.com/plugd/plugd/internal/backoff"
	"github.com/plugd/plugd/internal/confine"
	"github.com/plugd/plugd/pluginmanager"
)

// How long to wait before opening a health stream again after it ended: the
// first retry is quick (a plugin restarting), later ones back off so that a
// plugin whose stream keeps failing costs little.
const (
	healthRetryMin = time.Second
	healthRetryMax = 30 * time.Second
)

// lossWarnEvery is how often, at most, an instance whose endpoint keeps
// dropping its connection is warned of; the other losses, and the
// reconnections after them, are logged at debug level.
const lossWarnEvery = 10 * time.Minute

// dialer connects to a plugin's endpoint, confined to the endpoint roots at
// every connection (gRPC reconnects through it too), and keeps the last
// failure, so that an unreachable endpoint can be reported with its reason
// rather than just the connection's state.
type dialer struct {
	confined confine.Dialer
	log      *slog.Logger
	lastErr  atomic.Pointer[error]
	warned   atomic.Bool // of an endpoint outside the roots, once
}

func (d *dialer) dial(ctx context.Context, addr string) (net.Conn, error) {
	c, err := d.confined.Dial(ctx, addr)
	if err != nil {
		d.lastErr.Store(&err)
		if errors.Is(err, confine.ErrOutside) && !d.warned.Swap(true) {
			d.log.Warn("DRA endpoint now leads outside the allowed directories; not connecting to it", "error", err)
		}
	}
	return c, err
}

// connect opens a connection to p's endpoint and waits until it is ready, for
// at most Options.CallTimeout. A connection that fails is not waited for: the
// manager retries Register with its own backoff.
func (h *Handler) connect(ctx context.Context, p pluginmanager.Plugin) (*grpc.ClientConn, error) {
	ctx, cancel := context.WithTimeoutCause(ctx, h.opts.CallTimeout,
		fmt.Errorf("endpoint not ready within %s", h.opts.CallTimeout))
	defer cancel()

	conn, d, err := h.newConn(p)
	if err != nil {
		return nil, err
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
			return nil, fmt.Errorf("connect to DRA endpoint %s: %s", p.Endpoint, reason)
		case connectivity.Idle:
			conn.Connect()
		}
		if !conn.WaitForStateChange(ctx, state) {
			conn.Close()
			return nil, fmt.Errorf("connect to DRA endpoint %s: %w", p.Endpoint, context.Cause(ctx))
		}
	}
}

// newConn is a client of p's endpoint, confined to the roots, not yet
// connected.
func (h *Handler) newConn(p pluginmanager.Plugin) (*grpc.ClientConn, *dialer, error) {
	d := &dialer{confined: confine.For(p.Endpoint, p.Socket, h.opts.EndpointRoots), log: h.log.With("driver", p.Name, "socket", p.Socket)}
	conn, err := grpc.NewClient("passthrough:///"+p.Endpoint,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(d.dial),
		// A unix socket path is no authority; gRPC would otherwise send it as one.
		grpc.WithAuthority("localhost"),
		// The health stream is all the handler receives on this connection:
		// bound what a plugin can make it decode, and then walk under its lock.
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(maxHealthMessageSize)),
		grpc.WithInitialWindowSize(windowBytes),
		grpc.WithInitialConnWindowSize(windowBytes),
		// The connection's state is the instance's liveness: it must not go
		// idle merely because nobody called the driver for a while.
		grpc.WithIdleTimeout(0),
		// Reconnecting to a local socket is cheap, and a restarted plugin
		// should be seen well within the grace period: retry sooner and more
		// often than gRPC's defaults (1s, growing to 2m).
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff: grpcbackoff.Config{
				BaseDelay:  250 * time.Millisecond,
				Multiplier: 1.6,
				Jitter:     0.2,
				MaxDelay:   5 * time.Second,
			},
			MinConnectTimeout: h.opts.CallTimeout,
		}),
	)
	if err != nil {
		return nil, nil, fmt.Errorf("connect to DRA endpoint %s: %w", p.Endpoint, err)
	}
	return conn, d, nil
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
			wg.Go(func() { h.followHealth(ctx, h.instanceHealth(in)) })
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

// healthSource is a health stream to follow: the connection, the health
// service it speaks, who it is (for the log), and what to do with what it
// sends.
type healthSource struct {
	conn                    *grpc.ClientConn
	service, driver, socket string
	record                  func(*drahealthv1.NodeWatchResourcesResponse)
	// unsupported is called when the plugin answers Unimplemented.
	unsupported func(error)
}

// instanceHealth is the health stream of a registered instance.
func (h *Handler) instanceHealth(in *instance) healthSource {
	return healthSource{conn: in.conn, service: in.healthService, driver: in.driver.name, socket: in.socket,
		record:      func(r *drahealthv1.NodeWatchResourcesResponse) { h.recordHealth(in, r) },
		unsupported: func(err error) { h.healthUnsupported(in, err) }}
}

// followHealth keeps a NodeWatchResources stream open to the source and
// records what it reports, until ctx is done or the plugin answers
// Unimplemented, which is how a driver says it does not report health.
func (h *Handler) followHealth(ctx context.Context, src healthSource) {
	var client drahealthv1.DRAResourceHealthClient
	switch src.service {
	case drahealthv1alpha1.DRAResourceHealthService:
		client = drahealthv1.V1Alpha1ClientWrapper{Client: drahealthv1alpha1.NewDRAResourceHealthClient(src.conn)}
	default:
		client = drahealthv1.NewDRAResourceHealthClient(src.conn)
	}
	b := backoff.New(healthRetryMin, healthRetryMax, 0)
	// One pace for the instance, whatever its streams: reopening one does
	// not reset it.
	pace := pacing.New(h.opts.Clock, healthBytesPerSecond, healthBurst, minHealthCost)
	// A too-large report was warned of: said again only once a stream has
	// carried reports and ended for another reason (not at each reopening
	// of a stream that sends a fitting report, then a too-large one).
	tooLarge := false
	for {
		received, err := h.healthStream(ctx, src, client, pace)
		if ctx.Err() != nil {
			return
		}
		if status.Code(err) == codes.Unimplemented {
			src.unsupported(err)
			return
		}
		if received {
			b.Reset()
			if status.Code(err) != codes.ResourceExhausted {
				tooLarge = false
			}
		}
		delay := b.Next()
		// The error may carry the plugin's own message.
		reason := printable(fmt.Sprint(err), maxMessageLen)
		if status.Code(err) == codes.ResourceExhausted && !tooLarge {
			tooLarge = true
			h.log.Warn("DRA health report too large; reopening the stream", "driver", src.driver, "socket", src.socket, "maxBytes", maxHealthMessageSize, "error", reason, "after", delay)
		} else {
			h.log.Debug("DRA health stream ended; reopening", "driver", src.driver, "socket", src.socket, "error", reason, "after", delay)
		}
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

// healthStream runs one stream until it ends, at the pace, and says whether
// it delivered anything.
func (h *Handler) healthStream(ctx context.Context, src healthSource, client drahealthv1.DRAResourceHealthClient, pace *pacing.Pacer) (received bool, err error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	// A watch has no deadline: it lasts as long as the instance, whose
	// liveness the connection's state tells. WaitForReady makes it wait for a
	// lost connection to come back instead of failing at once.
	stream, err := client.NodeWatchResources(ctx, &drahealthv1.NodeWatchResourcesRequest{}, grpc.WaitForReady(true))
	if err != nil {
		return false, err
	}
	slowed := false
	for {
		resp, err := stream.Recv()
		if err != nil {
			return received, err
		}
		received = true
		src.record(resp)
		waited, err := pace.Wait(ctx, proto.Size(resp))
		if err != nil {
			return received, err
		}
		if waited && !slowed {
			slowed = true
			h.log.Warn("DRA driver sends health reports faster than they are taken; its stream is slowed to the pace",
				"driver", src.driver, "socket", src.socket, "bytesPerSecond", healthBytesPerSecond)
		}
	}
}

// healthUnsupported records that the instance does not report health after all.
func (h *Handler) healthUnsupported(in *instance, err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.sockets[in.socket] != in {
		return
	}
	h.log.Info("DRA driver does not report device health", "driver", in.driver.name, "socket", in.socket, "service", in.healthService,
		"reason", printable(status.Convert(err).Message(), maxMessageLen))
	in.healthService = ""
	h.notifyLocked()
}

// recordHealth takes a health report into the instance's driver. A report may
// cover only some devices; the others keep what they had until it goes stale.
//
// Its work under the lock is one map lookup per device named, and at most one
// walk over the devices kept: once maxDevices are kept, stale ones are pruned
// once to make room, and new devices the room does not cover are counted and
// dropped, while the devices already kept are still refreshed.
func (h *Handler) recordHealth(in *instance, resp *drahealthv1.NodeWatchResourcesResponse) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.sockets[in.socket] != in {
		return
	}
	h.recordDevicesLocked(in.driver, resp)
	h.notifyLocked()
}

// recordDevicesLocked takes a health report into d's devices. h.mu must be
// held.
func (h *Handler) recordDevicesLocked(d *driver, resp *drahealthv1.NodeWatchResourcesResponse) {
	now := h.opts.Clock.Now()
	pruned := false
	dropped := 0
	for _, dh := range resp.GetDevices() {
		pool, name := dh.GetDevice().GetPoolName(), dh.GetDevice().GetDeviceName()
		if pool == "" || name == "" || len(pool) > maxNameLen || len(name) > maxNameLen {
			continue
		}
		k := deviceKey{printable(pool, maxNameLen), printable(name, maxNameLen)}
		dev := d.devices[k]
		if dev == nil {
			if len(d.devices) >= maxDevices && !pruned {
				d.pruneStale(now)
				pruned = true
			}
			if len(d.devices) >= maxDevices {
				dropped++
				continue
			}
			dev = new(device)
			d.devices[k] = dev
		}
		dev.health = healthFromV1(dh.GetHealth())
		dev.message = printable(dh.GetMessage(), maxMessageLen)
		dev.lastUpdated = time.Time{}
		if s := dh.GetLastUpdatedTime(); s > 0 {
			dev.lastUpdated = time.Unix(s, 0)
		}
		dev.receivedAt = now
		dev.timeout = defaultHealthTimeout
		if s := dh.GetHealthCheckTimeoutSeconds(); s > 0 {
			dev.timeout = time.Duration(min(s, int64(maxHealthTimeout/time.Second))) * time.Second
		}
	}
	if dropped > 0 {
		d.devicesDropped += dropped
		if !d.overflow {
			d.overflow = true
			h.log.Warn("DRA driver reports more devices than are kept; ignoring the rest", "driver", d.name, "max", maxDevices, "dropped", dropped)
		}
	}
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

// printable makes text a plugin chose (a pool or device name, a health
// message, an error) safe to store and to show: every character that is not
// printable (control characters, C1 controls, bidi overrides, invalid UTF-8),
// except the space, is written as a Go escape, as strconv.QuoteRune writes it
// without the quotes, and the result is cut to at most n bytes, with "..."
// marking the cut. An escape is never cut in two. n must be at least 3.
func printable(s string, n int) string {
	if len(s) <= n && plainASCII(s) {
		return s
	}
	var b strings.Builder
	keep := 0 // b's length at the last boundary that leaves room for "..."
	var esc [utf8.UTFMax * 4]byte
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		var piece string
		switch {
		case r == utf8.RuneError && size == 1:
			piece = fmt.Sprintf(`\x%02x`, s[i])
		case unicode.IsPrint(r) || r == ' ':
			piece = s[i : i+size]
		default:
			q := strconv.AppendQuoteRune(esc[:0], r)
			piece = string(q[1 : len(q)-1])
		}
		i += size
		if b.Len()+len(piece) > n {
			return b.String()[:keep] + "..."
		}
		b.WriteString(piece)
		if b.Len() <= n-3 {
			keep = b.Len()
		}
	}
	return b.String()
}

// plainASCII reports whether s is printable ASCII only, which printable
// leaves as it is.
func plainASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < ' ' || s[i] > '~' {
			return false
		}
	}
	return true
}
