// Package demo is `plugd demo`, the first command a newcomer runs: the real
// daemon, in this process, on a temporary directory, with example plugins
// playing a scenario that shows what a node operator sees. Plugins register,
// one is refused by its handler, one has a type nobody handles, one stops,
// and one crashes and comes back. Every step waits on events from the status
// API's event stream, the same API plugctl uses, so the demo also exercises it.
package demo

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/fsnotify/fsnotify"
	"github.com/spf13/cobra"

	"github.com/plugd/plugd/api"
	"github.com/plugd/plugd/cmd/plugd/internal/daemon"
	"github.com/plugd/plugd/plugin"
)

const (
	// defaultStepTimeout bounds each step's wait for its events. A step takes
	// milliseconds; the margin is for slow or overloaded machines.
	defaultStepTimeout = 15 * time.Second
	// defaultPause is the pause between steps on a terminal, long enough to
	// see one step's table before the next step's events scroll it away.
	defaultPause = 500 * time.Millisecond
	// maxDirLen keeps every socket under the demo's directory shorter than the
	// 108 bytes of sun_path: "plugins/" and a socket name of up to 48 bytes,
	// such as examples/plugin's default greeter.example.com.sock, fit after it.
	maxDirLen = 50
	// logTail is how many of plugd's last log lines a failed demo prints,
	// since its log file is removed with everything else.
	logTail = 20
)

// Command is `plugd demo`. The caller adds it to plugd's command line.
func Command() *cobra.Command {
	var (
		once, verbose bool
		pause         time.Duration
	)
	cmd := &cobra.Command{
		Use:   "demo",
		Short: "Watch plugd register example plugins, on a temporary directory; nothing to install, no root needed",
		Long: `plugd demo runs plugd in this process, on a temporary directory, with its status
API on a unix socket in that directory, and plays a scenario with example
plugins: a CSI driver, a DRA driver, a device plugin and a plugin of a custom
type register; a plugin that fails validation and one of a type with no handler
are rejected; one stops and is deregistered; one crashes, leaving its socket
behind, fails, and registers at once when it comes back.

Each event from the status API is printed as it happens, and the table of all
plugins after each step. Then plugd keeps running, and the table is redrawn on
every event, so that you can point plugctl or your own plugins at it, until
Ctrl-C. Everything the demo created is removed when it exits, on Ctrl-C,
SIGTERM or SIGHUP (its terminal closed) too.`,
		Example: `  plugd demo
  plugd demo --once        # stop after the scenario, for scripts
  plugd demo --verbose     # with plugd's own log on standard error`,
		Args:          cobra.NoArgs,
		SilenceUsage:  true,
		SilenceErrors: true,
		RunE: func(cmd *cobra.Command, _ []string) error {
			out := cmd.OutOrStdout()
			opts := options{Once: once}
			if f, ok := out.(*os.File); ok {
				// A reader that quits early (plugd demo | head) would otherwise
				// kill the demo with SIGPIPE before it cleans up; ignored, the
				// write fails and the demo stops as it does on Ctrl-C.
				signal.Ignore(syscall.SIGPIPE)
				if width, ok := terminalWidth(f); ok {
					opts.TermWidth = width
					opts.Pause = defaultPause
				}
			}
			if cmd.Flags().Changed("pause") {
				opts.Pause = pause
			}
			if verbose {
				opts.Log = cmd.ErrOrStderr()
			}
			// SIGHUP too: a closed terminal must not leave the demo's
			// directory and sockets behind.
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM, syscall.SIGHUP)
			defer stop()
			// The first signal starts a clean shutdown; stop restores the
			// default action, so a second one kills the demo at once.
			defer context.AfterFunc(ctx, stop)()
			return run(ctx, out, opts)
		},
	}
	f := cmd.Flags()
	f.BoolVar(&once, "once", false, "exit after the scenario instead of running until Ctrl-C")
	f.BoolVar(&verbose, "verbose", false, "write plugd's and the example plugins' logs to standard error (default: to a file in the demo's directory)")
	f.DurationVar(&pause, "pause", 0, fmt.Sprintf("pause between steps, to read them (default %s on a terminal, none otherwise)", defaultPause))
	return cmd
}

