// Command demo shows plugd's plugin manager at work in a few seconds:
//
//	go run ./examples/demo
//
// It runs a pluginmanager.Manager on a temporary registry directory, with
// handlers for CSIPlugin, DevicePlugin and a custom example.com/Greeter type,
// and starts example plugins in it: some register, one is refused by its
// handler, one has a type nobody handles, one stops, and one "crashes" and
// comes back. Every event the manager publishes is printed as it happens,
// then a table of what the manager knows. Nothing is left behind; Ctrl-C
// ends it early.
//
// With -watch the manager keeps running after the scenario, so that you can
// start plugins of your own against it with examples/plugin.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"text/tabwriter"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/plugd/plugd/plugin"
	"github.com/plugd/plugd/pluginmanager"
)

// Plugin types. CSIPlugin and DevicePlugin are the kubelet's names.
const (
	typeCSI     = "CSIPlugin"
	typeDevice  = "DevicePlugin"
	typeGreeter = "example.com/Greeter"
	typeUnknown = "example.com/Unknown" // no handler on purpose
)

// stepTimeout bounds each step's wait for its events. A step takes
// milliseconds; the margin is for slow or busy machines.
const stepTimeout = 15 * time.Second

func main() {
	watch := flag.Bool("watch", false, "after the scenario, keep the manager running and print its events until Ctrl-C, so that you can start examples/plugin against it")
	flag.Parse()
	// Whatever ends the demo from outside, its cleanup runs: Ctrl-C, kill,
	// or a closed terminal (SIGHUP). Output piped into a reader that quits
	// (go run ./examples/demo | head) would kill it with SIGPIPE; ignored,
	// the writes just fail and the demo finishes and cleans up.
	signal.Ignore(syscall.SIGPIPE)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM, syscall.SIGHUP)
	err := runDemo(ctx, os.Stdout, *watch)
	interrupted := ctx.Err() != nil
	stop()
	switch {
	case err == nil:
	case interrupted && errors.Is(err, context.Canceled):
		fmt.Fprintln(os.Stderr, "demo: interrupted; everything it started is stopped and its directory removed")
	default:
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
}

// run runs the scenario, writing what happens to out, and cleans up after
// itself. It fails if an expected event does not come within stepTimeout.
func run(ctx context.Context, out io.Writer) error {
	return runDemo(ctx, out, false)
}

// runDemo is run, then, if watch is set, prints events until ctx is done.
func runDemo(ctx context.Context, out io.Writer, watch bool) (err error) {
	d := &demo{out: out, start: time.Now(), held: make(map[string]map[string]string)}
	if d.dir, err = makeRegistryDir(); err != nil {
		return err
	}
	// The deferred cleanup stops the manager, then the plugins, then removes
	// the directory, whatever happened before.
	defer func() { err = errors.Join(err, d.cleanup()) }()

	d.m, err = pluginmanager.New(pluginmanager.Options{
		Dir: d.dir,
		// The default backoff starts at 500ms and doubles; 200ms lets the
		// crashed plugin's retries show within the demo's few seconds.
		BackoffInitial: 200 * time.Millisecond,
		BackoffMax:     2 * time.Second,
		// The Greeter handler's health check dials the plugin; a stuck one
		// should fail its step in seconds, not the default 30s.
		HandlerTimeout: 5 * time.Second,
	})
	if err != nil {
		return err
	}
	d.m.AddHandler(typeCSI, d.handler(validateCSI, nil))
	d.m.AddHandler(typeDevice, d.handler(nil, nil))
	d.m.AddHandler(typeGreeter, d.handler(nil, checkHealth))
	// Subscribe before Run, so that no event is missed.
	d.sub = d.m.Subscribe()

	runCtx, cancelRun := context.WithCancel(ctx)
	d.stopManager = cancelRun
	d.runDone = make(chan error, 1)
	go func() { d.runDone <- d.m.Run(runCtx) }()

	fmt.Fprintf(out, "plugd demo: a plugin manager watches %s (removed at exit) for plugins'\n", d.dir)
	fmt.Fprintf(out, "registration sockets, with handlers for %s, %s and %s.\n", typeCSI, typeDevice, typeGreeter)
	fmt.Fprintf(out, "Example plugins come and go; each line is an event from Manager.Subscribe, as it happens.\n\n")
	fmt.Fprintf(out, eventFormat, "TIME", "EVENT", "TYPE", "NAME", "SOCKET", "DETAIL")

	if err := d.scenario(ctx); err != nil {
		return err
	}
	d.report()
	if watch {
		return d.watch(ctx)
	}
	return nil
}

