// Command plugin is an example plugd plugin. It puts a registration socket in
// a plugin registry directory, serves the standard gRPC health service on that
// same socket as its own API, and logs what the plugin manager tells it, until
// SIGINT or SIGTERM.
//
// Try it against the demo's manager, which prints its registry directory:
//
//	go run ./cmd/plugd demo
//	go run ./examples/plugin -dir DIR                 # in a second terminal: registered
//	go run ./examples/plugin -dir DIR -type example.com/Nope -name nope -exit-when-refused
//
// The last one is refused (the demo has no handler for that type) and exits
// with status 3. Against any other manager built on plugd's pluginmanager, or
// a kubelet (which speaks the same protocol), point -dir at the directory it
// watches; the kubelet's is /var/lib/kubelet/plugins_registry.
//
// Exit status: 0 after a signal, 1 on an error, 2 for bad flags, 3 if the
// manager refused the plugin and -exit-when-refused is set.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/plugd/plugd/api"
	"github.com/plugd/plugd/plugin"
)

// exitRefused is the status for a refusal under -exit-when-refused.
const exitRefused = 3

// errRefused is the cause run's context is cancelled with when the manager refuses the plugin.
var errRefused = errors.New("the plugin manager refused the plugin")

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stderr)
	stop()
	os.Exit(code)
}

// run is the whole program, apart from signals and exiting: it returns the exit status.
func run(ctx context.Context, args []string, stderr io.Writer) int {
	flags := flag.NewFlagSet("plugin", flag.ContinueOnError)
	flags.SetOutput(stderr)
	dir := flags.String("dir", defaultDir(), "registry directory the plugin manager watches")
	typ := flags.String("type", "example.com/Greeter", "plugin type; the manager needs a handler for it")
	name := flags.String("name", "greeter.example.com", "plugin name, as the manager's handler knows it")
	socket := flags.String("socket", "", "socket file name inside -dir (default: -name + \".sock\")")
	versions := flags.String("versions", "v1", "comma-separated versions of its type's API the plugin supports")
	exitWhenRefused := flags.Bool("exit-when-refused", false, "exit with status 3 if the manager refuses the plugin, as node-driver-registrar does")
	if err := flags.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if flags.NArg() > 0 {
		fmt.Fprintf(stderr, "plugin: unexpected arguments %q: every setting is a flag, see -help\n", flags.Args())
		return 2
	}
	log := slog.New(slog.NewTextHandler(stderr, nil))

	// A refusal cancels ctx with errRefused as its cause, so Serve shuts down
	// as it does on a signal and the cause tells the two apart afterwards.
	// OnStatus must not call Close itself: Close waits for the very RPC
	// OnStatus runs in.
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)

	// The plugin's own API: here just health, which a handler can check before
	// taking the plugin into use (the demo's Greeter handler does).
	healthSrv := health.NewServer()
	healthSrv.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)

	log.Info("starting plugin; waiting for a plugin manager to find it", "dir", *dir, "type", *typ, "name", *name)
	err := plugin.Serve(ctx, plugin.Config{
		Dir:      *dir,
		Socket:   *socket,
		Type:     *typ,
		Name:     *name,
		Versions: splitList(*versions),
		Services: func(s grpc.ServiceRegistrar) { healthpb.RegisterHealthServer(s, healthSrv) },
		// The SDK logs every status the manager sends through Logger; this
		// only acts on a refusal.
		OnStatus: func(st plugin.Status) {
			if !st.Registered && *exitWhenRefused {
				cancel(errRefused)
			}
		},
		Logger: log,
	})
	switch {
	case err != nil:
		log.Error("plugin failed", "err", err)
		return 1
	case errors.Is(context.Cause(ctx), errRefused):
		log.Error("exiting: the manager refused the plugin and -exit-when-refused is set", "status", exitRefused)
		return exitRefused
	}
	log.Info("stopped on signal; socket removed")
	return 0
}

// defaultDir is a per-user registry directory that needs no root.
func defaultDir() string { return api.DefaultRegistryDir() }

// splitList splits a comma-separated flag, dropping blanks.
func splitList(s string) []string {
	var out []string
	for v := range strings.SplitSeq(s, ",") {
		if v = strings.TrimSpace(v); v != "" {
			out = append(out, v)
		}
	}
	return out
}