// options shape one run of the demo.
type options struct {
	// Once ends the demo after the scenario; otherwise it runs until ctx is done.
	Once bool
	// Pause is a pause between steps, for a human to read; never used to wait
	// for anything.
	Pause time.Duration
	// StepTimeout bounds each step's wait for its events. Zero: 15s.
	StepTimeout time.Duration
	// Log receives plugd's and the example plugins' logs. Nil: plugd.log in
	// the demo's directory, out of the demo's output.
	Log io.Writer
	// TermWidth is set when the output is a terminal: it returns the
	// terminal's width. The live table is then redrawn in place, its lines
	// cut to the width so that the lines to move up over are the lines printed.
	TermWidth func() int
}

// demo is the state of one run.
type demo struct {
	out   *errWriter
	opts  options
	start time.Time // event times are printed as offsets from it

	root     string // the temporary directory; everything below is in it
	registry string // plugd's registry directory
	socket   string // the status API's unix socket
	logPath  string // plugd's log file, if the log goes to one
	logFile  *os.File
	client   *api.Client

	stopDaemon context.CancelFunc
	runDone    chan struct{} // closed when the daemon's Run has returned
	runErr     error         // Run's result, set before runDone is closed

	events     chan api.Event // from the status API's event stream; closed when it ends
	streamErr  error          // why the stream ended, set before events is closed
	stopEvents func()         // ends the stream and waits for its reader

	plugins []*plugin.Server // every example plugin started, to close at the end
}

// run plays the demo, writing what happens to out, and removes everything it
// created before it returns. It returns nil when ctx ends it (that is how a
// user stops it), and an error that says what went wrong otherwise.
func run(ctx context.Context, out io.Writer, opts options) (err error) {
	if opts.StepTimeout <= 0 {
		opts.StepTimeout = defaultStepTimeout
	}
	d := &demo{out: &errWriter{w: out}, opts: opts, start: time.Now()}
	if d.root, err = makeTempDir(); err != nil {
		return err
	}
	d.registry = filepath.Join(d.root, "plugins")
	d.socket = filepath.Join(d.root, "plugd.sock")
	d.client = &api.Client{Socket: d.socket}

	defer func() {
		interrupted := ctx.Err() != nil && (err == nil || errors.Is(err, ctx.Err()))
		switch {
		case interrupted:
			// Being stopped is how the demo is meant to end, not a failure.
			err = nil
			fmt.Fprintln(d.out, "\nInterrupted: stopping the example plugins, then plugd.")
		case errors.Is(d.out.err, syscall.EPIPE):
			// The reader has gone (plugd demo | head): as good as Ctrl-C,
			// and there is nobody to tell.
			err = nil
		case err != nil:
			err = d.withLogTail(err)
		}
		if cerr := d.cleanup(); cerr != nil {
			err = errors.Join(err, cerr)
			return
		}
		if err == nil {
			fmt.Fprintf(d.out, "Stopped: the example plugins and plugd; removed %s.\n", d.root)
		}
	}()

	// Said before anything starts, so that a slow start is never silent
	// (go run's own compile, before this, is: the docs say so).
	fmt.Fprintln(d.out, "plugd demo: starting plugd in this process...")
	if err := d.startDaemon(ctx); err != nil {
		return err
	}
	if err := d.openEvents(ctx); err != nil {
		return err
	}
	fmt.Fprintf(d.out, "plugd demo: plugd answers on its status API, after %s.\n\n", time.Since(d.start).Round(time.Millisecond))
	d.title()
	if err := d.scenario(ctx); err != nil {
		return err
	}
	if d.opts.Once {
		fmt.Fprintln(d.out, "\n--once: stopping the example plugins, then plugd.")
		return d.outputErr()
	}
	return d.live(ctx)
}

