package conformance

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// flags are plugd conformance's command line.
type flags struct {
	cfg    Config
	output string
	junit  string
	list   bool
}

// Command is `plugd conformance`. The caller adds it to plugd's command line.
func Command() *cobra.Command {
	var f flags
	cmd := &cobra.Command{
		Use:   "conformance [flags] [-- COMMAND [ARG...]]",
		Short: "Check a CSI driver, DRA driver or device plugin against what the kubelet does to it, without a cluster",
		Long: `plugd conformance plays the kubelet's side of plugin registration against one
plugin, and checks what the plugin answers. It starts the plugin (-- COMMAND), or
attaches to one already running (--registry-dir DIR without a command).

A started plugin is told where to make its sockets: the registry directory and an
endpoint directory (temporary ones unless --registry-dir and --endpoint-dir name
them) are in its environment as PLUGD_CONFORMANCE_REGISTRY_DIR and
PLUGD_CONFORMANCE_ENDPOINT_DIR, in any variables --registry-env and
--endpoint-env name, and replace {registry-dir} and {endpoint-dir} in its
arguments. Its output goes to standard error. A device plugin that registers
by calling Register on the device manager's kubelet.sock finds it in the
endpoint directory.

One line per check: PASS, FAIL or SKIP, the check, whether it is the kubelet's
rule or a recommendation, what was expected and what was seen. The kubelet's
rules are required; the recommendations too with --strict. The exit status is
0 only when no required check failed, 1 when one did (or the run was
interrupted: SIGINT or SIGTERM stops the plugin), 2 when the command line is
wrong. docs/writing-plugins.md says what each check means.`,
		Example: `  plugd conformance -- ./my-dra-driver --registrar-dir={registry-dir} --plugin-dir={endpoint-dir}
  plugd conformance --registry-env=REGISTRY_DIR -- ./my-device-plugin
  plugd conformance --registry-dir=/var/lib/kubelet/plugins_registry   # a plugin already running
  plugd conformance --junit=conformance.xml -o json -- ./driver`,
		SilenceUsage:  true,
		SilenceErrors: true,
		Args: func(cmd *cobra.Command, args []string) error {
			if dash := cmd.ArgsLenAtDash(); dash > 0 || (dash < 0 && len(args) > 0) {
				return fmt.Errorf("unexpected argument %q: put the plugin's command after --", args[0])
			}
			return nil
		},
		PreRunE: func(_ *cobra.Command, args []string) error { return f.validate(args) },
		RunE: func(cmd *cobra.Command, args []string) error {
			if f.list {
				return writeCatalogue(cmd.OutOrStdout())
			}
			return f.run(cmd, args)
		},
	}
	f.register(cmd.Flags())
	return cmd
}

// register adds the command's flags to fl.
func (f *flags) register(fl *pflag.FlagSet) {
	fl.StringVar(&f.cfg.RegistryDir, "registry-dir", "", "the registry directory: where the plugin makes its registration socket (default with a command: a temporary directory)")
	fl.StringVar(&f.cfg.EndpointDir, "endpoint-dir", "", "the directory passed to a started plugin for its own endpoint (default: a temporary directory)")
	fl.StringArrayVar(&f.cfg.RegistryEnv, "registry-env", nil, "also set this environment variable of the started plugin to the registry directory (repeatable)")
	fl.StringArrayVar(&f.cfg.EndpointEnv, "endpoint-env", nil, "also set this environment variable of the started plugin to the endpoint directory (repeatable)")
	fl.BoolVar(&f.cfg.DeviceManager, "kubelet-sock", false, "attached, serve the device manager's kubelet.sock in --endpoint-dir (replacing one there), for a device plugin that registers by calling it; always served for a started plugin")
	fl.DurationVar(&f.cfg.Timeout, "timeout", defaultTimeout, "bound of each wait: a socket to appear, an endpoint to accept, a call to answer, the plugin to exit")
	fl.StringVar(&f.cfg.CSISanity, "csi-sanity", "", "a CSI driver: the path of a csi-sanity binary (github.com/kubernetes-csi/csi-test/v5/cmd/csi-sanity) to run its node tests against the driver's endpoint")
	fl.StringArrayVar(&f.cfg.CSISanityFlags, "csi-sanity-flag", nil, "a flag to add to csi-sanity's command line, such as --ginkgo.skip=REGEXP (repeatable)")
	fl.StringVar(&f.cfg.Kubeconfig, "kubeconfig", "", "a DRA driver: the kubeconfig of the API server it publishes ResourceSlices to, to check them (with --node-name)")
	fl.StringVar(&f.cfg.NodeName, "node-name", "", "a DRA driver: the node name it was given, which its node-local ResourceSlices must name")
	fl.StringVar(&f.cfg.HealthCommand, "health-command", "", "a device plugin: a shell command that makes one of its devices change health (run with /bin/sh -c; "+envPluginPID+" is the started plugin's process id); without it deviceplugin/health-change is skipped")
	fl.DurationVar(&f.cfg.ReregisterWait, "reregister-wait", 0, "a device plugin registering through kubelet.sock: how long it has to register again when kubelet.sock is made anew, at most the kubelet's 5m (default: twice --timeout)")
	fl.BoolVar(&f.cfg.Strict, "strict", false, "require the recommendations too, not only the kubelet's rules")
	fl.StringVarP(&f.output, "output", "o", "text", "output format: text or json")
	fl.StringVar(&f.junit, "junit", "", "also write the results as JUnit XML to this file")
	fl.BoolVar(&f.list, "list", false, "list the checks, and stop")
}

