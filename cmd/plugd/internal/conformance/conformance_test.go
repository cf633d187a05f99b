package conformance

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/plugd/plugd/internal/testenv"
)

func TestMain(m *testing.M) {
	if len(os.Args) > 2 && os.Args[1] == pluginArg {
		os.Exit(pluginMain(os.Args[2:]))
	}
	goleak.VerifyTestMain(m)
}

// runKit runs the kit against this binary's test plugin kind, broken as brk
// says ("" not at all), with each wait bounded by timeout.
func runKit(t *testing.T, kind, brk string, timeout time.Duration) *Report {
	t.Helper()
	run := newKitRun(t, kind, brk, timeout)
	run.run()
	run.check(t)
	return run.rep
}

// kitRun is one run of the kit against a test plugin, which may run in
// another goroutine than the test's: it touches no testing.T.
type kitRun struct {
	cfg Config
	out testenv.Buffer
	rep *Report
	err error
}

func newKitRun(t *testing.T, kind, brk string, timeout time.Duration) *kitRun {
	r := &kitRun{cfg: Config{
		RegistryDir: testenv.ShortDir(t, "reg"),
		EndpointDir: testenv.ShortDir(t, "ep"),
		Command:     []string{os.Args[0], pluginArg, kind, brk},
		Timeout:     timeout,
	}}
	if kind == "device" || kind == "dpsock" {
		r.cfg.HealthCommand = healthCommand
	}
	r.cfg.PluginOutput = &r.out
	return r
}

func (r *kitRun) run() { r.rep, r.err = Run(context.Background(), r.cfg) }

// check fails t if the kit could not run, and prints the report and the
// plugin's output at the end of a failed test.
func (r *kitRun) check(t *testing.T) {
	t.Helper()
	if r.err != nil {
		t.Fatal(r.err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			var b strings.Builder
			writeText(&b, r.rep)
			t.Logf("the kit's report:\n%s\nthe plugin's output:\n%s", b.String(), r.out.String())
		}
	})
}

// statuses are a report's results by check.
func statuses(rep *Report) map[string]string {
	m := map[string]string{}
	for _, c := range rep.Checks {
		m[c.ID] = c.Status
	}
	return m
}

// wantAllPass fails the test unless every check of the plugin's type ran
// and passed.
func wantAllPass(t *testing.T, rep *Report, typ string) {
	t.Helper()
	got := statuses(rep)
	for _, c := range catalogue {
		if !c.appliesTo(typ) {
			if _, ok := got[c.ID]; ok {
				t.Errorf("%s reported for a %s", c.ID, typ)
			}
			continue
		}
		want := statusPass
		if (c.Via != "" && c.Via != rep.Plugin.Via) || optIn[c.ID] {
			want = statusSkip // a check of the other way of registering, or one not asked for
		}
		if got[c.ID] != want {
			t.Errorf("%s: %s, want %s", c.ID, got[c.ID], want)
		}
	}
	if !rep.Passed {
		t.Error("the report says the plugin did not pass")
	}
}

// Plugins that follow the rules pass every check: a DRA driver built on
// k8s.io/dynamic-resource-allocation/kubeletplugin, a CSI driver behind a
// registrar, a device plugin, and a plugin whose endpoint comes up after
// its registration socket.
func TestConformingPluginsPass(t *testing.T) {
	for _, tc := range []struct{ kind, brk, typ string }{
		{"dra-kubeletplugin", "", typeDRA},
		{"csi", "", typeCSI},
		{"device", "", typeDevice},
		{"dra", "", typeDRA},
		{"dra", "late-endpoint", typeDRA},
		{"dra", "health-ends", typeDRA},
		{"dpsock", "", typeDevice},
	} {
		t.Run(strings.TrimSuffix(tc.kind+"/"+tc.brk, "/"), func(t *testing.T) {
			t.Parallel()
			rep := runKit(t, tc.kind, tc.brk, 10*time.Second)
			wantAllPass(t, rep, tc.typ)
			if rep.Duration > 30*time.Second {
				t.Errorf("the run took %s, more than the 30 s promised", rep.Duration)
			}
			t.Logf("%s: %d checks in %s", tc.kind, len(rep.Checks), rep.Duration.Round(time.Millisecond))
		})
	}
}

