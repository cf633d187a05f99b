// Package cli is plugctl, the command line of plugd's status API.
//
// It talks to the daemon only through package api, so it works with any plugd
// that serves that API, on its unix socket or over TCP (--address), and it can
// be tested without exiting the process: Run takes the arguments and output
// streams and returns the exit code. One command, cluster, talks to the
// Kubernetes API server instead, with client-go, and reads the conditions
// plugd writes on every node.
package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/plugd/plugd/api"
)

// Exit codes. Scripts and readiness probes rely on them, so they never change
// meaning.
const (
	ExitOK      = 0 // the command did what was asked
	ExitError   = 1 // it could not: plugd unreachable, plugin not found, a bad answer
	ExitUsage   = 2 // the command line is wrong
	ExitTimeout = 3 // wait: the condition was not met in time
	// ExitFindings is doctor's: it found something at warning or above.
	ExitFindings = 4
)

// Environment variables that stand in for the global flags, so that a shell
// or a container can point every plugctl at one daemon.
const (
	envSocket  = "PLUGD_SOCKET"
	envAddress = "PLUGD_ADDRESS"
)

// Main runs plugctl as a program: Ctrl-C (or SIGTERM) cancels what it does.
// cmd/plugctl passes the result to os.Exit.
func Main(args []string, stdout, stderr io.Writer) int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	go func() {
		// Once the first signal has cancelled ctx, a second one should kill
		// plugctl the default way rather than be swallowed.
		<-ctx.Done()
		stop()
	}()
	return Run(ctx, args, stdout, stderr)
}

// Run runs plugctl with args (without the program name) and returns its exit
// code. Cancelling ctx is what Ctrl-C does.
func Run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	a := &app{stdout: stdout, stderr: stderr, getenv: os.Getenv}
	return a.run(ctx, args)
}

// app is one invocation: its output streams and the global flags' values.
type app struct {
	stdout, stderr io.Writer
	getenv         func(string) string

	global  *pflag.FlagSet // the root's persistent flags, to tell which were set
	socket  string
	address string
	timeout time.Duration
}

func (a *app) run(ctx context.Context, args []string) int {
	root := a.rootCommand()
	root.SetArgs(args)
	root.SetOut(a.stdout)
	root.SetErr(a.stderr)
	cmd, err := root.ExecuteContextC(ctx)
	if err == nil {
		return ExitOK
	}
	// Errors from running a command carry their code; anything else comes
	// from cobra rejecting the command line.
	code := ExitUsage
	var ee *exitError
	if errors.As(err, &ee) {
		code = ee.code
	}
	fmt.Fprintf(a.stderr, "plugctl: %s\n", strings.TrimRight(err.Error(), "\n"))
	if code == ExitUsage {
		fmt.Fprintf(a.stderr, "Run '%s --help' for usage.\n", cmd.CommandPath())
	}
	return code
}

func (a *app) rootCommand() *cobra.Command {
	root := &cobra.Command{
		Use:   "plugctl",
		Short: "plugctl shows what plugd, the plugin manager, knows of its plugins",
		Long: `plugctl asks plugd's status API which plugins it found in its registry directory,
what state each is in and why, follows its events, and waits for a plugin to
reach a state (for scripts and readiness probes).

plugd is reached on its unix socket (--socket, or $` + envSocket + `), or over TCP
if it serves the API there (--address, or $` + envAddress + `). A flag wins over
the environment; $` + envAddress + ` wins over $` + envSocket + `.

Exit codes:
  0  success
  1  error: plugd unreachable, plugin not found, an answer plugctl cannot use
  2  usage error: unknown command, bad flag or value
  3  wait: the condition was not met before --timeout
  4  doctor: a warning or an error was found`,
		SilenceErrors:     true,
		SilenceUsage:      true,
		PersistentPreRunE: a.checkGlobalFlags,
	}
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error {
		return &exitError{code: ExitUsage, err: err}
	})
	f := root.PersistentFlags()
	f.StringVar(&a.socket, "socket", api.DefaultSocket(), "unix socket of plugd's status API (env "+envSocket+")")
	f.StringVar(&a.address, "address", "", "base URL of plugd's status API over TCP, e.g. http://127.0.0.1:9090 (env "+envAddress+"); replaces --socket")
	f.DurationVar(&a.timeout, "timeout", 10*time.Second, "how long to wait for each answer from plugd")
	a.global = f

	root.AddCommand(a.listCommand(), a.getCommand(), a.watchCommand(), a.waitCommand(), a.doctorCommand(), a.clusterCommand(), a.versionCommand())
	return root
}

