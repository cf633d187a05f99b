package daemon

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/plugd/plugd/cmd/internal/version"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"sigs.k8s.io/yaml"
)

// Command is plugd's command line. Extra subcommands (the demo) are added by
// the caller.
func Command() *cobra.Command {
	var o options
	var check bool
	cmd := &cobra.Command{
		Use:   "plugd",
		Short: "plugd registers node plugins (CSI, DRA, device plugins, your own) the way the kubelet does",
		Long: `plugd watches a registry directory for plugins' registration sockets, registers each
plugin with the handler for its type, and serves what it knows on a status API
(see plugctl). Configuration comes from --config (YAML) and flags; a flag wins
over the file. SIGHUP reloads the file; SIGTERM or SIGINT stops plugd cleanly.`,
		Args:          cobra.NoArgs,
		SilenceUsage:  true,
		SilenceErrors: true,
		RunE: func(cmd *cobra.Command, _ []string) error {
			load := func() (Config, error) { return o.load(cmd.Flags()) }
			cfg, err := load()
			if err != nil {
				return err
			}
			if check {
				return printConfig(cmd.OutOrStdout(), cfg)
			}
			return serve(cmd.Context(), cfg, load)
		},
	}
	o.bind(cmd.Flags())
	cmd.Flags().BoolVar(&check, "check-config", false, "check the configuration (--config, the flags, the environment) and print it, defaults filled in, as YAML; exit 1 naming what plugd would refuse, without starting. The directories and sockets it names are checked only at start")

	cmd.AddCommand(&cobra.Command{
		Use:   "version",
		Short: "Print plugd's version",
		Args:  cobra.NoArgs,
		Run: func(cmd *cobra.Command, _ []string) {
			fmt.Fprintln(cmd.OutOrStdout(), version.Line("plugd"))
		},
	})
	return cmd
}

// printConfig writes cfg as YAML, as --config reads it.
func printConfig(w io.Writer, cfg Config) error {
	b, err := yaml.Marshal(cfg)
	if err != nil {
		return err
	}
	_, err = w.Write(b)
	return err
}

// options are plugd's flags: the configuration file, and values that override it.
type options struct {
	configPath string
	fl         Config // values of the flags; only those set override the file
	handlers   []string
	peers      []string
	kube       KubernetesConfig // --kubeconfig, --node-name
	kubeOn     bool             // --kubernetes
	getenv     func(string) string
}