// mutants are the broken plugins: each breaks one rule, and must fail
// exactly the check of that rule (the kit's own mutation test: a check no
// plugin can fail checks nothing).
var mutants = []struct {
	kind, brk, fails string
}{
	{"device", "no-socket", checkSocket},
	{"device", "slow-getinfo", checkGetInfoTime},
	{"device", "bad-type", checkType},
	{"device", "bad-name", checkName},
	{"csi", "bad-versions", checkVersions},
	{"device", "bad-endpoint", checkEndpoint},
	{"device", "notify-error-first", checkNotify},
	{"csi", "csi-wrong-name", checkCSIPluginInfo},
	{"csi", "csi-probe-fails", checkCSIProbe},
	{"csi", "csi-no-node-id", checkCSINodeInfo},
	{"dra", "dra-v1beta1-unserved", checkDRAServices},
	{"dra", "dra-prepare-fails", checkDRAEmpty},
	{"dra", "dra-health-unserved", checkDRAHealth},
	{"device", "dp-options-fail", checkDPOptions},
	{"device", "dp-silent-list", checkDPListAndWatch},
	{"device", "dp-stream-ends", checkDPStreamOpen},
	{"device", "dp-health-ignored", checkDPHealth},
	{"dpsock", "dp-health-ignored", checkDPHealth},
	{"device", "dp-one-stream", checkDPListAgain},
	{"device", "answers-change", checkRestart},
	{"device", "impatient", checkLateNotify},
	{"dpsock", "bad-versions", checkDPRegister},
	{"dpsock", "serve-after-register", checkDPRegister},
	{"dpsock", "no-reregister", checkDPRestart},
	{"device", "leave-socket", checkSIGTERM},
	{"device", "ignore-sigterm", checkSIGTERM},
	{"device", "no-stale-replace", checkStale},
	{"csi", "refused-wrong", checkRefused},
	{"dra", "refused-wrong", checkRefused},
}

func TestEachBrokenPluginFailsItsCheckOnly(t *testing.T) {
	// The runs mostly wait on the plugins and on deadlines, so they run at
	// once, beyond -parallel; each subtest then reads its report.
	runs := make([]*kitRun, len(mutants))
	var wg sync.WaitGroup
	for i, m := range mutants {
		runs[i] = newKitRun(t, m.kind, m.brk, 5*time.Second)
		wg.Go(runs[i].run)
	}
	wg.Wait()
	for i, m := range mutants {
		t.Run(m.kind+"/"+m.brk, func(t *testing.T) {
			runs[i].check(t)
			rep := runs[i].rep
			var failed []string
			for _, c := range rep.Checks {
				if c.Status == statusFail {
					failed = append(failed, c.ID)
				}
			}
			if len(failed) != 1 || failed[0] != m.fails {
				t.Errorf("failed %q, want %q only", failed, m.fails)
			}
			if required := checkByID(m.fails).Kubelet != ""; rep.Passed == required {
				t.Errorf("the report's verdict is passed %t, with a failed check whose rule is %s", rep.Passed, checkByID(m.fails).rule())
			}
		})
	}
}

// optIn are the checks the runs here do not ask for: they need what only
// test/kube has (an API server; csi-sanity, which the main module does not
// require).
var optIn = map[string]bool{checkDRASlices: true, checkCSISanity: true}

// brokenElsewhere are the checks whose broken plugins run in test/kube.
var brokenElsewhere = map[string]string{
	checkDRASlices: "test/kube TestConformanceDRAResourceSlices (an incomplete pool, slices for another node)",
	checkCSISanity: "test/kube TestConformanceCSISanity (a CSI driver that does not validate NodePublishVolume's request)",
}

// Every check is failed by some broken plugin.
func TestEveryCheckHasABrokenPlugin(t *testing.T) {
	covered := map[string]bool{}
	for id := range brokenElsewhere {
		covered[id] = true
	}
	for _, m := range mutants {
		covered[m.fails] = true
	}
	for _, c := range catalogue {
		if !covered[c.ID] {
			t.Errorf("no broken plugin fails %s: add one to mutants", c.ID)
		}
	}
}

// Attached to a running plugin, the kit runs every check but those that
// restart the plugin, which it skips and says why.
func TestAttachSkipsWhatNeedsAStart(t *testing.T) {
	reg, ep := testenv.ShortDir(t, "reg"), testenv.ShortDir(t, "ep")
	t.Setenv(envRegistryDir, reg)
	t.Setenv(envEndpointDir, ep)
	term := make(chan os.Signal)
	done := make(chan error)
	go func() { done <- (&mutant{kind: "device", regDir: reg, epDir: ep}).run(term) }()
	rep, err := Run(context.Background(), Config{RegistryDir: reg, Timeout: 5 * time.Second})
	close(term)
	if err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	for _, c := range rep.Checks {
		want := statusPass
		if checkByID(c.ID).Via == viaKubeletSock || c.ID == checkDPHealth || optIn[c.ID] {
			want = statusSkip // the other way of registering; no --health-command
		} else if checkByID(c.ID).Started {
			want = statusSkip
			if !strings.Contains(c.Seen, "-- COMMAND") {
				t.Errorf("%s skipped saying %q, which does not say how to run it", c.ID, c.Seen)
			}
		}
		if c.Status != want {
			t.Errorf("%s: %s (%s), want %s", c.ID, c.Status, c.Seen, want)
		}
	}
	if !rep.Passed {
		t.Error("a plugin whose every check passed or was skipped did not pass")
	}
}

// A wait that ends says what it waited for, and for how long.
func TestWaitsSayWhatTheyWaitedFor(t *testing.T) {
	rep := runKit(t, "device", "no-socket", 500*time.Millisecond)
	for _, c := range rep.Checks {
		if c.ID == checkSocket {
			want := fmt.Sprintf("waited %s for a registration socket in", 500*time.Millisecond)
			if !strings.Contains(c.Seen, want) {
				t.Errorf("seen %q, want it to contain %q", c.Seen, want)
			}
			return
		}
	}
	t.Errorf("no %s in the report", checkSocket)
}