// checkGlobalFlags rejects global flags that cannot work, before any command
// talks to plugd.
func (a *app) checkGlobalFlags(*cobra.Command, []string) error {
	if a.global.Changed("socket") && a.global.Changed("address") {
		return usageErrorf("--socket and --address both say where plugd is; give one")
	}
	if a.global.Changed("address") && !strings.Contains(a.address, "://") {
		return usageErrorf("--address %q is not a URL; write it like http://127.0.0.1:9090", a.address)
	}
	if a.timeout <= 0 {
		return usageErrorf("--timeout %s must be positive", a.timeout)
	}
	return nil
}

// client is the status API client that the flags and environment point at.
// It is built on demand (not in a pre-run hook) because shell completion calls
// in without running hooks.
func (a *app) client() *api.Client {
	switch {
	case a.global.Changed("address"):
		return &api.Client{Address: a.address}
	case a.global.Changed("socket"):
		return &api.Client{Socket: a.socket}
	case a.getenv(envAddress) != "":
		return &api.Client{Address: a.getenv(envAddress)}
	case a.getenv(envSocket) != "":
		return &api.Client{Socket: a.getenv(envSocket)}
	}
	return &api.Client{Socket: a.socket}
}

// where names the daemon the client talks to, for messages.
func where(c *api.Client) string {
	if c.Address != "" {
		return c.Address
	}
	return c.Socket
}

// requestContext bounds one request to plugd by --timeout.
func (a *app) requestContext(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, a.timeout)
}

// explain turns a bare context error from a request into one that says what
// happened; the client's own errors already do.
func (a *app) explain(ctx context.Context, c *api.Client, err error) error {
	switch {
	case errors.Is(err, context.DeadlineExceeded) && ctx.Err() != nil:
		return fmt.Errorf("plugd at %s did not answer within %s; is it overloaded? --timeout waits longer", where(c), a.timeout)
	case errors.Is(err, context.Canceled) && ctx.Err() != nil:
		return errors.New("interrupted")
	}
	return err
}

// exitError is a failure with its exit code.
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string { return e.err.Error() }
func (e *exitError) Unwrap() error { return e.err }

func usageErrorf(format string, args ...any) error {
	return &exitError{code: ExitUsage, err: fmt.Errorf(format, args...)}
}

// runE adapts a command's body to cobra: a failure while running is exit code
// 1 unless it says otherwise, which is how run tells it from a command line
// that cobra rejected (exit code 2).
func runE(fn func(cmd *cobra.Command, args []string) error) func(*cobra.Command, []string) error {
	return func(cmd *cobra.Command, args []string) error {
		err := fn(cmd, args)
		var ee *exitError
		if err == nil || errors.As(err, &ee) {
			return err
		}
		return &exitError{code: ExitError, err: err}
	}
}

// noArgs rejects arguments, naming them, for commands that take none.
func noArgs(cmd *cobra.Command, args []string) error {
	if len(args) > 0 {
		return usageErrorf("%s takes no arguments, but got %q", cmd.Name(), args)
	}
	return nil
}

// oneOf checks a flag's value against the allowed ones, ignoring case, and
// returns the allowed spelling.
func oneOf(flag, value string, allowed ...string) (string, error) {
	for _, v := range allowed {
		if strings.EqualFold(v, value) {
			return v, nil
		}
	}
	return "", usageErrorf("%s %q must be one of %s", flag, value, strings.Join(allowed, ", "))
}
