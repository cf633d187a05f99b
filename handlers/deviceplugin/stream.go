package deviceplugin

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"slices"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	api "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	plugdapi "github.com/plugd/plugd/api"
	"github.com/plugd/plugd/handlers/internal/pacing"
	"github.com/plugd/plugd/internal/backoff"
	"github.com/plugd/plugd/internal/confine"
	"github.com/plugd/plugd/pluginmanager"
)

// Bounds on what a plugin may send. A list larger than this is a broken or
// hostile plugin; refusing it keeps the handler's memory bounded.
const (
	maxMessageBytes = 4 << 20
	maxDevices      = 10000
	maxDeviceIDLen  = 256
	maxNUMANodes    = 256
)

// The pace of a stream (see package pacing): device lists of 1 MiB a second
// (a list of 10,000 devices is about 250 KiB), 4 MiB at once, each counted
// as at least 1 KiB (at most 1,024 lists a second however small). A plugin
// that sends faster waits in its own Send: gRPC's flow control, with a
// window of windowBytes rather than one that grows to 16 MiB, holds it back.
const (
	listBytesPerSecond = 1 << 20
	listBurst          = maxMessageBytes
	minListCost        = 1 << 10
	windowBytes        = 1 << 20
)

// errBadPlugin marks what a retry cannot fix: the plugin does not serve the
// DevicePlugin service, or sent a device list that breaks the bounds.
var errBadPlugin = errors.New("misbehaving device plugin")

// session is one connection to a plugin's endpoint with its ListAndWatch
// stream open.
type session struct {
	conn   *grpc.ClientConn
	stream grpc.ServerStreamingClient[api.ListAndWatchResponse]
	// ctx is the stream's context as the handler made it: done only when
	// the handler ends the stream. (stream.Context() is gRPC's, which it
	// cancels itself once the stream has failed, whatever the cause.)
	ctx     context.Context
	cancel  context.CancelFunc // ends the stream
	options PluginOptions
}

func (s *session) close() {
	s.cancel()
	s.conn.Close()
}

// dial returns a client for p's device plugin, serving on the unix socket at
// its endpoint. It connects on first use, and every connection is confined
// to Options.EndpointRoots.
func (h *Handler) dial(p pluginmanager.Plugin) (*grpc.ClientConn, error) {
	confined := confine.For(p.Endpoint, p.Socket, h.opts.EndpointRoots)
	dialer := func(ctx context.Context, _ string) (net.Conn, error) {
		return confined.Dial(ctx, p.Endpoint)
	}
	// The dialer ignores the target, so a constant one keeps the path out of
	// gRPC's target parsing.
	return grpc.NewClient("passthrough:///device-plugin",
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithAuthority("localhost"),
		grpc.WithContextDialer(dialer),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(maxMessageBytes)),
		grpc.WithInitialWindowSize(windowBytes),
		grpc.WithInitialConnWindowSize(windowBytes),
	)
}