// demo is the state of one run.
type demo struct {
	out   io.Writer
	start time.Time // event times are printed as offsets from it
	dir   string

	m           *pluginmanager.Manager
	sub         *pluginmanager.Subscription
	stopManager context.CancelFunc
	runDone     chan error // receives Run's result

	plugins []*plugin.Server // every plugin started, to close at the end

	// held is what the handlers have taken into use: type -> socket -> name,
	// as a real handler keeps what it needs to talk to its plugins.
	mu   sync.Mutex
	held map[string]map[string]string
}

func (d *demo) scenario(ctx context.Context) error {
	d.step("1. Three plugins start and register.")
	if _, err := d.startPlugin(plugin.Config{Type: typeCSI, Name: "csi.example.com", Socket: "csi.sock", Versions: []string{"1.0.0"}}); err != nil {
		return err
	}
	if _, err := d.startPlugin(plugin.Config{Type: typeDevice, Name: "example.com/gpu", Socket: "gpu.sock", Versions: []string{"v1beta1"}}); err != nil {
		return err
	}
	greeter, err := d.startPlugin(plugin.Config{Type: typeGreeter, Name: "greeter.example.com", Socket: "greeter.sock", Versions: []string{"v1"},
		Services: serveHealth}) // its own API, which the Greeter handler checks
	if err != nil {
		return err
	}
	if err := d.await(ctx, "the three plugins to register",
		is(pluginmanager.EventRegistered, "csi.sock"),
		is(pluginmanager.EventRegistered, "gpu.sock"),
		is(pluginmanager.EventRegistered, "greeter.sock")); err != nil {
		return err
	}

	d.step("2. A CSI driver that speaks only CSI 0.3.0 is refused by the CSIPlugin handler's Validate.")
	old, err := d.startPlugin(plugin.Config{Type: typeCSI, Name: "csi-old.example.com", Socket: "csi-old.sock", Versions: []string{"0.3.0"}})
	if err != nil {
		return err
	}
	if err := d.await(ctx, "csi-old.sock to be rejected", is(pluginmanager.EventRejected, "csi-old.sock")); err != nil {
		return err
	}
	d.told(old)

	d.step("3. A plugin of a type no handler is registered for is refused.")
	unknown, err := d.startPlugin(plugin.Config{Type: typeUnknown, Name: "mystery.example.com", Socket: "unknown.sock", Versions: []string{"v1"}})
	if err != nil {
		return err
	}
	if err := d.await(ctx, "unknown.sock to be rejected", is(pluginmanager.EventRejected, "unknown.sock")); err != nil {
		return err
	}
	d.told(unknown)

	d.step("4. The Greeter stops: its socket goes, so its handler lets it go.")
	if err := greeter.Close(); err != nil {
		return fmt.Errorf("stopping the Greeter plugin: %w", err)
	}
	if err := d.await(ctx, "greeter.sock to be deregistered and removed",
		is(pluginmanager.EventDeregistered, "greeter.sock"),
		is(pluginmanager.EventRemoved, "greeter.sock")); err != nil {
		return err
	}

	d.step("5. A device plugin crashed and left its socket behind: nobody answers on it.")
	if err := leaveStaleSocket(d.dir, "fpga.sock"); err != nil {
		return err
	}
	// A socket refusing connections just after it appeared may be bound but
	// not listening yet, so the manager looks again within 10ms; after that
	// it backs off from BackoffInitial, doubling. Wait for that real retry.
	if err := d.await(ctx, "fpga.sock to fail three times", func(ev pluginmanager.Event) bool {
		return is(pluginmanager.EventFailed, "fpga.sock")(ev) && ev.Attempt >= 3
	}); err != nil {
		return err
	}
	d.step("   It restarts on the same socket name, and registers at once, without waiting out the backoff.")
	if _, err := d.startPlugin(plugin.Config{Type: typeDevice, Name: "example.com/fpga", Socket: "fpga.sock", Versions: []string{"v1beta1"}}); err != nil {
		return err
	}
	return d.await(ctx, "fpga.sock to register", is(pluginmanager.EventRegistered, "fpga.sock"))
}

