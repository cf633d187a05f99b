// Package cli is kubectl-plugd, the kubectl plugin (kubectl plugd) that
// reads plugd's reports across a cluster through the Kubernetes API: on how
// many nodes each expected plugin is ready (cluster), one node's plugins
// (node) and what is wrong on a node (doctor). It takes kubectl's own
// connection flags (k8s.io/cli-runtime), and its views are package fleet's,
// which plugctl cluster prints too.
package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/spf13/cobra"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/plugd/plugd/cmd/internal/version"
	"github.com/plugd/plugd/internal/kubeconfig"
)

// Exit codes, as plugctl's.
const (
	ExitOK       = 0 // the command did what was asked
	ExitError    = 1 // it could not: the API server unreachable, a node not found
	ExitUsage    = 2 // the command line is wrong
	ExitFindings = 4 // doctor found a warning or an error
)

// Main runs the plugin as a program: Ctrl-C (or SIGTERM) cancels what it
// does. cmd/kubectl-plugd passes the result to os.Exit.
func Main(args []string, stdout, stderr io.Writer) int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	go func() {
		<-ctx.Done()
		stop()
	}()
	return Run(ctx, args, stdout, stderr)
}

// Run runs the plugin with args (without the program name) and returns its
// exit code.
func Run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	a := &app{stdout: stdout, stderr: stderr, kube: genericclioptions.NewConfigFlags(true)}
	root := a.rootCommand()
	root.SetArgs(args)
	root.SetOut(stdout)
	root.SetErr(stderr)
	cmd, err := root.ExecuteContextC(ctx)
	if err == nil {
		return ExitOK
	}
	code := ExitUsage
	var ee *exitError
	if errors.As(err, &ee) {
		code = ee.code
	}
	fmt.Fprintf(stderr, "error: %s\n", strings.TrimRight(err.Error(), "\n"))
	if code == ExitUsage {
		fmt.Fprintf(stderr, "See '%s --help' for usage.\n", cmd.CommandPath())
	}
	return code
}

// app is one invocation.
type app struct {
	stdout, stderr io.Writer
	kube           *genericclioptions.ConfigFlags
}

func (a *app) rootCommand() *cobra.Command {
	root := &cobra.Command{
		Use:   "kubectl-plugd",
		Short: "Show the node plugins plugd watches, across the cluster and on one node",
		Long: `Show the node plugins (CSI drivers, device plugins, DRA drivers) that plugd
watches on every node, from the Node conditions plugd keeps in the API.

Find more information at: https://github.com/plugd/plugd/blob/main/docs/kubernetes.md`,
		Annotations:       map[string]string{cobra.CommandDisplayNameAnnotation: "kubectl plugd"},
		SilenceErrors:     true,
		SilenceUsage:      true,
		CompletionOptions: cobra.CompletionOptions{HiddenDefaultCmd: true},
	}
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error {
		return &exitError{code: ExitUsage, err: err}
	})
	a.kube.AddFlags(root.PersistentFlags())
	root.AddGroup(&cobra.Group{ID: "basic", Title: "Basic Commands:"})
	for _, c := range []*cobra.Command{a.clusterCommand(), a.nodeCommand(), a.doctorCommand()} {
		c.GroupID = "basic"
		root.AddCommand(c)
	}
	root.AddCommand(a.versionCommand())
	return root
}

// restConfig is the API server the flags point at, as kubectl finds it.
func (a *app) restConfig() (*rest.Config, error) {
	// The files the kubeconfig names (certificates, a token) are read as
	// plugctl reads them: at most a few MiB, a FIFO or device refused.
	loader := a.kube.ToRawKubeConfigLoader()
	if err := a.checkFound(loader); err != nil {
		return nil, err
	}
	rc, err := kubeconfig.RESTConfig(loader)
	if err != nil {
		return nil, fmt.Errorf("cannot find the Kubernetes API server: %w; give --kubeconfig (and --context)", err)
	}
	rc = rest.CopyConfig(rc)
	rc.UserAgent = "kubectl-plugd/" + version.String()
	// Nodes are large: protobuf is about half the bytes of JSON, and
	// faster to decode.
	rc.ContentType = "application/vnd.kubernetes.protobuf"
	rc.AcceptContentTypes = "application/vnd.kubernetes.protobuf,application/json"
	return rc, nil
}

// checkFound refuses to go on without an API server to talk to: no
// kubeconfig, no --server, and not in a pod. kubectl's defaults would then
// point at http://localhost:8080, and the user see only "connection
// refused".
func (a *app) checkFound(loader clientcmd.ClientConfig) error {
	raw, err := loader.RawConfig()
	if err != nil || len(raw.Clusters) > 0 || a.kube.APIServer != nil && *a.kube.APIServer != "" || os.Getenv("KUBERNETES_SERVICE_HOST") != "" {
		return nil // an error in a kubeconfig is RESTConfig's to say
	}
	return errors.New("cannot find the Kubernetes API server: no kubeconfig ($KUBECONFIG, else ~/.kube/config), no --server, and not in a pod; give --kubeconfig (and --context)")
}

// namespace is plugd's namespace: -n, else plugd. The context's namespace
// is not used: plugd runs in a namespace of its own, not the user's.
func (a *app) namespace() string {
	if a.kube.Namespace != nil && *a.kube.Namespace != "" {
		return *a.kube.Namespace
	}
	return "plugd"
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

// runE makes a failure while running exit code 1 unless it says otherwise,
// which tells it from a command line cobra rejected (2).
func runE(fn func(cmd *cobra.Command, args []string) error) func(*cobra.Command, []string) error {
	return func(cmd *cobra.Command, args []string) error {
		err := fn(cmd, args)
		var ee *exitError
		if err == nil || errors.As(err, &ee) {
			return err
		}
		var ne net.Error
		if errors.Is(err, context.DeadlineExceeded) || errors.As(err, &ne) && ne.Timeout() {
			// client-go says "context deadline exceeded", or not even that.
			err = fmt.Errorf("%w: the API server did not answer in time; --request-timeout waits longer", err)
		}
		return &exitError{code: ExitError, err: err}
	}
}

// exactlyOneNode takes the one NODE argument.
func exactlyOneNode(cmd *cobra.Command, args []string) error {
	if len(args) != 1 {
		return usageErrorf("%s takes one NODE, the name of a node; got %d arguments", cmd.Name(), len(args))
	}
	return nil
}

// oneOf checks a flag's value against the allowed ones, ignoring case.
func oneOf(flag, value string, allowed ...string) (string, error) {
	for _, v := range allowed {
		if strings.EqualFold(v, value) {
			return v, nil
		}
	}
	return "", usageErrorf("%s %q must be one of %s", flag, value, strings.Join(allowed, ", "))
}

func (a *app) versionCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the plugin's version",
		Args:  cobra.NoArgs,
		Run: func(*cobra.Command, []string) {
			fmt.Fprintln(a.stdout, version.Line("kubectl-plugd"))
		},
	}
}
