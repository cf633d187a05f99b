package conformance

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	junit "github.com/joshdk/go-junit"
	"github.com/spf13/cobra"

	"github.com/plugd/plugd/cmd/plugd/internal/daemon"
	"github.com/plugd/plugd/internal/testenv"
)

// plugd runs `plugd ARGS...` as plugd's main does, and returns its exit
// status, standard output and standard error.
func plugd(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	root := &cobra.Command{Use: "plugd"}
	root.AddCommand(Command())
	var stdout, stderr bytes.Buffer
	root.SetOut(&stdout)
	code := daemon.Execute(context.Background(), root, args, &stderr)
	return code, stdout.String(), stderr.String()
}

// The JUnit file names every check as a test case, with its status, and a
// JUnit reader (github.com/joshdk/go-junit) reads it; -o json prints the
// same results.
func TestJUnitAndJSON(t *testing.T) {
	for _, tc := range []struct {
		brk      string
		wantCode int
		failed   string
	}{
		{"", 0, ""},
		{"bad-name", daemon.ExitError, checkName},
	} {
		t.Run("device/"+tc.brk, func(t *testing.T) {
			file := filepath.Join(t.TempDir(), "conformance.xml")
			code, stdout, stderr := plugd(t, "conformance", "--timeout=5s", "--junit", file, "-o", "json", "--", os.Args[0], pluginArg, "device", tc.brk)
			if code != tc.wantCode {
				t.Fatalf("exit status %d, want %d; standard error:\n%s", code, tc.wantCode, stderr)
			}
			var rep Report
			if err := json.Unmarshal([]byte(stdout), &rep); err != nil {
				t.Fatalf("-o json printed what is not a report (%v):\n%s", err, stdout)
			}
			suites, err := junit.IngestFile(file)
			if err != nil {
				t.Fatal(err)
			}
			if len(suites) != 1 || len(suites[0].Tests) != len(rep.Checks) {
				t.Fatalf("JUnit: %d suites, want 1 with %d test cases: %+v", len(suites), len(rep.Checks), suites)
			}
			want := map[string]junit.Status{}
			for _, c := range rep.Checks {
				want[c.ID] = map[string]junit.Status{statusPass: junit.StatusPassed, statusFail: junit.StatusFailed, statusSkip: junit.StatusSkipped}[c.Status]
				if c.Status == statusFail && c.ID != tc.failed {
					t.Errorf("%s failed: %s", c.ID, c.Seen)
				}
			}
			for _, test := range suites[0].Tests {
				if test.Status != want[test.Name] {
					t.Errorf("JUnit test case %q: %s, want %s", test.Name, test.Status, want[test.Name])
				}
				delete(want, test.Name)
			}
			if len(want) > 0 {
				t.Errorf("checks missing from the JUnit file: %v", want)
			}
		})
	}
}

// One line per check in the text output, with its status, ID and rule.
func TestTextOneLinePerCheck(t *testing.T) {
	code, stdout, stderr := plugd(t, "conformance", "--", os.Args[0], pluginArg, "csi")
	if code != 0 {
		t.Fatalf("exit status %d; standard error:\n%s\nstandard output:\n%s", code, stderr, stdout)
	}
	for _, c := range catalogue {
		if !c.appliesTo(typeCSI) {
			continue
		}
		status := statusPass
		if optIn[c.ID] {
			status = statusSkip
		}
		found := false
		for line := range strings.Lines(stdout) {
			if strings.HasPrefix(line, status+"  "+c.ID+" ") && strings.Contains(line, "["+c.rule()) {
				found = true
			}
		}
		if !found {
			t.Errorf("no line \"%s  %s ... [%s\" in:\n%s", status, c.ID, c.rule(), stdout)
		}
	}
}

// A wrong command line is a usage error (2) that says what to do.
func TestCommandLineErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"conformance"}, "start the plugin with -- COMMAND"},
		{[]string{"conformance", "./driver"}, "put the plugin's command after --"},
		{[]string{"conformance", "-o", "yaml", "--", "true"}, "want text or json"},
		{[]string{"conformance", "--timeout", "-1s", "--", "true"}, "--timeout -1s: give a positive duration"},
		{[]string{"conformance", "--timeout", "0", "--", "true"}, "--timeout 0s: give a positive duration"},
		{[]string{"conformance", "--reregister-wait", "6m", "--", "true"}, "--reregister-wait 6m0s: give a duration up to the kubelet's own bound, 5m0s"},
		{[]string{"conformance", "--kubeconfig", "/nonexistent", "--", "true"}, "--kubeconfig and --node-name go together"},
		{[]string{"conformance", "--registry-dir", "/nonexistent-plugd-dir"}, "--registry-dir /nonexistent-plugd-dir: no such directory"},
		{[]string{"conformance", "--endpoint-dir", "/nonexistent-plugd-dir", "--", "true"}, "--endpoint-dir /nonexistent-plugd-dir: no such directory"},
		{[]string{"conformance", "--registry-dir", "/etc/hostname", "--", "true"}, "not a directory"},
	} {
		code, _, stderr := plugd(t, tc.args...)
		if code != daemon.ExitUsage || !strings.Contains(stderr, tc.want) {
			t.Errorf("plugd %q: exit status %d, standard error %q; want %d and an error saying %q", tc.args, code, stderr, daemon.ExitUsage, tc.want)
		}
	}
}

// --list prints every check with its rule.
func TestList(t *testing.T) {
	code, stdout, _ := plugd(t, "conformance", "--list")
	if code != 0 {
		t.Fatalf("exit status %d", code)
	}
	for _, c := range catalogue {
		if !strings.Contains(stdout, c.ID) {
			t.Errorf("%s not listed", c.ID)
		}
	}
}

// A failed recommendation fails the run only with --strict; a failed rule
// of the kubelet's always does.
func TestStrict(t *testing.T) {
	for _, tc := range []struct {
		brk    string
		strict bool
		want   int
	}{
		{"leave-socket", false, 0},
		{"leave-socket", true, daemon.ExitError},
		{"bad-name", false, daemon.ExitError},
	} {
		args := []string{"conformance", "--timeout=2s", fmt.Sprintf("--strict=%t", tc.strict), "--", os.Args[0], pluginArg, "device", tc.brk}
		code, stdout, stderr := plugd(t, args...)
		if code != tc.want {
			t.Errorf("plugd %q: exit status %d, want %d\n%s%s", args, code, tc.want, stdout, stderr)
		}
	}
}

// The kit does not take the place of a kubelet.sock that is served.
func TestKubeletSockServedIsRefused(t *testing.T) {
	dir := testenv.ShortDir(t, "ep")
	testenv.ServeGRPC(t, filepath.Join(dir, kubeletSocketName), nil)
	code, _, stderr := plugd(t, "conformance", "--kubelet-sock", "--endpoint-dir", dir)
	if code != daemon.ExitError || !strings.Contains(stderr, "by a kubelet most likely") {
		t.Errorf("exit status %d, standard error %q; want %d and an error saying kubelet.sock is served", code, stderr, daemon.ExitError)
	}
}