// startPlugin starts an example plugin in d.dir; cleanup closes it.
func (d *demo) startPlugin(cfg plugin.Config) (*plugin.Server, error) {
	cfg.Dir = d.dir
	s, err := plugin.Start(cfg)
	if err != nil {
		return nil, fmt.Errorf("starting example plugin %s: %w", cfg.Name, err)
	}
	d.plugins = append(d.plugins, s)
	return s, nil
}

// is matches an event of type typ on the socket named socket.
func is(typ pluginmanager.EventType, socket string) func(pluginmanager.Event) bool {
	return func(ev pluginmanager.Event) bool {
		return ev.Type == typ && filepath.Base(ev.Plugin.Socket) == socket
	}
}

// await prints events as they arrive until each of want has matched one, and
// fails if that takes longer than stepTimeout or ctx is done.
func (d *demo) await(ctx context.Context, what string, want ...func(pluginmanager.Event) bool) error {
	timer := time.NewTimer(stepTimeout)
	defer timer.Stop()
	for len(want) > 0 {
		select {
		case ev, ok := <-d.sub.Events():
			if !ok {
				if ctx.Err() != nil {
					return fmt.Errorf("waiting for %s: %w", what, context.Cause(ctx))
				}
				// Run returned early; cleanup reports its error.
				return fmt.Errorf("waiting for %s: the plugin manager stopped", what)
			}
			d.print(ev)
			want = slices.DeleteFunc(want, func(match func(pluginmanager.Event) bool) bool { return match(ev) })
		case <-timer.C:
			return fmt.Errorf("waiting for %s: it did not happen within %s; the events above show how far it got", what, stepTimeout)
		case <-ctx.Done():
			return fmt.Errorf("waiting for %s: %w", what, context.Cause(ctx))
		}
	}
	return nil
}

// eventFormat aligns an event line; the widths fit the demo's plugins.
const eventFormat = "%-8s %-12s %-20s %-20s %-13s %s\n"

// print writes one event line.
func (d *demo) print(ev pluginmanager.Event) {
	typ, name := ev.Plugin.Type, ev.Plugin.Name
	if typ == "" {
		typ, name = "-", "-" // the plugin has not answered GetInfo (yet)
	}
	var detail string
	switch ev.Type {
	case pluginmanager.EventRegistered:
		detail = "versions " + strings.Join(ev.Plugin.Versions, ",")
		if ev.Attempt > 1 {
			detail += fmt.Sprintf(", attempt %d", ev.Attempt)
		}
	case pluginmanager.EventDiscovered:
		detail = "new socket file"
	case pluginmanager.EventFailed:
		detail = fmt.Sprintf("attempt %d, retry in %s; %s: %s", ev.Attempt,
			ev.NextRetry.Sub(ev.Time).Round(time.Millisecond), ev.Reason, d.short(ev.Error))
	case pluginmanager.EventRejected:
		detail = fmt.Sprintf("%s: %s", ev.Reason, d.short(ev.Error))
	case pluginmanager.EventDeregistered:
		detail = d.short(ev.Error) // set only if the handler's Deregister failed
	case pluginmanager.EventLost:
		detail = fmt.Sprintf("this subscriber fell behind and missed %d events", ev.Missed)
	}
	// Removed carries the socket's last error, which its Rejected or Failed line showed already.
	offset := fmt.Sprintf("+%.3fs", ev.Time.Sub(d.start).Seconds())
	line := fmt.Sprintf(eventFormat, offset, ev.Type, typ, name, filepath.Base(ev.Plugin.Socket), detail)
	fmt.Fprintln(d.out, strings.TrimRight(line, " \n"))
}

// short drops the registry directory from the paths in a manager's error:
// it was printed once at the top, and the lines stay readable without it.
func (d *demo) short(msg string) string {
	return strings.ReplaceAll(msg, d.dir+string(filepath.Separator), "")
}

func (d *demo) step(title string) {
	fmt.Fprintf(d.out, "\n%s\n", title)
}