// open connects to endpoint, reads the plugin's options and opens its
// ListAndWatch stream, and returns once the first device list arrived. The
// stream lives until life is done or the session is closed; waiting for the
// answers is bounded by wait and by Options.CallTimeout.
//
// A new connection per session, rather than one gRPC reconnects by itself,
// lets the handler's own backoff decide when a dead plugin is tried again.
func (h *Handler) open(life, wait context.Context, p pluginmanager.Plugin) (_ *session, _ []Device, err error) {
	// Register's wait is its caller's context: Deregister and Close must
	// end the calls too.
	wait, cancelWait := context.WithCancel(wait)
	defer cancelWait()
	defer context.AfterFunc(life, cancelWait)()

	conn, err := h.dial(p)
	if err != nil {
		return nil, nil, fmt.Errorf("connect %s: %w", p.Endpoint, err)
	}
	defer func() {
		if err != nil {
			conn.Close()
		}
	}()
	client := api.NewDevicePluginClient(conn)
	timeout := h.opts.CallTimeout

	ctx, cancel := context.WithTimeoutCause(wait, timeout, fmt.Errorf("no answer within %s", timeout))
	opts, err := client.GetDevicePluginOptions(ctx, &api.Empty{})
	err = rpcError(ctx, "GetDevicePluginOptions", err)
	cancel()
	if err != nil {
		return nil, nil, err
	}

	streamCtx, endStream := context.WithCancel(life)
	defer func() {
		if err != nil {
			endStream()
		}
	}()
	stream, err := client.ListAndWatch(streamCtx, &api.Empty{})
	if err != nil {
		return nil, nil, rpcError(streamCtx, "ListAndWatch", err)
	}
	// Recv has no deadline of its own, and the stream must not have one:
	// end the stream if the first list is late.
	ctx, cancel = context.WithTimeoutCause(wait, timeout, fmt.Errorf("no device list within %s", timeout))
	defer cancel()
	stop := context.AfterFunc(ctx, endStream)
	first, err := stream.Recv()
	if !stop() {
		return nil, nil, fmt.Errorf("ListAndWatch: %w", context.Cause(ctx))
	}
	if err != nil {
		return nil, nil, rpcError(streamCtx, "ListAndWatch", err)
	}
	devs, err := inventory(first)
	if err != nil {
		return nil, nil, fmt.Errorf("ListAndWatch: %w", err)
	}
	return &session{
		conn:   conn,
		stream: stream,
		ctx:    streamCtx,
		cancel: endStream,
		options: PluginOptions{
			PreStartRequired:                opts.GetPreStartRequired(),
			GetPreferredAllocationAvailable: opts.GetGetPreferredAllocationAvailable(),
		},
	}, devs, nil
}

// rpcError names the failed call, prefers the deadline's cause (which says
// how long was waited) to gRPC's generic DeadlineExceeded, and marks a
// plugin that does not serve the call at all.
func rpcError(ctx context.Context, name string, err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, io.EOF):
		return fmt.Errorf("%s: the plugin ended the stream", name)
	case status.Code(err) == codes.Unimplemented:
		return fmt.Errorf("%s: %w: it does not serve the %s DevicePlugin service: %w", name, errBadPlugin, api.Version, err)
	case ctx.Err() != nil:
		return fmt.Errorf("%s: %w", name, context.Cause(ctx))
	}
	return fmt.Errorf("%s: %w", name, err)
}

// inventory checks a device list against the bounds and turns it into
// Devices sorted by ID. As in the kubelet, a repeated ID takes the last entry.
func inventory(resp *api.ListAndWatchResponse) ([]Device, error) {
	in := resp.GetDevices()
	if len(in) > maxDevices {
		return nil, fmt.Errorf("%w: %d devices, at most %d are accepted", errBadPlugin, len(in), maxDevices)
	}
	out := make([]Device, 0, len(in))
	index := make(map[string]int, len(in))
	for i, d := range in {
		id := d.GetID()
		if err := checkDeviceID(id); err != nil {
			return nil, fmt.Errorf("%w: device %d: %w", errBadPlugin, i, err)
		}
		dev := Device{ID: id, Health: plugdapi.DeviceUnhealthy}
		if d.GetHealth() == api.Healthy {
			dev.Health = plugdapi.DeviceHealthy
		}
		if nodes := d.GetTopology().GetNodes(); len(nodes) > 0 {
			if len(nodes) > maxNUMANodes {
				return nil, fmt.Errorf("%w: device %q: %d NUMA nodes, at most %d are accepted", errBadPlugin, id, len(nodes), maxNUMANodes)
			}
			dev.Topology = make([]int64, len(nodes))
			for j, n := range nodes {
				dev.Topology[j] = n.GetID()
			}
		}
		if j, ok := index[id]; ok {
			out[j] = dev
			continue
		}
		index[id] = len(out)
		out = append(out, dev)
	}
	slices.SortFunc(out, func(a, b Device) int { return cmp.Compare(a.ID, b.ID) })
	return out, nil
}

