package cli

import (
	"context"
	"io"
	"strings"
	"testing"

	"github.com/plugd/plugd/cmd/internal/version"
	"github.com/spf13/cobra"
	"k8s.io/cli-runtime/pkg/genericclioptions"
)

// run runs the plugin in-process and returns its exit code and output.
func run(args ...string) (int, string) {
	var out strings.Builder
	code := Run(context.Background(), args, &out, &out)
	return code, out.String()
}

// The help reads like kubectl's: the command is "kubectl plugd", commands
// come in groups, and kubectl's connection flags are there.
func TestHelp(t *testing.T) {
	code, out := run("--help")
	for _, want := range []string{"kubectl plugd [command]", "Basic Commands:", "cluster ", "doctor ", "node ",
		"--kubeconfig string", "--context string", "-n, --namespace string", "--request-timeout"} {
		if !strings.Contains(out, want) {
			t.Errorf("kubectl plugd --help lacks %q:\n%s", want, out)
		}
	}
	if code != ExitOK {
		t.Errorf("--help: exit %d", code)
	}
	_, out = run("node", "--help")
	for _, want := range []string{"kubectl plugd node NODE", "Examples:\n  # The plugins of node worker-1\n  kubectl plugd node worker-1", "-w, --watch", "Global Flags:"} {
		if !strings.Contains(out, want) {
			t.Errorf("kubectl plugd node --help lacks %q:\n%s", want, out)
		}
	}
}

func TestUsageErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"node"}, ExitUsage, "node takes one NODE"},
		{[]string{"doctor", "a", "b"}, ExitUsage, "doctor takes one NODE"},
		{[]string{"cluster", "-o", "xml"}, ExitUsage, `--output "xml" must be one of table, wide, json, yaml`},
		{[]string{"doctor", "a", "--min-severity", "fatal"}, ExitUsage, `--min-severity "fatal" must be one of info, warning, error`},
		{[]string{"cluster", "--bogus"}, ExitUsage, "unknown flag: --bogus"},
		{[]string{"cluster", "--kubeconfig", "/nonexistent/kubeconfig"}, ExitError, "cannot find the Kubernetes API server"},
	} {
		code, out := run(tc.args...)
		if code != tc.code || !strings.Contains(out, tc.want) {
			t.Errorf("kubectl plugd %q: exit %d, want %d with %q:\n%s", tc.args, code, tc.code, tc.want, out)
		}
		if code == ExitUsage && !strings.Contains(out, "--help' for usage") {
			t.Errorf("kubectl plugd %q: no hint at --help:\n%s", tc.args, out)
		}
	}
}

// Issue 33, item 12: kubectl plugd version prints its version as plugd
// and plugctl do (version.Line): the name, the version, Go's.
func TestVersion(t *testing.T) {
	if code, out := run("version"); code != ExitOK || out != version.Line("kubectl-plugd")+"\n" {
		t.Errorf("version: exit %d, %q; want %q", code, out, version.Line("kubectl-plugd"))
	}
}

// Issue 33, item 12: with no kubeconfig, no --server and no pod around
// it, kubectl plugd says what to give, as plugctl cluster does, instead
// of trying http://localhost:8080 and printing "connection refused".
func TestNoKubeconfig(t *testing.T) {
	t.Setenv("KUBECONFIG", "")
	t.Setenv("HOME", t.TempDir())
	t.Setenv("KUBERNETES_SERVICE_HOST", "")
	for _, args := range [][]string{{"cluster"}, {"node", "a"}, {"doctor", "a"}} {
		code, out := run(args...)
		if code != ExitError || !strings.Contains(out, "cannot find the Kubernetes API server") || !strings.Contains(out, "give --kubeconfig") || strings.Contains(out, "localhost:8080") {
			t.Errorf("kubectl plugd %q without a kubeconfig: exit %d:\n%s", args, code, out)
		}
	}
}

// Issue 33, item 12: no line of any command's help starts with a stray
// space (a paragraph's first word pushed in by one column); indented
// blocks (two spaces or more) are fine.
func TestHelpHasNoStraySpace(t *testing.T) {
	a := &app{stdout: io.Discard, stderr: io.Discard, kube: genericclioptions.NewConfigFlags(true)}
	checkHelp(t, a.rootCommand())
}

// checkHelp fails for each line of cmd's help texts, and its commands',
// that starts with exactly one space.
func checkHelp(t *testing.T, cmd *cobra.Command) {
	t.Helper()
	for _, text := range []string{cmd.Short, cmd.Long, cmd.Example} {
		for _, line := range strings.Split(text, "\n") {
			if strings.HasPrefix(line, " ") && !strings.HasPrefix(line, "  ") {
				t.Errorf("%s: a line of its help starts with a stray space: %q", cmd.CommandPath(), line)
			}
		}
	}
	for _, sub := range cmd.Commands() {
		checkHelp(t, sub)
	}
}
