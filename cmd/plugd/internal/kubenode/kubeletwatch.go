package kubenode

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"maps"
	"sync"
	"syscall"
	"time"

	"k8s.io/utils/clock"
)

// Pacing of the reads of the kubelet. Reads follow change: the loop asks
// for them while the kubelet and the sockets disagree (a socket the
// kubelet has not taken up yet, a kubelet that restarted), and every
// change of the node's API objects asks for one. Otherwise the kubelet is
// read every KubeletConfig.Resync, and its held connection says at once
// when its process goes.
const (
	defaultKubeletResync = 5 * time.Minute
	// While unsettled, the kubelet is read every unsettledFast for the
	// first fastFor (its plugin manager's loop runs every second), then
	// every unsettledSlow until slowFor, then only on change and resync.
	unsettledFast = 250 * time.Millisecond
	fastFor       = 5 * time.Second
	unsettledSlow = time.Second
	slowFor       = time.Minute
	// devicesPoll is how often pod-resources is asked while an expected
	// device plugin waits for healthy devices: cheap, and local.
	devicesPoll = time.Second
	// minReadGap spaces out the reads a burst of changes asks for.
	minReadGap = 100 * time.Millisecond
	// kubeletSettle is how long after a socket is re-created the kubelet's
	// registration at its path may still be the old socket's: its
	// reconciler runs every second, and registers a new socket within one
	// pass. A registration seen to start after the socket was made counts
	// at once.
	kubeletSettle = 2 * time.Second
	// Redials of the held connection: after a refused one (the kubelet is
	// restarting) from holdRetryMin up to holdRetryDown; after any other
	// failure (TLS, no route) up to holdRetryMax.
	holdRetryMin  = 250 * time.Millisecond
	holdRetryDown = 2 * time.Second
	holdRetryMax  = time.Minute
)

// kubeletWatch reads the kubelet when asked, when its held connection is
// made or ends, and every resync; it keeps what the last reads found. Its
// methods are safe for concurrent use.
type kubeletWatch struct {
	c        *kubeletClient // nil: reading the kubelet is off
	cfg      KubeletConfig
	clock    clock.WithTicker
	log      *slog.Logger
	m        *metrics
	onChange func() // called after every read, outside mu
	resync   time.Duration

	kick    chan struct{} // read now
	devices chan struct{} // read pod-resources now
	wake    chan struct{} // the loop's wishes changed: look at the timer again

	mu sync.Mutex
	// Guarded by mu:
	state   *kubeletState // the last good read; nil while none, or the kubelet is down
	problem *Problem      // why the last read failed; nil after a good one
	// impostor says, when the last read found a listener at the kubelet's
	// address that is not the kubelet, who it is.
	impostor string
	// started is the kubelet's start time at the last good read, kept
	// across its downtime, to tell a restart; restarted says plugd saw one.
	started   time.Time
	restarted bool
	// gone says plugd saw the kubelet go (it was judged not running, or
	// its held connection ended) and has read none since: a certificate
	// that does not verify then is not the kubelet's (impostor).
	gone bool
	// presentSince is, by socket path, the first read of the current run
	// of reads in which the kubelet's actual state held it.
	presentSince map[string]time.Time
	// retrying is, by socket path, the first read of the current run of
	// reads in which the kubelet's desired state held it while its actual
	// state did not (a registration pending, or refused and backing off),
	// kept while the desired state holds it; dropped is the last read
	// that found a registration there gone while the desired state kept
	// the path (the kubelet registering it again).
	retrying, dropped map[string]time.Time
	// The loop's wishes: the next reads no later than these (zero: none).
	wantMetrics, wantDevices time.Time
	lastMetrics, lastDevices time.Time
	// cut counts reads in a row cut off mid-way (a kubelet stopping
	// resets its connections before it stops listening); retryAt is when
	// the next is due.
	cut     int
	retryAt time.Time
	// reads counts the reads that were recorded: what the state says may
	// have changed with each.
	reads uint64
}

// A read cut off mid-way is tried again after cutRetry, up to maxCuts
// times, before it counts: a kubelet going away resets its connections a
// moment before its port refuses.
const (
	cutRetry = 100 * time.Millisecond
	maxCuts  = 5
)

func newKubeletWatch(c *kubeletClient, cfg KubeletConfig, clk clock.WithTicker, log *slog.Logger, m *metrics, onChange func()) *kubeletWatch {
	w := &kubeletWatch{c: c, cfg: cfg, clock: clk, log: log, m: m, onChange: onChange,
		resync: cfg.Resync, kick: make(chan struct{}, 1), devices: make(chan struct{}, 1), wake: make(chan struct{}, 1), presentSince: map[string]time.Time{},
		retrying: map[string]time.Time{}, dropped: map[string]time.Time{}}
	if w.resync <= 0 {
		w.resync = defaultKubeletResync
	}
	if c == nil {
		w.problem = &Problem{Operation: "read the kubelet", Reason: ReasonKubeletDisabled,
			Message: "kubernetes.kubelet.address is not set: plugd infers what the kubelet registered from API objects, which outlive its registrations; set it to the kubelet's secure port (the DaemonSet sets it from the node's IP)"}
	}
	return w
}