// run owns inst's stream from Register until Deregister or Close cancel
// life: it applies every device list, and when the stream breaks, redials.
//
// The backoff outlives a stream: one that breaks soon after it opened, as
// that of a plugin that ends it after one list does, counts as a failed
// attempt. Only a stream that stayed up longer than the longest delay
// starts the backoff again, so that a plugin is redialed at most about once
// per Options.ReconnectBackoffMax however it fails.
func (h *Handler) run(life context.Context, inst *instance, s *session) {
	defer close(inst.done)
	b := backoff.New(h.opts.ReconnectBackoff, h.opts.ReconnectBackoffMax, 0)
	warn := breakLog{every: h.opts.ReconnectBackoffMax}
	// One pace for the instance, whatever its sessions: redialing does not
	// reset it.
	pace := pacing.New(h.opts.Clock, listBytesPerSecond, listBurst, minListCost)
	for {
		up := time.Now()
		err := h.watch(inst, s, pace)
		s.close()
		if life.Err() != nil {
			return
		}
		if time.Since(up) > b.Max() {
			b.Reset()
		}
		h.lost(inst, err, &warn)
		if s = h.redial(life, inst, &b, &warn); s == nil {
			return
		}
	}
}

// breakLog keeps a plugin whose stream keeps breaking from flooding the log,
// and one that stops from alarming it: at most one break per interval is
// logged, and tells how many breaks it stands for; the others, and the
// reconnections after them, are logged at Debug level. A logged break
// that stands for itself alone (the first, or the first after a quiet
// interval) is Info: a plugin that stops or restarts ends its stream so,
// and one that does not come back is warned of at the end of the grace
// period. One that stands for several is a warning: the stream keeps
// breaking.
type breakLog struct {
	every  time.Duration
	last   time.Time // of the last break logged
	breaks int       // since the last break logged
	quiet  bool      // the last break was not logged
}

// note counts a break, and returns the level to log it at and, above
// Debug, how many breaks (this one included) it stands for.
func (l *breakLog) note(now time.Time) (level slog.Level, breaks int) {
	l.breaks++
	if !l.last.IsZero() && now.Sub(l.last) < l.every {
		l.quiet = true
		return slog.LevelDebug, 0
	}
	breaks, level = l.breaks, slog.LevelInfo
	if breaks > 1 {
		level = slog.LevelWarn
	}
	l.last, l.breaks, l.quiet = now, 0, false
	return level, breaks
}

// watch applies the device lists the stream sends until it breaks, at the
// pace: before it takes the next list, it waits as long as the last one
// puts the stream beyond it.
func (h *Handler) watch(inst *instance, s *session, pace *pacing.Pacer) error {
	slowed := false
	for {
		resp, err := s.stream.Recv()
		if err != nil {
			return rpcError(s.ctx, "ListAndWatch", err)
		}
		devs, err := inventory(resp)
		if err != nil {
			// Redialing costs little, and the plugin may have recovered by then.
			return fmt.Errorf("ListAndWatch: %w", err)
		}
		h.mu.Lock()
		if !inst.gone {
			inst.devices = devs
			h.notifyLocked()
		}
		h.mu.Unlock()
		waited, err := pace.Wait(s.ctx, proto.Size(resp))
		if err != nil {
			return rpcError(s.ctx, "ListAndWatch", err)
		}
		if waited && !slowed {
			slowed = true
			h.log.Warn("device plugin sends device lists faster than they are taken; its stream is slowed to the pace",
				"resource", inst.plugin.Name, "socket", inst.plugin.Socket, "bytesPerSecond", listBytesPerSecond)
		}
	}
}

// lost records that inst's stream broke: its devices turn Unhealthy until it
// is back or the grace period is over. An instance that no longer serves its
// resource is dropped at once: a newer one took over.
func (h *Handler) lost(inst *instance, err error, warn *breakLog) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if inst.gone {
		return
	}
	inst.connected = false
	inst.lastErr = printable(err.Error())
	inst.since = time.Now()
	inst.report(fmt.Errorf("device plugin endpoint %s: its ListAndWatch stream broke: %w", inst.plugin.Endpoint, err))
	log := h.log.With("resource", inst.plugin.Name, "socket", inst.plugin.Socket, "err", inst.lastErr)
	if inst.res.serving() != inst {
		inst.dropped = true
		inst.devices = nil
		log.Info("stream of a replaced device plugin instance ended; instance dropped")
	} else {
		inst.devices = unhealthy(inst.devices)
		switch level, n := warn.note(inst.since); level {
		case slog.LevelWarn:
			log.Warn("device plugin stream broke again; its devices are Unhealthy until it is back", "grace", h.opts.GracePeriod, "breaks", n)
		case slog.LevelInfo:
			log.Info("device plugin stream ended (the plugin stopped or restarts?); its devices are Unhealthy until it is back", "grace", h.opts.GracePeriod)
		default:
			log.Debug("device plugin stream broke; its devices are Unhealthy until it is back", "grace", h.opts.GracePeriod)
		}
	}
	h.notifyLocked()
}

