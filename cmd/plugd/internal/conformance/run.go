package conformance

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"time"

	"google.golang.org/grpc"
)

// Timing the kit takes from the kubelet v1.37 (see each check's Kubelet).
const (
	getInfoDeadline = time.Second     // operation_generator.go: GetInfo
	notifyDeadline  = 5 * time.Second // operation_generator.go: notifyPlugin
	// firstAnswer is how long a stream is given to send its first message:
	// ListAndWatch's inventory, or a health stream's Unimplemented.
	firstAnswer = time.Second
	// defaultTimeout bounds every other wait: a socket to appear, an
	// endpoint to accept, a call to answer, the plugin to exit.
	defaultTimeout = 10 * time.Second
)

// Config is a run of the kit. The zero value is not usable: RegistryDir is
// required, or EndpointDir with DeviceManager.
type Config struct {
	// RegistryDir is the directory the plugin makes its registration
	// socket in, the kubelet's plugins_registry.
	RegistryDir string
	// EndpointDir is the directory passed to a started plugin for its own
	// endpoint; "" passes nothing there.
	EndpointDir string
	// Command starts the plugin under test; empty: the plugin is already
	// running, and the checks that restart it are skipped.
	Command []string
	// RegistryEnv and EndpointEnv name further environment variables set to
	// RegistryDir and EndpointDir for the started plugin.
	RegistryEnv, EndpointEnv []string
	// Timeout bounds every wait of the kit; zero means 10 s. The kubelet's
	// own deadlines (GetInfo 1 s, notification 5 s) are fixed.
	Timeout time.Duration
	// DeviceManager serves the device manager's kubelet.sock in
	// EndpointDir (replacing a dead one there; one that is served, by a
	// kubelet, is an error), for device plugins that register by calling
	// it. It is always served for a plugin the kit starts.
	DeviceManager bool
	// CSISanity is the path of a csi-sanity binary to run against a CSI
	// driver's endpoint (csi/sanity-node), with CSISanityFlags added to its
	// command line; "": that check is skipped.
	CSISanity      string
	CSISanityFlags []string
	// Kubeconfig names the API server a DRA driver publishes its
	// ResourceSlices to, and NodeName the node it was told it runs on
	// (dra/resource-slices); "": that check is skipped.
	Kubeconfig, NodeName string
	// HealthCommand is run with /bin/sh -c to make one of a device
	// plugin's devices change health (deviceplugin/health-change); "":
	// that check is skipped.
	HealthCommand string
	// ReregisterWait bounds the wait for a device plugin to call Register
	// again on a kubelet.sock made anew; zero means twice Timeout. The
	// kubelet's own bound is endpointStopGracePeriod, 5 m.
	ReregisterWait time.Duration
	// Strict makes the recommendations required too; by default only the
	// kubelet's rules are.
	Strict bool
	// PluginOutput receives a started plugin's standard output and error;
	// nil discards them.
	PluginOutput io.Writer
}

// ErrInterrupted is Run's error when its context ended before the checks
// did: there is no report, and a plugin the kit started has been stopped.
var ErrInterrupted = errors.New("conformance: interrupted")

// runner is one run: its configuration, the plugin, and the results.
type runner struct {
	cfg    Config
	target *target // nil: attached
	rep    Report
	ran    map[string]bool
	// skipWhy says why the checks that did not run were skipped.
	skipWhy string
	// dm is the device manager's kubelet.sock, if served.
	dm *deviceManager
	// via is how the plugin registered: viaRegistry, viaKubeletSock, or
	// "" while unknown.
	via string
}

// Run plays the kubelet against the plugin cfg names and reports what
// every check found; the report passes when no required check failed. It
// blocks until the checks are done and a started plugin has exited (it is
// stopped with SIGTERM, then killed, with every process of its process
// group). An error is returned only when the kit could not run at all, or
// ctx ended first (ErrInterrupted).
func Run(ctx context.Context, cfg Config) (*Report, error) {
	cfg.DeviceManager = (cfg.DeviceManager || len(cfg.Command) > 0) && cfg.EndpointDir != ""
	if cfg.RegistryDir == "" && !cfg.DeviceManager {
		return nil, errors.New("no registry directory: pass --registry-dir, or a command to start after --")
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = defaultTimeout
	}
	if cfg.ReregisterWait <= 0 {
		cfg.ReregisterWait = 2 * cfg.Timeout
	}
	if cfg.PluginOutput == nil {
		cfg.PluginOutput = io.Discard
	}
	r := &runner{cfg: cfg, ran: map[string]bool{}}
	if cfg.DeviceManager {
		dm, err := startDeviceManager(cfg.EndpointDir, cfg.Timeout)
		if err != nil {
			return nil, err
		}
		defer dm.stop()
		r.dm = dm
	}
	if len(cfg.Command) > 0 {
		r.target = newTarget(cfg.Command, &cfg)
		if err := r.target.start(); err != nil {
			return nil, err
		}
	}
	began := time.Now()
	r.suite(ctx)
	if r.target != nil {
		// Stopped even when ctx has ended (the run interrupted): its own
		// deadline, not ctx's, bounds the plugin's exit.
		stop, cancel := withDeadline(context.WithoutCancel(ctx), r.cfg.Timeout, "the plugin to exit on SIGTERM at the end")
		r.target.terminate(stop)
		cancel()
	}
	if ctx.Err() != nil {
		return nil, fmt.Errorf("%w: the run was interrupted (%w); the plugin was stopped", ErrInterrupted, context.Cause(ctx))
	}
	r.finish()
	r.rep.Duration = time.Since(began)
	return &r.rep, nil
}