func (o *options) bind(f *pflag.FlagSet) {
	fl := &o.fl
	f.StringVar(&o.configPath, "config", "", "YAML configuration file; flags override its fields")
	f.StringVar(&fl.Mode, "mode", "", "manage (register plugins, as the node's plugin manager) or observe (beside a kubelet: only look, never notify or write) (default manage)")
	f.StringVar(&fl.RegistryDir, "registry-dir", "", "directory plugins put their registration sockets in (default "+defaultNote("registry")+")")
	f.StringArrayVar(&o.handlers, "handler", nil, "TYPE=HANDLER: accept plugins of TYPE with the built-in HANDLER: "+strings.Join(flagHandlers(), ", ")+" (hook needs --config, for its command or URL); repeat for each type; replaces the configured list (default CSIPlugin, DRAPlugin, DevicePlugin with accept)")
	f.StringVar(&fl.Status.Socket, "status-socket", "", "unix socket of the status API, or none (default "+defaultNote("socket")+")")
	f.StringVar(&fl.Status.TCP, "status-tcp", "", "also serve the status API on this TCP address, e.g. 127.0.0.1:9090")
	f.BoolVar(&fl.Status.AllowNonLoopback, "status-allow-non-loopback", false, "allow --status-tcp on an address that is not loopback (the API has no authentication)")
	f.IntVar(&fl.Workers, "workers", 0, "sockets worked on at once"+flagDefault("workers"))
	f.DurationVar((*time.Duration)(&fl.ResyncInterval), "resync-interval", 0, "walk the registry directory this often to repair missed events; negative disables"+flagDefault("resync-interval"))
	f.DurationVar((*time.Duration)(&fl.Backoff.Initial), "backoff-initial", 0, "first retry delay after a transient failure"+flagDefault("backoff-initial"))
	f.DurationVar((*time.Duration)(&fl.Backoff.Max), "backoff-max", 0, "longest retry delay"+flagDefault("backoff-max"))
	f.DurationVar((*time.Duration)(&fl.Timeouts.Dial), "dial-timeout", 0, "deadline for connecting to a plugin"+flagDefault("dial-timeout"))
	f.DurationVar((*time.Duration)(&fl.Timeouts.GetInfo), "get-info-timeout", 0, "deadline for a plugin's GetInfo"+flagDefault("get-info-timeout"))
	f.DurationVar((*time.Duration)(&fl.Timeouts.Notify), "notify-timeout", 0, "deadline for telling a plugin its status"+flagDefault("notify-timeout"))
	f.DurationVar((*time.Duration)(&fl.Timeouts.Handler), "handler-timeout", 0, "deadline for each handler call"+flagDefault("handler-timeout"))
	f.BoolVar(&fl.DeregisterOnShutdown, "deregister-on-shutdown", false, "deregister every plugin when plugd stops")
	f.DurationVar((*time.Duration)(&fl.ShutdownTimeout), "shutdown-timeout", 0, "bound on a clean shutdown"+flagDefault("shutdown-timeout"))
	f.DurationVar((*time.Duration)(&fl.Liveness.ProbeInterval), "probe-interval", 0, "ask each registered plugin GetInfo this often, to catch one wedged with its connection up (a dead one is seen at once, without probes); negative disables"+flagDefault("probe-interval"))
	f.DurationVar((*time.Duration)(&fl.Liveness.UnhealthyGrace), "unhealthy-grace", 0, "deregister a plugin that stopped answering after this long; negative: never"+flagDefault("unhealthy-grace"))
	f.StringArrayVar(&fl.Policy.EndpointRoots, "endpoint-root", nil, "confine plugins' endpoints to this directory; repeat for each (default: anywhere)")
	f.StringArrayVar(&o.peers, "allowed-peer", nil, "TYPE=uid:N,gid:M,...: only processes running as these may serve plugins of TYPE (* for every other type); repeat for each type")
	f.BoolVar(&fl.Policy.AllowWritableRegistryDir, "allow-writable-registry-dir", false, "use a registry directory that users other than plugd's and root may change (writable by others, owned by another user, or reached through such a directory), and the directories below it that are writable by others or another user's; without it, the registry directory is refused and such directories below it are left out")
	f.DurationVar((*time.Duration)(&fl.Policy.RemoveStaleAfter), "remove-stale-after", 0, "remove a socket nobody listens on once it is older than this"+flagDefault("remove-stale-after"))
	f.IntVar(&fl.Policy.MaxSockets, "max-sockets", 0, "most sockets tracked"+flagDefault("max-sockets"))
	f.StringVar(&fl.Log.Format, "log-format", "", "text or json (default text)")
	f.StringVar(&fl.Log.Level, "log-level", "", "debug, info, warn or error (default info)")
	f.BoolVar(&o.kubeOn, "kubernetes", false, "connect to the Kubernetes API (in-cluster unless --kubeconfig) for the kubelet's view of each plugin, Node conditions and events")
	f.StringVar(&o.kube.Kubeconfig, "kubeconfig", "", "kubeconfig file to reach the Kubernetes API with; implies --kubernetes (default: in-cluster)")
	f.StringVar(&o.kube.NodeName, "node-name", "", "this node's Node object; implies --kubernetes (default $NODE_NAME)")
}

// flagHandlers are the built-in handlers --handler can name: all but hook,
// which needs settings of its own.
func flagHandlers() []string {
	return slices.DeleteFunc(slices.Clone(builtinHandlers), func(h string) bool { return h == "hook" })
}

func defaultNote(what string) string {
	if what == "socket" {
		return "$XDG_RUNTIME_DIR/plugd/plugd.sock; as root /run/plugd/plugd.sock; else $TMPDIR/plugd-<uid>/plugd.sock"
	}
	return "$XDG_RUNTIME_DIR/plugd/plugins; as root /run/plugd/plugins; else $TMPDIR/plugd-<uid>/plugins"
}