// validate checks the command line; its errors are the command line's
// (exit status 2).
func (f *flags) validate(args []string) error {
	if f.output != "text" && f.output != "json" {
		return fmt.Errorf("--output %q: want text or json", f.output)
	}
	if !f.list && len(args) == 0 && f.cfg.RegistryDir == "" && !f.cfg.DeviceManager {
		return errors.New("nothing to check: start the plugin with -- COMMAND, or name the directory of a running one with --registry-dir")
	}
	if f.cfg.DeviceManager && f.cfg.EndpointDir == "" && len(args) == 0 {
		return errors.New("--kubelet-sock needs --endpoint-dir: the device plugin directory to serve kubelet.sock in")
	}
	if f.cfg.Timeout <= 0 {
		return fmt.Errorf("--timeout %s: give a positive duration, such as %s", f.cfg.Timeout, defaultTimeout)
	}
	if (f.cfg.Kubeconfig == "") != (f.cfg.NodeName == "") {
		return errors.New("--kubeconfig and --node-name go together: the API server the DRA driver publishes to, and the node it was told it runs on")
	}
	if f.cfg.ReregisterWait < 0 || f.cfg.ReregisterWait > kubeletReregisterBound {
		return fmt.Errorf("--reregister-wait %s: give a duration up to the kubelet's own bound, %s (after it the kubelet drops the plugin's resource)", f.cfg.ReregisterWait, kubeletReregisterBound)
	}
	return checkDirs(map[string]string{"--registry-dir": f.cfg.RegistryDir, "--endpoint-dir": f.cfg.EndpointDir})
}

// checkDirs says which of the directories named by flag does not exist,
// or is not a directory: the kit waits in them, and would only report the
// plugin's first check failed.
func checkDirs(dirs map[string]string) error {
	for _, flag := range []string{"--registry-dir", "--endpoint-dir"} {
		d := dirs[flag]
		if d == "" {
			continue
		}
		fi, err := os.Stat(d)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			return fmt.Errorf("%s %s: no such directory: create it, or leave the flag out to have the kit make a temporary one for a plugin it starts", flag, d)
		case err != nil:
			return fmt.Errorf("%s %s: %w", flag, d, err)
		case !fi.IsDir():
			return fmt.Errorf("%s %s: not a directory", flag, d)
		}
	}
	return nil
}

// errFailed is the error of a run in which a required check failed.
var errFailed = errors.New("conformance: a check failed")

func (f *flags) run(cmd *cobra.Command, command []string) error {
	cfg := f.cfg
	cfg.Command = command
	cfg.PluginOutput = cmd.ErrOrStderr()
	for _, d := range []*string{&cfg.RegistryDir, &cfg.EndpointDir} {
		if *d != "" || len(command) == 0 {
			continue
		}
		tmp, err := os.MkdirTemp("", "plugd-conformance-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(tmp)
		*d = tmp
	}
	// SIGINT and SIGTERM end the run: the plugin, in a process group of
	// its own that a terminal's Ctrl-C does not reach, is stopped, and the
	// temporary directories removed.
	ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	rep, err := Run(ctx, cfg)
	if err != nil {
		return err
	}
	if err := f.write(cmd.OutOrStdout(), rep); err != nil {
		return err
	}
	if !rep.Passed {
		return fmt.Errorf("%w: %d required of %d", errFailed, rep.failed(true), len(rep.Checks))
	}
	return nil
}

// write prints the report, and writes the JUnit file if asked.
func (f *flags) write(w io.Writer, rep *Report) error {
	if f.junit != "" {
		jf, err := os.Create(f.junit)
		if err != nil {
			return fmt.Errorf("--junit: %w", err)
		}
		err = writeJUnit(jf, rep)
		if cerr := jf.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return fmt.Errorf("--junit: writing %s: %w", f.junit, err)
		}
	}
	if f.output == "json" {
		return writeJSON(w, rep)
	}
	return writeText(w, rep)
}

// writeCatalogue prints every check, its rule and what it expects.
func writeCatalogue(w io.Writer) error {
	for _, c := range catalogue {
		types := "every type"
		if c.Types != nil {
			types = fmt.Sprint(c.Types)
		}
		note := ""
		if c.Started {
			note = " (needs the plugin started by the kit)"
		}
		if _, err := fmt.Fprintf(w, "%-34s [%s] %s%s: %s\n", c.ID, c.rule(), types, note, c.Expect); err != nil {
			return err
		}
	}
	return nil
}