// told prints what a refused plugin heard from the manager, as the plugin
// side of the protocol sees it. The manager notifies the plugin before it
// publishes the event, so the status is there by now.
func (d *demo) told(s *plugin.Server) {
	if st, ok := s.Status(); ok {
		fmt.Fprintf(d.out, "%-8s the plugin was told: registered=%t, with the reason above\n", "", st.Registered)
	}
}

// report prints the manager's view of every socket, and what the handlers hold.
func (d *demo) report() {
	fmt.Fprintf(d.out, "\nWhat the manager knows now (Manager.Plugins):\n\n")
	tw := tabwriter.NewWriter(d.out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "SOCKET\tTYPE\tNAME\tSTATE\tATTEMPTS\tERROR")
	counts := make(map[pluginmanager.State]int)
	plugins := d.m.Plugins()
	for _, p := range plugins {
		counts[p.State]++
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%s\n", filepath.Base(p.Socket), orDash(p.Type), orDash(p.Name),
			p.State, p.Attempts, orDash(truncate(d.short(p.LastError), 60)))
	}
	tw.Flush()

	var parts []string
	for _, s := range []pluginmanager.State{
		pluginmanager.StateRegistered, pluginmanager.StateRejected, pluginmanager.StateFailed,
		pluginmanager.StatePending, pluginmanager.StateRegistering, pluginmanager.StateUnhealthy,
	} {
		if counts[s] > 0 {
			parts = append(parts, fmt.Sprintf("%d %s", counts[s], strings.ToLower(string(s))))
		}
	}
	fmt.Fprintf(d.out, "\n%d sockets: %s.\nThe handlers hold: %s.\n", len(plugins), strings.Join(parts, ", "), d.holdings())

	fmt.Fprint(d.out, `
What you saw: a plugin announces itself with a socket in the registry directory;
the manager asks it who it is (GetInfo), lets the handler for its type decide,
and tells the plugin the verdict (NotifyRegistrationStatus). A refused plugin
stays refused until its socket changes; one nobody answers for is retried with
backoff; a plugin whose socket goes is deregistered.
To run a plugin yourself: go run ./examples/demo -watch, and in another
terminal the examples/plugin command it prints.
`)
}

// watch keeps the manager running after the scenario and prints its events
// until ctx is done: Ctrl-C is how this mode ends, so it is no error.
func (d *demo) watch(ctx context.Context) error {
	fmt.Fprintf(d.out, `
Watching %[1]s until Ctrl-C. In another terminal, try:
  go run ./examples/plugin -dir %[1]s
  go run ./examples/plugin -dir %[1]s -type example.com/Nope -name nope -exit-when-refused

`, d.dir)
	for {
		select {
		case ev, ok := <-d.sub.Events():
			if !ok {
				if ctx.Err() != nil {
					return nil
				}
				return errors.New("the plugin manager stopped")
			}
			d.print(ev)
		case <-ctx.Done():
			return nil
		}
	}
}

// cleanup stops the manager and waits for Run to return, closes every
// plugin, and removes the registry directory. It is safe to call after a
// partial start.
func (d *demo) cleanup() error {
	var errs []error
	if d.stopManager != nil {
		d.stopManager()
		if err := <-d.runDone; err != nil {
			errs = append(errs, fmt.Errorf("plugin manager: %w", err))
		}
	}
	if d.sub != nil {
		d.sub.Close()
	}
	for _, s := range d.plugins {
		if err := s.Close(); err != nil {
			errs = append(errs, err)
		}
	}
	if err := os.RemoveAll(d.dir); err != nil {
		errs = append(errs, fmt.Errorf("removing the registry directory; remove it by hand: %w", err))
	}
	return errors.Join(errs...)
}

// makeRegistryDir makes a fresh private registry directory. Unix socket
// paths must be shorter than 108 bytes, so a long $TMPDIR is passed over for
// /tmp.
func makeRegistryDir() (string, error) {
	dir, err := os.MkdirTemp("", "plugd-")
	if err == nil && len(dir) > 64 {
		os.Remove(dir)
		dir, err = os.MkdirTemp("/tmp", "plugd-")
	}
	if err != nil {
		return "", fmt.Errorf("making a temporary registry directory (set TMPDIR to a short, writable directory): %w", err)
	}
	return dir, nil
}