// flagFields copies each flag's value into the configuration, if the flag was set.
var flagFields = map[string]func(dst *Config, src Config){
	"registry-dir":              func(d *Config, s Config) { d.RegistryDir = s.RegistryDir },
	"mode":                      func(d *Config, s Config) { d.Mode = s.Mode },
	"status-socket":             func(d *Config, s Config) { d.Status.Socket = s.Status.Socket },
	"status-tcp":                func(d *Config, s Config) { d.Status.TCP = s.Status.TCP },
	"status-allow-non-loopback": func(d *Config, s Config) { d.Status.AllowNonLoopback = s.Status.AllowNonLoopback },
	"workers":                   func(d *Config, s Config) { d.Workers = s.Workers },
	"resync-interval":           func(d *Config, s Config) { d.ResyncInterval = s.ResyncInterval },
	"backoff-initial":           func(d *Config, s Config) { d.Backoff.Initial = s.Backoff.Initial },
	"backoff-max":               func(d *Config, s Config) { d.Backoff.Max = s.Backoff.Max },
	"dial-timeout":              func(d *Config, s Config) { d.Timeouts.Dial = s.Timeouts.Dial },
	"get-info-timeout":          func(d *Config, s Config) { d.Timeouts.GetInfo = s.Timeouts.GetInfo },
	"notify-timeout":            func(d *Config, s Config) { d.Timeouts.Notify = s.Timeouts.Notify },
	"handler-timeout":           func(d *Config, s Config) { d.Timeouts.Handler = s.Timeouts.Handler },
	"deregister-on-shutdown":    func(d *Config, s Config) { d.DeregisterOnShutdown = s.DeregisterOnShutdown },
	"shutdown-timeout":          func(d *Config, s Config) { d.ShutdownTimeout = s.ShutdownTimeout },
	"log-format":                func(d *Config, s Config) { d.Log.Format = s.Log.Format },
	"log-level":                 func(d *Config, s Config) { d.Log.Level = s.Log.Level },
	"probe-interval":            func(d *Config, s Config) { d.Liveness.ProbeInterval = s.Liveness.ProbeInterval },
	"unhealthy-grace":           func(d *Config, s Config) { d.Liveness.UnhealthyGrace = s.Liveness.UnhealthyGrace },
	"endpoint-root":             func(d *Config, s Config) { d.Policy.EndpointRoots = s.Policy.EndpointRoots },
	"allow-writable-registry-dir": func(d *Config, s Config) {
		d.Policy.AllowWritableRegistryDir = s.Policy.AllowWritableRegistryDir
	},
	"remove-stale-after": func(d *Config, s Config) { d.Policy.RemoveStaleAfter = s.Policy.RemoveStaleAfter },
	"max-sockets":        func(d *Config, s Config) { d.Policy.MaxSockets = s.Policy.MaxSockets },
}

// load reads the file (if any), lays the flags that were set over it, and
// applies the defaults. It is called again on SIGHUP.
func (o *options) load(flags *pflag.FlagSet) (Config, error) {
	var cfg Config
	if o.configPath != "" {
		var err error
		if cfg, err = LoadConfig(o.configPath); err != nil {
			return cfg, err
		}
	}
	flags.Visit(func(f *pflag.Flag) {
		if set, ok := flagFields[f.Name]; ok {
			set(&cfg, o.fl)
		}
	})
	if len(o.handlers) > 0 {
		cfg.Handlers = nil
		for _, h := range o.handlers {
			typ, name, ok := strings.Cut(h, "=")
			if !ok {
				return cfg, fmt.Errorf("--handler %q: write it as TYPE=HANDLER, such as CSIPlugin=accept", h)
			}
			cfg.Handlers = append(cfg.Handlers, HandlerConfig{Type: typ, Handler: name})
		}
	}
	if o.kubeOn || flags.Changed("kubeconfig") || flags.Changed("node-name") {
		k := KubernetesConfig{}
		if cfg.Kubernetes != nil {
			k = *cfg.Kubernetes
		}
		if flags.Changed("kubeconfig") {
			k.Kubeconfig = o.kube.Kubeconfig
		}
		if flags.Changed("node-name") {
			k.NodeName = o.kube.NodeName
		}
		cfg.Kubernetes = &k
	}
	if k := cfg.Kubernetes; k != nil && k.NodeName == "" {
		getenv := o.getenv
		if getenv == nil {
			getenv = os.Getenv
		}
		kc := *k
		kc.NodeName = getenv("NODE_NAME")
		cfg.Kubernetes = &kc
	}
	if k := cfg.Kubernetes; k != nil && k.Kubelet.Address == "" {
		getenv := o.getenv
		if getenv == nil {
			getenv = os.Getenv
		}
		if ip := getenv("NODE_IP"); ip != "" {
			kc := *k
			kc.Kubelet.Address = net.JoinHostPort(ip, defaultKubeletPort)
			cfg.Kubernetes = &kc
		}
	}
	if len(o.peers) > 0 {
		cfg.Policy.AllowedPeers = nil
		for _, p := range o.peers {
			rule, err := parsePeerRule(p)
			if err != nil {
				return cfg, err
			}
			cfg.Policy.AllowedPeers = append(cfg.Policy.AllowedPeers, rule)
		}
	}
	return cfg.WithDefaults()
}