// unhealthy returns a copy of devs, all Unhealthy.
func unhealthy(devs []Device) []Device {
	out := make([]Device, len(devs))
	for i, d := range devs {
		d.Health = api.Unhealthy
		out[i] = d
	}
	return out
}

// redial tries to re-establish inst's stream, waiting b's delay before each
// attempt, until it succeeds or life is done (then it returns nil). After the
// grace period, or as soon as a newer instance serves the resource, it drops
// inst's devices, and keeps trying.
func (h *Handler) redial(life context.Context, inst *instance, b *backoff.Backoff, warn *breakLog) *session {
	dropAt := time.Now().Add(h.opts.GracePeriod)
	timer := time.NewTimer(min(b.Next(), h.opts.GracePeriod))
	defer timer.Stop()
	for {
		select {
		case <-life.Done():
			return nil
		case <-timer.C:
		}
		dropped := h.expire(inst, dropAt)

		// An attempt that hangs must not hold up the drop.
		wait, cancel := life, context.CancelFunc(func() {})
		if !dropped {
			wait, cancel = context.WithDeadlineCause(life, dropAt, fmt.Errorf("grace period of %s is over", h.opts.GracePeriod))
		}
		s, devs, err := h.open(life, wait, inst.plugin)
		cancel()
		if err == nil {
			if h.restore(inst, s, devs, warn.quiet) {
				return s
			}
			s.close()
			return nil
		}
		if life.Err() != nil {
			return nil
		}
		h.mu.Lock()
		if !inst.gone {
			inst.lastErr = printable(err.Error())
			h.notifyLocked()
		}
		h.mu.Unlock()

		next := b.Next()
		if !dropped {
			next = max(0, min(next, time.Until(dropAt)))
		}
		timer.Reset(next)
	}
}

// expire drops inst's devices once the grace period is over or a newer
// instance serves the resource, and reports whether they are dropped.
func (h *Handler) expire(inst *instance, dropAt time.Time) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if inst.gone || inst.dropped {
		return true
	}
	serving := inst.res.serving() == inst
	if serving && time.Now().Before(dropAt) {
		return false
	}
	inst.dropped = true
	inst.devices = nil
	inst.since = time.Now()
	log := h.log.With("resource", inst.plugin.Name, "socket", inst.plugin.Socket, "err", inst.lastErr)
	if serving {
		log.Warn("device plugin not back within the grace period; resource dropped", "grace", h.opts.GracePeriod)
	} else {
		log.Info("device plugin instance replaced while disconnected; instance dropped")
	}
	h.notifyLocked()
	return true
}

// restore installs a re-established stream's state, and reports false if
// inst was deregistered meanwhile. Quiet says the break was not warned of,
// so neither is its end.
func (h *Handler) restore(inst *instance, s *session, devs []Device, quiet bool) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if inst.gone {
		return false
	}
	wasDropped := inst.dropped
	inst.report(nil)
	inst.connected = true
	inst.dropped = false
	inst.lastErr = ""
	inst.options = s.options
	inst.devices = devs
	inst.since = time.Now()
	inst.res.reconnects++
	log := h.log.With("resource", inst.plugin.Name, "socket", inst.plugin.Socket, "devices", len(devs), "wasDropped", wasDropped)
	if quiet && !wasDropped {
		log.Debug("device plugin stream re-established")
	} else {
		log.Info("device plugin stream re-established")
	}
	h.notifyLocked()
	return true
}