// leaveStaleSocket leaves a socket named name in dir that nobody listens on,
// as a crashed plugin does. It is bound under a dot-name, which the manager
// ignores, and renamed into place once closed: bound under its final name, it
// could be dialled in the instant before Close and show a reset connection
// instead of the refusal a crash leaves.
func leaveStaleSocket(dir, name string) error {
	tmp := filepath.Join(dir, "."+name+".tmp")
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: tmp, Net: "unix"})
	if err != nil {
		return fmt.Errorf("making a stale socket: %w", err)
	}
	l.SetUnlinkOnClose(false)
	if err := l.Close(); err != nil {
		return fmt.Errorf("making a stale socket: %w", err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, name)); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("making a stale socket: %w", err)
	}
	return nil
}

// handler builds a handler that runs validate in Validate, and ready (if set)
// in Register before it takes the plugin into use.
func (d *demo) handler(validate, ready func(context.Context, pluginmanager.Plugin) error) pluginmanager.Handler {
	return pluginmanager.HandlerFuncs{
		ValidateFunc: validate,
		RegisterFunc: func(ctx context.Context, p pluginmanager.Plugin) error {
			if ready != nil {
				if err := ready(ctx, p); err != nil {
					return err
				}
			}
			d.mu.Lock()
			defer d.mu.Unlock()
			if d.held[p.Type] == nil {
				d.held[p.Type] = make(map[string]string)
			}
			d.held[p.Type][p.Socket] = p.Name
			return nil
		},
		DeregisterFunc: func(_ context.Context, p pluginmanager.Plugin) {
			d.mu.Lock()
			defer d.mu.Unlock()
			delete(d.held[p.Type], p.Socket)
		},
	}
}

// holdings says which plugins each handler holds, e.g.
// "CSIPlugin [csi.example.com], example.com/Greeter []".
func (d *demo) holdings() string {
	d.mu.Lock()
	defer d.mu.Unlock()
	var parts []string
	for _, typ := range []string{typeCSI, typeDevice, typeGreeter} {
		var names []string
		for _, name := range d.held[typ] {
			names = append(names, name)
		}
		slices.Sort(names)
		parts = append(parts, fmt.Sprintf("%s [%s]", typ, strings.Join(names, " ")))
	}
	return strings.Join(parts, ", ")
}

// validateCSI refuses a CSI driver that offers no CSI 1.x version, which is
// all this node speaks.
func validateCSI(_ context.Context, p pluginmanager.Plugin) error {
	for _, v := range p.Versions {
		if strings.HasPrefix(strings.TrimPrefix(v, "v"), "1.") {
			return nil
		}
	}
	return fmt.Errorf("CSI driver %s offers versions %v, but this node needs a 1.x version: upgrade the driver", p.Name, p.Versions)
}

// serveHealth serves the standard gRPC health service, reporting SERVING,
// on a plugin's socket: a plugin's own API, next to registration.
func serveHealth(s grpc.ServiceRegistrar) {
	h := health.NewServer()
	h.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	healthpb.RegisterHealthServer(s, h)
}

// checkHealth is the Greeter handler's readiness check: before it takes a
// plugin into use, it asks the plugin's own health service, on the plugin's
// Endpoint, whether it is serving. A failure is retried with backoff.
func checkHealth(ctx context.Context, p pluginmanager.Plugin) error {
	conn, err := grpc.NewClient("unix://"+p.Endpoint, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return fmt.Errorf("connecting to %s's endpoint %s: %w", p.Name, p.Endpoint, err)
	}
	defer conn.Close()
	resp, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		return fmt.Errorf("health check of %s (it must serve grpc.health.v1.Health on its endpoint): %w", p.Name, err)
	}
	if st := resp.GetStatus(); st != healthpb.HealthCheckResponse_SERVING {
		return fmt.Errorf("%s reports health %s, not SERVING; it is retried", p.Name, st)
	}
	return nil
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// truncate shortens s to at most n runes, marking the cut.
func truncate(s string, n int) string {
	r := []rune(s)
	if len(r) <= n {
		return s
	}
	return string(r[:n-3]) + "..."
}
