package kubeletstate

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/utils/clock"
)

// Watch reads the kubelet when asked, when its held connection is made or
// ends, and every resync; it keeps what the reads showed (Record). Its
// methods are safe for concurrent use.
type Watch struct {
	c        *Client // nil: reading the kubelet is off
	cfg      Config
	clock    clock.WithTicker
	log      *slog.Logger
	m        Metrics
	onChange func() // called after every read, outside mu
	resync   time.Duration

	kick    chan struct{} // read now
	devices chan struct{} // read pod-resources now
	wake    chan struct{} // the wishes changed: look at the timer again

	mu  sync.Mutex
	rec Record // guarded by mu
	// The loop's wishes: the next reads no later than these (zero: none);
	// guarded by mu, as are the others below.
	wantMetrics, wantDevices time.Time
	lastMetrics, lastDevices time.Time
	// cut counts reads in a row cut off mid-way (a kubelet stopping
	// resets its connections before it stops listening); retryAt is when
	// the next is due.
	cut     int
	retryAt time.Time
}

// Metrics are the counters of the reads: by what was read (metrics,
// pod_resources) and result (ok, error); and the bytes of /metrics as
// they came.
type Metrics struct {
	Reads *prometheus.CounterVec
	Bytes prometheus.Counter
}

// NewWatch makes the watch of the kubelet c reads (nil: reading the
// kubelet is off, and the evidence says so), on clk; onChange is called
// after every read.
func NewWatch(c *Client, cfg Config, clk clock.WithTicker, log *slog.Logger, m Metrics, onChange func()) *Watch {
	w := &Watch{c: c, cfg: cfg, clock: clk, log: log, m: m, onChange: onChange,
		resync: cfg.Resync, kick: make(chan struct{}, 1), devices: make(chan struct{}, 1), wake: make(chan struct{}, 1)}
	if w.resync <= 0 {
		w.resync = DefaultResync
	}
	if c == nil {
		w.rec.problem = &Problem{Operation: "read the kubelet", Reason: ReasonDisabled,
			Message: "kubernetes.kubelet.address is not set: plugd infers what the kubelet registered from API objects, which outlive its registrations; set it to the kubelet's secure port (the DaemonSet sets it from the node's IP)"}
	}
	return w
}

// Request asks for a read of everything now.
func (w *Watch) Request() { poke(w.kick) }

// RequestDevices asks for a read of the kubelet's devices now: cheap, and
// local.
func (w *Watch) RequestDevices() { poke(w.devices) }