// startDaemon starts plugd on the demo's directory and returns once its
// status API answers.
func (d *demo) startDaemon(ctx context.Context) error {
	dm, err := d.newDaemon()
	if err != nil {
		return err
	}

	// Watch the directory before plugd starts, so that the status socket's
	// creation cannot be missed: each change there is a moment to ask again.
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return fmt.Errorf("watching the demo's directory for plugd's status socket: %w", err)
	}
	defer w.Close()
	if err := w.Add(d.root); err != nil {
		return fmt.Errorf("watching the demo's directory for plugd's status socket: %w", err)
	}

	// plugd's context is not ctx: on Ctrl-C, the example plugins stop first,
	// and plugd sees them go, as on a real node; cleanup then stops plugd.
	runCtx, stop := context.WithCancel(context.WithoutCancel(ctx))
	d.stopDaemon = stop
	d.runDone = make(chan struct{})
	go func() {
		defer close(d.runDone)
		d.runErr = dm.Run(runCtx)
	}()

	ctx, cancel := context.WithTimeout(ctx, d.opts.StepTimeout)
	defer cancel()
	// The socket is created when it is bound and chmod-ed once it listens,
	// and plugd then logs that it started: those changes wake this loop. The
	// ticker is only a safety net, should a later plugd set its socket up
	// without a change after it starts listening.
	recheck := time.NewTicker(100 * time.Millisecond)
	defer recheck.Stop()
	for {
		_, err := d.client.Version(ctx)
		if err == nil {
			return nil
		}
		select {
		case <-w.Events:
		case werr := <-w.Errors:
			return fmt.Errorf("watching the demo's directory for plugd's status socket: %w", werr)
		case <-recheck.C:
		case <-d.runDone:
			if d.runErr != nil {
				return fmt.Errorf("plugd did not start: %w", d.runErr)
			}
			return errors.New("plugd stopped as soon as it started, without an error")
		case <-ctx.Done():
			if ctx.Err() == context.DeadlineExceeded {
				return fmt.Errorf("plugd's status API did not answer on %s within %s: %w", d.socket, d.opts.StepTimeout, err)
			}
			return ctx.Err()
		}
	}
}

// newDaemon configures plugd for the demo's directory, logging to
// Options.Log, or to plugd.log in the directory.
func (d *demo) newDaemon() (*daemon.Daemon, error) {
	logOut := d.opts.Log
	if logOut == nil {
		d.logPath = filepath.Join(d.root, "plugd.log")
		f, err := os.Create(d.logPath)
		if err != nil {
			return nil, fmt.Errorf("creating plugd's log file in the demo's directory: %w", err)
		}
		d.logFile, logOut = f, f
	}
	dm, err := daemon.New(daemon.Config{
		RegistryDir: d.registry,
		Status:      daemon.StatusConfig{Socket: d.socket},
		// The built-in types, and example.com/Greeter to show that a type of
		// your own is just one more handler; example.com/Unknown has none on
		// purpose.
		Handlers: []daemon.HandlerConfig{
			{Type: typeCSI, Handler: "accept"},
			{Type: typeDRA, Handler: "accept"},
			{Type: typeDevice, Handler: "accept"},
			{Type: typeGreeter, Handler: "accept"},
		},
		// The default backoff starts at 500ms and grows to 2m; these let the
		// crashed plugin's retries show within a second, and a plugin of yours
		// that fails in the live phase be retried at least every 5s.
		Backoff: daemon.BackoffConfig{
			Initial: daemon.Duration(200 * time.Millisecond),
			Max:     daemon.Duration(5 * time.Second),
		},
	}, logOut)
	if err != nil {
		return nil, fmt.Errorf("configuring plugd: %w", err)
	}
	return dm, nil
}

// openEvents opens the status API's event stream, and starts the goroutine
// that feeds d.events from it, since a stream's Next cannot wait with a
// deadline. No plugin runs yet, so there is nothing to replay.
func (d *demo) openEvents(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	stream, err := d.client.Events(ctx, 0)
	if err != nil {
		cancel()
		return fmt.Errorf("opening plugd's event stream: %w", err)
	}
	// Buffered so that a step's pause or a table request does not hold the
	// stream up; plugd drops events for a client that lags far behind.
	d.events = make(chan api.Event, 256)
	go func() {
		defer close(d.events)
		for {
			ev, err := stream.Next()
			if err != nil {
				d.streamErr = err
				return
			}
			select {
			case d.events <- ev:
			case <-ctx.Done():
				d.streamErr = ctx.Err()
				return
			}
		}
	}()
	d.stopEvents = func() {
		cancel()
		stream.Close()
		for range d.events { // until the reader has closed it, and so returned
		}
	}
	return nil
}