// parsePeerRule reads --allowed-peer TYPE=uid:0,gid:10.
func parsePeerRule(s string) (PeerRule, error) {
	bad := func() (PeerRule, error) {
		return PeerRule{}, fmt.Errorf("--allowed-peer %q: write it as TYPE=uid:N,gid:M,... such as CSIPlugin=uid:0", s)
	}
	typ, list, ok := strings.Cut(s, "=")
	if !ok || typ == "" {
		return bad()
	}
	rule := PeerRule{Type: typ}
	for item := range strings.SplitSeq(list, ",") {
		kind, num, ok := strings.Cut(strings.TrimSpace(item), ":")
		n, err := strconv.ParseUint(num, 10, 32)
		if !ok || err != nil {
			return bad()
		}
		switch kind {
		case "uid":
			rule.UIDs = append(rule.UIDs, uint32(n))
		case "gid":
			rule.GIDs = append(rule.GIDs, uint32(n))
		default:
			return bad()
		}
	}
	return rule, nil
}

// serve runs the daemon until SIGTERM or SIGINT, reloading on SIGHUP.
func serve(ctx context.Context, cfg Config, load func() (Config, error)) error {
	d, err := New(cfg, os.Stderr)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(ctx, syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)

	done := make(chan struct{})
	defer close(done)
	go func() {
		for {
			select {
			case <-done:
				return
			case <-ctx.Done():
				stop() // a second signal now kills plugd the default way
				return
			case <-hup:
				d.reloadFrom(load)
			}
		}
	}()
	return d.Run(ctx)
}

// reloadFrom re-reads the configuration and logs what was and was not applied.
func (d *Daemon) reloadFrom(load func() (Config, error)) {
	next, err := load()
	if err != nil {
		d.log.Error("reload refused; the running configuration is unchanged", "err", err)
		return
	}
	applied, needsRestart, err := d.Reload(next)
	if err != nil {
		d.log.Error("reload refused; the running configuration is unchanged", "err", err)
		return
	}
	if len(applied) == 0 && len(needsRestart) == 0 {
		d.log.Info("reload: nothing changed")
	}
	for _, a := range applied {
		d.log.Info("reload applied", "change", a)
	}
	for _, n := range needsRestart {
		d.log.Warn("reload cannot apply this change while running; restart plugd to apply it", "change", n)
	}
}

// Exit codes of plugd, as plugctl and kubectl plugd use them.
const (
	ExitError = 1 // it could not run: a configuration refused, a failure while running
	ExitUsage = 2 // the command line is wrong: unknown flag or command, a bad flag value
)

// Execute runs cmd (plugd, with the subcommands the caller added) on args
// and returns the exit code: 0, ExitError for an error of a command
// running, ExitUsage for one of the command line (cobra's or a flag's),
// which is followed by a hint at --help. Errors are written to stderr.
func Execute(ctx context.Context, cmd *cobra.Command, args []string, stderr io.Writer) int {
	markRunErrors(cmd)
	cmd.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return err })
	cmd.SetArgs(args)
	cmd.SetErr(stderr)
	cmd.SilenceErrors, cmd.SilenceUsage = true, true
	c, err := cmd.ExecuteContextC(ctx)
	if err == nil {
		return 0
	}
	fmt.Fprintf(stderr, "plugd: %s\n", strings.TrimRight(err.Error(), "\n"))
	var re runError
	if errors.As(err, &re) {
		return ExitError
	}
	fmt.Fprintf(stderr, "Run '%s --help' for usage.\n", c.CommandPath())
	return ExitUsage
}

// runError is an error a command returned once running: anything else
// Execute sees is cobra's, about the command line.
type runError struct{ error }

func (e runError) Unwrap() error { return e.error }

// markRunErrors wraps the RunE of cmd and every command below it, so that
// their errors are runError.
func markRunErrors(cmd *cobra.Command) {
	if run := cmd.RunE; run != nil {
		cmd.RunE = func(c *cobra.Command, args []string) error {
			if err := run(c, args); err != nil {
				return runError{err}
			}
			return nil
		}
	}
	for _, sub := range cmd.Commands() {
		markRunErrors(sub)
	}
}