// request asks for a read of everything now.
func (w *kubeletWatch) request() {
	select {
	case w.kick <- struct{}{}:
	default:
	}
}

// requestDevices asks for a read of the kubelet's devices now: cheap, and
// local.
func (w *kubeletWatch) requestDevices() {
	select {
	case w.devices <- struct{}{}:
	default:
	}
}

// want asks for the next read of the kubelet's metrics no later than
// metrics, and of its devices no later than devices (zero: no wish).
func (w *kubeletWatch) want(metrics, devices time.Time) {
	w.mu.Lock()
	changed := !metrics.Equal(w.wantMetrics) || !devices.Equal(w.wantDevices)
	w.wantMetrics, w.wantDevices = metrics, devices
	w.mu.Unlock()
	if changed {
		select {
		case w.wake <- struct{}{}:
		default:
		}
	}
}

// run reads until ctx is done, and holds the connection meanwhile. It
// returns once both have stopped.
func (w *kubeletWatch) run(ctx context.Context) {
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

func (w *kubeletWatch) lastRead() time.Time {
	w.mu.Lock()
	defer w.mu.Unlock()
	return latest(w.lastMetrics, w.lastDevices)
}

// due says which reads are due at now (forced: both), and when the next
// one will be.
func (w *kubeletWatch) due(now time.Time, forced bool) (metrics, devices bool, next time.Time) {
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
func (w *kubeletWatch) read(ctx context.Context, now time.Time, metrics, devices bool) {
	var s kubeletState
	var err error
	if metrics {
		s, err = w.readMetrics(ctx)
		s.at = now
		w.m.kubeletReads.WithLabelValues("metrics", result(err)).Inc()
		w.m.kubeletBytes.Add(float64(s.bytes))
	}
	var devs map[string]int
	var devErr error
	if devices && err == nil {
		devs, devErr = w.c.readDevices(ctx)
		w.m.kubeletReads.WithLabelValues("pod_resources", result(devErr)).Inc()
	}
	if ctx.Err() != nil {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.reads++
	if devices {
		w.lastDevices = now
	}
	if !metrics {
		if w.state != nil && devErr == nil {
			w.state.devices, w.state.devicesErr = devs, nil
		} else if w.state != nil {
			w.state.devicesErr = devErr
		}
		return
	}
	w.lastMetrics = now
	w.retryAt = time.Time{}
	if err != nil && cutOff(err) && w.cut < maxCuts {
		w.cut++
		w.retryAt = now.Add(cutRetry)
		return
	}
	w.cut = 0
	w.impostor = ""
	if err != nil {
		was := w.problem
		p := classifyKubelet(w.cfg, err, now)
		w.impostor = impostor(err, p, w.gone, w.cfg.Address)
		if was != nil && was.Reason == p.Reason {
			p.Since = was.Since
		}
		w.problem = p
		if p.Reason == ReasonKubeletNotRunning {
			// A kubelet that is not running has registered nothing; the
			// next one starts afresh.
			w.state = nil
			w.forget()
			w.gone = true
		}
		if was == nil || was.Reason != p.Reason {
			w.log.Warn("cannot read the kubelet", "address", w.cfg.Address, "reason", p.Reason, "err", p.Message)
		}
		return
	}
	if w.problem != nil {
		w.log.Info("reading the kubelet again", "address", w.cfg.Address, "troubleSince", w.problem.Since)
	}
	w.problem = nil
	w.gone = false
	if !w.started.IsZero() && !s.started.Equal(w.started) {
		w.restarted = true
		w.forget()
		w.log.Info("the kubelet restarted", "started", s.started, "before", w.started)
	}
	w.started = s.started
	w.track(s.registered, s.seen, now)
	if devices {
		s.devices, s.devicesErr = devs, devErr
	} else if w.state != nil {
		s.devices, s.devicesErr = w.state.devices, w.state.devicesErr
	}
	w.state = &s
}

// readMetrics reads the kubelet's /metrics; if its certificate does not
// verify, with caFile read again when that changed it: a kubelet.crt
// regenerated or rotated while plugd runs.
func (w *kubeletWatch) readMetrics(ctx context.Context) (kubeletState, error) {
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
	case gone && p.Reason == ReasonKubeletTLS && !errors.Is(err, errUnverifiable):
		return "what answers at " + addr + " since the kubelet went cannot show a certificate plugd verifies: it is not the kubelet, and plugd sent it nothing"
	}
	return ""
}

// unverified says err is a failure to verify the kubelet's certificate.
func unverified(cfg KubeletConfig, err error) bool {
	return !errors.Is(err, errUnverifiable) && classifyKubelet(cfg, err, time.Time{}).Reason == ReasonKubeletTLS
}

// track records what a read at now showed of each socket path: the
// kubelet's actual state (registered) and desired state (seen). w.mu must
// be held.
func (w *kubeletWatch) track(registered, seen map[string]bool, now time.Time) {
	for p := range registered {
		if _, ok := w.presentSince[p]; !ok {
			w.presentSince[p] = now
		}
	}
	for p := range w.presentSince {
		if !registered[p] {
			delete(w.presentSince, p)
			if seen[p] {
				w.dropped[p] = now
			}
		}
	}
	for p := range seen {
		if _, ok := w.retrying[p]; !ok && !registered[p] {
			w.retrying[p] = now
		}
	}
	for _, m := range []map[string]time.Time{w.retrying, w.dropped} {
		for p := range m {
			if !seen[p] {
				delete(m, p)
			}
		}
	}
}

// forget drops what the reads showed of each path: a kubelet that is not
// running has registered nothing, and the next one starts afresh. w.mu
// must be held.
func (w *kubeletWatch) forget() {
	clear(w.presentSince)
	clear(w.retrying)
	clear(w.dropped)
}

// holdLoop holds a connection to the kubelet, and asks for a read whenever
// one is made or ends: its end says the kubelet's process went (or
// restarted), or the connection was cut.
func (w *kubeletWatch) holdLoop(ctx context.Context) {
	wait := holdRetryMin
	for ctx.Err() == nil {
		up := false
		err := w.c.hold(ctx, func() {
			up, wait = true, holdRetryMin
			w.request()
		})
		if ctx.Err() != nil {
			return
		}
		if up {
			w.mu.Lock()
			w.gone = true // until a read verifies the kubelet again
			w.mu.Unlock()
		}
		w.request()
		if up {
			continue // redial at once: a restarting kubelet refuses, and the reads say so
		}
		limit := holdRetryMax
		if p := classifyKubelet(w.cfg, err, time.Time{}); p.Reason == ReasonKubeletNotRunning {
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

// kubeletNow is what the watch holds for one evaluation.
type kubeletNow struct {
	state        *kubeletState
	problem      *Problem
	restarted    bool
	presentSince map[string]time.Time
	retrying     map[string]time.Time
	dropped      map[string]time.Time
	reads        uint64
	// devicesAt is the last read of pod-resources (with the metrics, or
	// alone).
	devicesAt time.Time
	impostor  string
}

func (w *kubeletWatch) now() kubeletNow {
	w.mu.Lock()
	defer w.mu.Unlock()
	k := kubeletNow{state: w.state, problem: w.problem, restarted: w.restarted, presentSince: maps.Clone(w.presentSince),
		retrying: maps.Clone(w.retrying), dropped: maps.Clone(w.dropped), reads: w.reads, devicesAt: w.lastDevices, impostor: w.impostor}
	if k.problem != nil {
		p := *k.problem
		k.problem = &p
	}
	return k
}

// facts is what the views are made of, for the sockets socks: a socket
// counts as registered once the kubelet registered it, not an older
// socket at its path.
func (k kubeletNow) facts(address string, socks map[key][]Plugin) kubeletFacts {
	kf := kubeletFacts{problem: k.problem, restarted: k.restarted, address: address, impostor: k.impostor}
	switch {
	case k.problem != nil && (k.problem.Reason == ReasonKubeletNotRunning || k.impostor != ""):
		kf.down = true
		return kf
	case k.problem != nil || k.state == nil:
		return kf
	}
	kf.live, kf.seen, kf.devices = true, k.state.seen, k.state.devices
	kf.registered = map[string]bool{}
	for _, ps := range socks {
		for _, p := range ps {
			if k.state.registered[p.Socket] && k.credited(p.Socket, p.Created) {
				kf.registered[p.Socket] = true
			}
		}
	}
	return kf
}

// credited says the kubelet's registration at socket's path is of the
// socket made at created, not of an older socket at that path.
func (k kubeletNow) credited(socket string, created time.Time) bool {
	return credited(created, pathRun{present: k.presentSince[socket], retrying: k.retrying[socket], dropped: k.dropped[socket]}, k.state.at)
}

// pathRun is what the kubelet's reads showed of one socket path: since
// when it has held a registration there, since when it had the path
// without registering it, when it last dropped a registration there.
type pathRun struct {
	present, retrying, dropped time.Time
}

// credited says a registration at a socket's path is of the socket made
// at created, as a read at readAt shows it.
//
// One that began before the socket was made is an older socket's, until
// the kubelet has had time to replace it (kubeletSettle). One that began
// after it is the socket's, unless the kubelet was already retrying a
// registration at that path when the socket was made (it refused the
// older one, or could not reach it): that retry, begun with the older
// socket's timestamp, may be what succeeded, against the new socket, and
// the kubelet then registers the path again in its next passes. Such a
// registration counts once it has held for kubeletSettle, or once the
// kubelet has dropped one there since the socket was made (the
// registration again, which is the socket's).
func credited(created time.Time, run pathRun, readAt time.Time) bool {
	switch {
	case !run.present.After(created):
		return !readAt.Before(created.Add(kubeletSettle))
	case run.retrying.IsZero() || run.retrying.After(created) || run.dropped.After(created):
		return true
	default:
		return !readAt.Before(run.present.Add(kubeletSettle))
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