// cleanup stops everything run started and removes the demo's directory. It
// is safe after a partial start.
func (d *demo) cleanup() error {
	var errs []error
	// The stream goes first: nobody reads it any more, and plugd's shutdown
	// would wait for a stream stuck writing to a reader that stopped.
	if d.stopEvents != nil {
		d.stopEvents()
	}
	// Plugins before plugd, as on a node: plugd deregisters them as they go.
	for _, p := range slices.Backward(d.plugins) {
		if err := p.Close(); err != nil {
			errs = append(errs, fmt.Errorf("stopping example plugin %s: %w", filepath.Base(p.Path()), err))
		}
	}
	if d.stopDaemon != nil {
		d.stopDaemon()
		<-d.runDone
		if d.runErr != nil {
			errs = append(errs, fmt.Errorf("plugd: %w", d.runErr))
		}
	}
	if d.logFile != nil {
		if err := d.logFile.Close(); err != nil {
			errs = append(errs, fmt.Errorf("closing plugd's log file: %w", err))
		}
	}
	if err := os.RemoveAll(d.root); err != nil {
		errs = append(errs, fmt.Errorf("removing the demo's directory; remove %s by hand: %w", d.root, err))
	}
	return errors.Join(errs...)
}

// withLogTail adds the end of plugd's log to err: the log file is about to
// be removed with the rest of the demo's directory, and it may say why.
func (d *demo) withLogTail(err error) error {
	if d.logFile == nil {
		return err
	}
	b, rerr := os.ReadFile(d.logPath)
	if rerr != nil || len(b) == 0 {
		return err
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	lines = lines[max(0, len(lines)-logTail):]
	return fmt.Errorf("%w\nThe end of plugd's log (plugd demo --verbose shows all of it):\n  %s", err, strings.Join(lines, "\n  "))
}

// startPlugin starts an example plugin in the registry directory; cleanup
// closes it.
func (d *demo) startPlugin(cfg plugin.Config) (*plugin.Server, error) {
	cfg.Dir = d.registry
	if d.opts.Log != nil {
		cfg.Logger = slog.New(slog.NewTextHandler(d.opts.Log, nil)).With("example-plugin", cfg.Name)
	}
	s, err := plugin.Start(cfg)
	if err != nil {
		return nil, fmt.Errorf("starting example plugin %s: %w", cfg.Name, err)
	}
	d.plugins = append(d.plugins, s)
	return s, nil
}

// pause waits opts.Pause, for a human to read, or until ctx is done.
func (d *demo) pause(ctx context.Context) error {
	if d.opts.Pause <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d.opts.Pause)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// outputErr is the first error writing the output, if any: once the reader
// is gone (plugd demo | head), there is no point going on.
func (d *demo) outputErr() error {
	if d.out.err != nil {
		return fmt.Errorf("writing the demo's output: %w", d.out.err)
	}
	return nil
}

// errWriter remembers the first write error, so that the many prints need
// not each check theirs.
type errWriter struct {
	w   io.Writer
	err error
}

func (e *errWriter) Write(p []byte) (int, error) {
	if e.err != nil {
		return 0, e.err
	}
	n, err := e.w.Write(p)
	if err != nil {
		e.err = err
	}
	return n, err
}

// makeTempDir makes the demo's private directory. A unix socket's path must
// be shorter than 108 bytes, so a long $TMPDIR (macOS has one) is passed
// over for /tmp.
func makeTempDir() (string, error) {
	dir, err := os.MkdirTemp("", "plugd-demo-")
	if err != nil || len(dir) > maxDirLen {
		if err == nil {
			os.Remove(dir)
		}
		dir, err = os.MkdirTemp("/tmp", "plugd-demo-")
	}
	if err != nil {
		return "", fmt.Errorf("making the demo's temporary directory (set TMPDIR to a short, writable directory): %w", err)
	}
	if len(dir) > maxDirLen {
		os.Remove(dir)
		return "", fmt.Errorf("the demo's temporary directory %s is too long for unix socket paths; set TMPDIR to a directory of at most %d bytes", dir, maxDirLen-len("/plugd-demo-1234567890"))
	}
	return dir, nil
}