func poke(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

// Want asks for the next read of the kubelet's metrics no later than
// metrics, and of its devices no later than devices (zero: no wish).
func (w *Watch) Want(metrics, devices time.Time) {
	w.mu.Lock()
	changed := !metrics.Equal(w.wantMetrics) || !devices.Equal(w.wantDevices)
	w.wantMetrics, w.wantDevices = metrics, devices
	w.mu.Unlock()
	if changed {
		poke(w.wake)
	}
}

// Evidence is what the reads have shown, now.
func (w *Watch) Evidence() Evidence {
	w.mu.Lock()
	defer w.mu.Unlock()
	e := w.rec.Evidence()
	e.DevicesAt = w.lastDevices
	return e
}

// Run reads until ctx is done, and holds the connection meanwhile. It
// returns once both have stopped.
func (w *Watch) Run(ctx context.Context) {
	if w.c == nil {
		return
	}
	defer w.c.close()
	if w.cfg.InsecureSkipVerify {
		w.log.Warn("kubernetes.kubelet.insecureSkipTLSVerify is set: plugd reads the kubelet without verifying its certificate, and so only where it sees the listening socket, owned by root, in its own network namespace (node network); set kubernetes.kubelet.caFile instead", "address", w.cfg.Address)
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Go(func() { w.holdLoop(ctx) })
	timer := w.clock.NewTimer(0)
	defer timer.Stop()
	forced, forcedDevices := true, false
	for {
		select {
		case <-ctx.Done():
			return
		case <-w.kick:
			forced = true
		case <-w.devices:
			forcedDevices = true
		case <-w.wake:
		case <-timer.C():
		}
		now := w.clock.Now()
		metrics, devices, next := w.due(now, forced)
		devices = devices || forcedDevices && w.c.pr != nil
		if !metrics && !devices {
			timer.Reset(next.Sub(now))
			forced, forcedDevices = false, false
			continue
		}
		if gap := now.Sub(w.lastRead()); gap < minReadGap {
			timer.Reset(minReadGap - gap)
			continue // forced stays set: read once the gap has passed
		}
		forced, forcedDevices = false, false
		w.read(ctx, now, metrics, devices)
		if ctx.Err() != nil {
			return
		}
		w.onChange()
		now = w.clock.Now()
		_, _, next = w.due(now, false)
		timer.Reset(next.Sub(now))
	}
}

func (w *Watch) lastRead() time.Time {
	w.mu.Lock()
	defer w.mu.Unlock()
	return latest(w.lastMetrics, w.lastDevices)
}

// due says which reads are due at now (forced: both), and when the next
// one will be.
func (w *Watch) due(now time.Time, forced bool) (metrics, devices bool, next time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	// A wish is "a read no earlier than": one a read at or after it
	// served is no wish any more, until the loop says its next.
	nextMetrics := w.lastMetrics.Add(w.resync)
	if w.wantMetrics.After(w.lastMetrics) && w.wantMetrics.Before(nextMetrics) {
		nextMetrics = w.wantMetrics
	}
	if !w.retryAt.IsZero() && w.retryAt.Before(nextMetrics) {
		nextMetrics = w.retryAt
	}
	nextDevices := nextMetrics
	if w.wantDevices.After(w.lastDevices) && w.wantDevices.Before(nextDevices) {
		nextDevices = w.wantDevices
	}
	if w.c.pr == nil {
		nextDevices = time.Time{}
	}
	metrics = forced || !now.Before(nextMetrics)
	devices = w.c.pr != nil && (metrics || !now.Before(nextDevices))
	return metrics, devices, earliest(nextMetrics, nextDevices)
}

// read reads what is due and records it.
func (w *Watch) read(ctx context.Context, now time.Time, metrics, devices bool) {
	var s Reading
	var err error
	if metrics {
		s, err = w.readMetrics(ctx)
		s.At = now
		w.m.Reads.WithLabelValues("metrics", result(err)).Inc()
		w.m.Bytes.Add(float64(s.Bytes))
	}
	var devs map[string]int
	var devErr error
	if devices && err == nil {
		devs, devErr = w.c.readDevices(ctx)
		w.m.Reads.WithLabelValues("pod_resources", result(devErr)).Inc()
	}
	if ctx.Err() != nil {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if devices {
		w.lastDevices = now
	}
	if !metrics {
		w.rec.devicesRead(devs, devErr)
		return
	}
	w.lastMetrics = now
	w.retryAt = time.Time{}
	if err != nil && cutOff(err) && w.cut < maxCuts {
		w.rec.reads++
		w.cut++
		w.retryAt = now.Add(cutRetry)
		return
	}
	w.cut = 0
	if err != nil {
		w.failed(err, now)
		return
	}
	if devices {
		s.Devices, s.DevicesErr = devs, devErr
	}
	if was := w.rec.problem; was != nil {
		w.log.Info("reading the kubelet again", "address", w.cfg.Address, "troubleSince", was.Since)
	}
	if before := w.rec.Read(s); !before.IsZero() {
		w.log.Info("the kubelet restarted", "started", s.Started, "before", before)
	}
}

// failed records a read of the metrics that failed with err at now. w.mu
// must be held.
func (w *Watch) failed(err error, now time.Time) {
	p := classify(w.cfg, err, now)
	if w.rec.Failed(p, impostor(err, p, w.rec.gone, w.cfg.Address)) {
		w.log.Warn("cannot read the kubelet", "address", w.cfg.Address, "reason", p.Reason, "err", p.Message)
	}
}

// readMetrics reads the kubelet's /metrics; if its certificate does not
// verify, with caFile read again when that changed it: a kubelet.crt
// regenerated or rotated while plugd runs.
func (w *Watch) readMetrics(ctx context.Context) (Reading, error) {
	s, err := w.c.readMetrics(ctx)
	if err == nil || !unverified(w.cfg, err) {
		return s, err
	}
	changed, rerr := w.c.reloadCA()
	if rerr != nil {
		w.log.Debug("cannot read the kubelet's CA file again", "err", rerr)
	}
	if !changed {
		return s, err
	}
	w.log.Info("the kubelet's certificate did not verify, and its CA file changed: reading the kubelet with the new one", "caFile", w.cfg.CAFile)
	return w.c.readMetrics(ctx)
}

// impostor says who answers at addr, when a read's failure err (classified
// as p) shows that it is not the kubelet: a listener whose owner the
// kubelet does not run as, or, once plugd has seen the kubelet go (gone)
// and has verified none since, a server whose certificate does not
// verify: a listener that cannot show it after the kubelet exited is
// anyone's, and says nothing of what the kubelet registered (before,
// plugd inferred True from the API's objects then). A certificate that
// stops verifying while the kubelet runs (expired, rotated, a new CA) is
// the kubelet's that plugd cannot verify, not a kubelet gone.
func impostor(err error, p *Problem, gone bool, addr string) string {
	var nk *notKubeletError
	switch {
	case errors.As(err, &nk):
		return nk.Error()
	case gone && p.Reason == ReasonTLS && !errors.Is(err, errUnverifiable):
		return "what answers at " + addr + " since the kubelet went cannot show a certificate plugd verifies: it is not the kubelet, and plugd sent it nothing"
	}
	return ""
}

// unverified says err is a failure to verify the kubelet's certificate.
func unverified(cfg Config, err error) bool {
	return !errors.Is(err, errUnverifiable) && classify(cfg, err, time.Time{}).Reason == ReasonTLS
}

// holdLoop holds a connection to the kubelet, and asks for a read whenever
// one is made or ends: its end says the kubelet's process went (or
// restarted), or the connection was cut.
func (w *Watch) holdLoop(ctx context.Context) {
	wait := holdRetryMin
	for ctx.Err() == nil {
		up := false
		err := w.c.hold(ctx, func() {
			up, wait = true, holdRetryMin
			w.Request()
		})
		if ctx.Err() != nil {
			return
		}
		if up {
			w.mu.Lock()
			w.rec.gone = true // until a read verifies the kubelet again
			w.mu.Unlock()
		}
		w.Request()
		if up {
			continue // redial at once: a restarting kubelet refuses, and the reads say so
		}
		limit := holdRetryMax
		if p := classify(w.cfg, err, time.Time{}); p.Reason == ReasonNotRunning {
			limit = holdRetryDown
		}
		select {
		case <-ctx.Done():
			return
		case <-w.clock.After(wait):
		}
		wait = min(2*wait, limit)
	}
}

// cutOff says a read was cut off mid-way: the connection was reset or
// ended early.
func cutOff(err error) bool {
	return errors.Is(err, syscall.ECONNRESET) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF)
}

func result(err error) string {
	if err != nil {
		return "error"
	}
	return "ok"
}

// latest is the later of two times.
func latest(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// earliest is the earlier of two times, zero meaning none.
func earliest(a, b time.Time) time.Time {
	if a.IsZero() || (!b.IsZero() && b.Before(a)) {
		return b
	}
	return a
}