// suite runs the checks in order; each step needs what the one before found.
func (r *runner) suite(ctx context.Context) {
	sock, first := r.checkSocket(ctx)
	if sock == nil {
		if r.via == viaKubeletSock {
			r.kubeletSockSuite(ctx)
		}
		return
	}
	r.via, first.Via = viaRegistry, viaRegistry
	r.rep.Plugin = &first
	r.checkInfo(first)
	ep := r.checkEndpoint(ctx, first)
	r.checkNotify(ctx, sock)
	sock.close()
	if ep != nil {
		r.typeSuite(ctx, first, ep)
		ep.Close()
	} else {
		r.skipTypeChecks(first.Type, "not run: the endpoint does not accept connections")
	}
	r.checkRestart(ctx, first)
	r.checkLateNotify(ctx, first)
	if r.target != nil {
		r.lifecycle(ctx, first)
	}
}

// skipTypeChecks records the checks of type typ, of the way the plugin
// registers, as skipped, with why.
func (r *runner) skipTypeChecks(typ, why string) {
	for _, c := range catalogue {
		if c.Types != nil && c.appliesTo(typ) && (c.Via == "" || c.Via == r.via) {
			r.skip(c.ID, why)
		}
	}
}

func (r *runner) typeSuite(ctx context.Context, info PluginInfo, ep *grpc.ClientConn) {
	switch info.Type {
	case typeCSI:
		r.csiSuite(ctx, info, ep)
	case typeDRA:
		r.draSuite(ctx, info, ep)
	case typeDevice:
		r.devicePluginSuite(ctx, ep)
	}
}

// record adds a check's result.
func (r *runner) record(id, status, seen string, took time.Duration) {
	c := checkByID(id)
	r.ran[id] = true
	r.rep.Checks = append(r.rep.Checks, Result{ID: id, Status: status, Rule: c.rule(), Required: c.Kubelet != "" || r.cfg.Strict,
		Kubelet: c.Kubelet, Expected: c.Expect, Seen: seen, Duration: took})
}

func (r *runner) pass(id, seen string, since time.Time) {
	r.record(id, statusPass, seen, time.Since(since))
}
func (r *runner) fail(id, seen string, since time.Time) {
	r.record(id, statusFail, seen, time.Since(since))
}

// check records a failure that err says, or, with err nil, a pass that
// seen says; it reports whether the check passed.
func (r *runner) check(id string, err error, seen string, since time.Time) bool {
	if err != nil {
		r.fail(id, err.Error(), since)
		return false
	}
	r.pass(id, seen, since)
	return true
}

// skip records id as skipped, with why.
func (r *runner) skip(id, why string) { r.record(id, statusSkip, why, 0) }

// finish adds every check that applies to the plugin and did not run as
// skipped, in the catalogue's order, and the verdict.
func (r *runner) finish() {
	typ := ""
	if r.rep.Plugin != nil {
		typ = r.rep.Plugin.Type
	}
	why := r.skipWhy
	if why == "" {
		why = "not run: an earlier check failed"
	}
	for _, c := range catalogue {
		if r.ran[c.ID] || (c.Types != nil && !c.appliesTo(typ)) {
			continue
		}
		if r.via != "" && c.Via != "" && c.Via != r.via {
			r.skip(c.ID, fmt.Sprintf("the plugin registers through %s; this check is for plugins that register through %s", viaName(r.via), viaName(c.Via)))
			continue
		}
		if c.Started && r.target == nil {
			r.skip(c.ID, "the kit attached to a running plugin: start it with -- COMMAND to run this check")
			continue
		}
		r.skip(c.ID, why)
	}
	r.sortAndJudge()
}

// sortAndJudge puts the results in the catalogue's order and gives the
// verdict.
func (r *runner) sortAndJudge() {
	order := map[string]int{}
	for i, c := range catalogue {
		order[c.ID] = i
	}
	slices.SortStableFunc(r.rep.Checks, func(a, b Result) int { return order[a.ID] - order[b.ID] })
	r.rep.Passed = r.rep.failed(true) == 0
}

// viaName says a way of registering in words.
func viaName(via string) string {
	if via == viaKubeletSock {
		return "the device manager's kubelet.sock"
	}
	return "the registry directory"
}
