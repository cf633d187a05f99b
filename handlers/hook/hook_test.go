package hook_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	"go.uber.org/goleak"

	"github.com/plugd/plugd/handlers/hook"
	"github.com/plugd/plugd/internal/testenv"
	"github.com/plugd/plugd/plugin"
	"github.com/plugd/plugd/pluginmanager"
	"github.com/plugd/plugd/plugintest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// typ is the custom plugin type the tests' hooks handle.
const typ = "example.com/HookPlugin"

func TestCommandAccepts(t *testing.T) {
	t.Setenv("PLUGD_TEST_SECRET", "leaked") // plugd's environment must not reach the hook
	dir := t.TempDir()
	reg := prometheus.NewRegistry()
	hk := newHook(t, hook.Config{
		Command: sh(`cat > "$1/$PLUGD_EVENT.json"
printf '%s\n' "$PLUGD_EVENT" "$PLUGD_PLUGIN_TYPE" "$PLUGD_PLUGIN_NAME" "$PLUGD_PLUGIN_ENDPOINT" \
	"$PLUGD_PLUGIN_VERSIONS" "$PLUGD_PLUGIN_SOCKET" "${EXTRA-unset}" "${PLUGD_TEST_SECRET-unset}" > "$1/$PLUGD_EVENT.env"`, dir),
		Env: []string{"EXTRA=an extra value", "PLUGD_EVENT=overridden"},
	}, hook.Options{Registerer: reg})
	h := start(t, hk)
	p := testenv.StartPlugin(t, plugin.Config{Dir: h.dir, Type: typ, Name: "hook.example.com", Endpoint: "/run/example/api.sock", Versions: []string{"1.0", "2.0"}})
	h.WaitSocket(p.Path(), pluginmanager.StateRegistered)

	want := pluginmanager.Plugin{Type: typ, Name: "hook.example.com", Endpoint: "/run/example/api.sock", Versions: []string{"1.0", "2.0"}, Socket: p.Path()}
	checkMessage(t, readFile(t, filepath.Join(dir, "register.json")), "register", want)
	env := strings.Split(strings.TrimSuffix(readFile(t, filepath.Join(dir, "register.env")), "\n"), "\n")
	wantEnv := []string{"register", typ, "hook.example.com", "/run/example/api.sock", "1.0,2.0", p.Path(), "an extra value", "unset"}
	if !slices.Equal(env, wantEnv) {
		t.Errorf("hook environment:\n got %q\nwant %q", env, wantEnv)
	}
	if _, err := os.Stat(filepath.Join(dir, "validate.json")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("validate hook ran, but validate is not in Events (stat: %v)", err)
	}

	run, ok := hk.Details(want).(hook.Run)
	if !ok {
		t.Fatalf("Details = %#v, want a hook.Run", hk.Details(want))
	}
	if run.Event != "register" || run.Result != "accepted" || run.ExitStatus == nil || *run.ExitStatus != 0 ||
		run.Error != "" || run.Start.IsZero() || run.DurationSeconds <= 0 || run.HTTPStatus != 0 {
		t.Errorf("Details = %+v, want an accepted register run that exited 0", run)
	}
	if d := hk.Details(pluginmanager.Plugin{Socket: filepath.Join(h.dir, "other.sock")}); d != nil {
		t.Errorf("Details of an unknown socket = %#v, want nil", d)
	}
	// Details is for a JSON status API.
	if b, err := json.Marshal(hk.Details(want)); err != nil || !strings.Contains(string(b), `"result":"accepted"`) {
		t.Errorf("Details as JSON = %s, %v", b, err)
	}

	expected := `
# HELP plugd_hook_runs_total Hook runs, by event and result (accepted, refused, error, timeout).
# TYPE plugd_hook_runs_total counter
plugd_hook_runs_total{event="deregister",result="accepted"} 0
plugd_hook_runs_total{event="deregister",result="error"} 0
plugd_hook_runs_total{event="deregister",result="refused"} 0
plugd_hook_runs_total{event="deregister",result="timeout"} 0
plugd_hook_runs_total{event="register",result="accepted"} 1
plugd_hook_runs_total{event="register",result="error"} 0
plugd_hook_runs_total{event="register",result="refused"} 0
plugd_hook_runs_total{event="register",result="timeout"} 0
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(expected), "plugd_hook_runs_total"); err != nil {
		t.Error(err)
	}
	if n := durations(t, reg, "register"); n != 1 {
		t.Errorf("plugd_hook_duration_seconds{event=register} counted %d runs, want 1", n)
	}
}

func TestCommandRefusesOnValidate(t *testing.T) {
	dir := t.TempDir()
	hk := newHook(t, hook.Config{
		Command: sh(`if [ "$PLUGD_EVENT" = validate ] && [ "$PLUGD_PLUGIN_NAME" = bad ]; then
	echo "stdout is not the reason when there is stderr"
	echo "checking..." >&2
	printf '\033[31mplugin %s is not allowed\033[0m\n\n' "$PLUGD_PLUGIN_NAME" >&2
	exit 1
fi
echo "$PLUGD_EVENT $PLUGD_PLUGIN_NAME" >> "$1/calls"`, dir),
		Events: []string{"validate", "register"},
	}, hook.Options{})
	h := start(t, hk)
	onStatus, told := statuses()
	bad := testenv.StartPlugin(t, plugin.Config{Dir: h.dir, Type: typ, Name: "bad", OnStatus: onStatus})
	good := testenv.StartPlugin(t, plugin.Config{Dir: h.dir, Type: typ, Name: "good"})

	const reason = `validate hook refused the plugin (exit status 1): checking...\n\x1b[31mplugin bad is not allowed\x1b[0m`
	s := h.WaitSocket(bad.Path(), pluginmanager.StateRejected)
	if s.Reason != pluginmanager.ReasonValidate || s.LastError != reason {
		t.Errorf("rejected with %s %q, want validate %q", s.Reason, s.LastError, reason)
	}
	if st := waitStatus(t, told); st.Registered || st.Error != reason {
		t.Errorf("plugin was told %+v, want not registered because %q", st, reason)
	}
	h.WaitSocket(good.Path(), pluginmanager.StateRegistered)
	if calls := readFile(t, filepath.Join(dir, "calls")); calls != "validate good\nregister good\n" {
		t.Errorf("hook ran for %q, want validate and register for good only", calls)
	}
	run := hk.Details(s.Plugin).(hook.Run)
	if run.Event != "validate" || run.Result != "refused" || *run.ExitStatus != 1 || run.Error != reason ||
		run.Output != `checking...\n\x1b[31mplugin bad is not allowed\x1b[0m` {
		t.Errorf("Details = %+v", run)
	}
}

func TestCommandRegisterExitStatus(t *testing.T) {
	t.Run("3 refuses for good", func(t *testing.T) {
		hk := newHook(t, hook.Config{Command: sh(`echo "no room for $PLUGD_PLUGIN_NAME" >&2; exit 3`)}, hook.Options{})
		h := start(t, hk)
		p := testenv.StartPlugin(t, plugin.Config{Dir: h.dir, Type: typ, Name: "full"})
		s := h.WaitSocket(p.Path(), pluginmanager.StateRejected)
		if want := "register hook refused the plugin (exit status 3): no room for full"; s.Reason != pluginmanager.ReasonRegister || s.LastError != want || s.Attempts != 1 {
			t.Errorf("status = %+v, want rejected at register after 1 attempt with %q", s, want)
		}
	})
	t.Run("others are retried", func(t *testing.T) {
		dir := t.TempDir()
		reg := prometheus.NewRegistry()
		hk := newHook(t, hook.Config{Command: sh(`echo run >> "$1/runs"
if [ "$(wc -l < "$1/runs")" -lt 3 ]; then echo "busy, try again" >&2; exit 1; fi`, dir)}, hook.Options{Registerer: reg})
		h := start(t, hk)
		p := testenv.StartPlugin(t, plugin.Config{Dir: h.dir, Type: typ, Name: "busy"})
		ev := h.WaitEvent(p.Path(), pluginmanager.EventFailed)
		if want := "register hook refused the plugin (exit status 1): busy, try again"; ev.Reason != pluginmanager.ReasonRegister || ev.Error != want {
			t.Errorf("failed with %s %q, want register %q", ev.Reason, ev.Error, want)
		}
		if s := h.WaitSocket(p.Path(), pluginmanager.StateRegistered); s.Attempts != 3 {
			t.Errorf("registered after %d attempts, want 3", s.Attempts)
		}
		if runs := readFile(t, filepath.Join(dir, "runs")); runs != "run\nrun\nrun\n" {
			t.Errorf("hook ran %d times, want 3", strings.Count(runs, "\n"))
		}
		checkRuns(t, reg, "register", map[string]float64{"accepted": 1, "refused": 2})
	})
}

func TestOutputIsBounded(t *testing.T) {
	hk := newHook(t, hook.Config{
		Command: sh(`head -c 1000000 /dev/zero >&2; echo "the last line" >&2; exit 1`),
		Events:  []string{"validate"},
	}, hook.Options{})
	p := testPlugin("noisy")
	err := hk.Validate(t.Context(), p)
	const prefix = "validate hook refused the plugin (exit status 1): "
	if err == nil || !strings.HasPrefix(err.Error(), prefix) || !strings.HasSuffix(err.Error(), `\x00the last line`) || len(err.Error()) > len(prefix)+512 {
		t.Errorf("Validate error (%d bytes) = %.100q..., want at most 512 bytes of output, ending with the last line", len(fmt.Sprint(err)), err)
	}
	run := hk.Details(p).(hook.Run)
	if len(run.Output) > 4096 || !strings.HasSuffix(run.Output, `\x00the last line`) {
		t.Errorf("Details output is %d bytes, ending %q; want at most 4096, ending with the last line", len(run.Output), run.Output[max(0, len(run.Output)-40):])
	}
}

func TestHTTP(t *testing.T) {
	var (
		mu       sync.Mutex
		received = make(map[string][]string) // plugin name -> raw bodies
	)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		var m struct {
			Event  string
			Plugin pluginmanager.Plugin
		}
		if r.Method != http.MethodPost || r.Header.Get("Content-Type") != "application/json" || json.Unmarshal(body, &m) != nil {
			http.Error(w, fmt.Sprintf("bad request: %s %q %q", r.Method, r.Header.Get("Content-Type"), body), http.StatusTeapot)
			return
		}
		mu.Lock()
		received[m.Plugin.Name] = append(received[m.Plugin.Name], string(body))
		n := 0 // how many times this event came for this plugin
		for _, b := range received[m.Plugin.Name] {
			if strings.Contains(b, `"event":"`+m.Event+`"`) {
				n++
			}
		}
		mu.Unlock()
		switch {
		case m.Plugin.Name == "deny-validate" && m.Event == "validate":
			http.Error(w, "deny-validate is not on the list", http.StatusForbidden)
		case m.Plugin.Name == "deny-register" && m.Event == "register":
			http.Error(w, "no capacity for\x1b[2J deny-register", http.StatusConflict)
		case m.Plugin.Name == "flaky" && n == 1:
			http.Error(w, "try again", http.StatusInternalServerError)
		}
	}))
	t.Cleanup(srv.Close)

	reg := prometheus.NewRegistry()
	hk := newHook(t, hook.Config{URL: srv.URL + "/hooks/plugd", Events: []string{"validate", "register"}}, hook.Options{Registerer: reg, HTTPClient: srv.Client()})
	h := start(t, hk)
	ok := testenv.StartPlugin(t, plugin.Config{Dir: h.dir, Type: typ, Name: "ok", Versions: []string{"v1"}})
	denyValidate := testenv.StartPlugin(t, plugin.Config{Dir: h.dir, Type: typ, Name: "deny-validate"})
	denyRegister := testenv.StartPlugin(t, plugin.Config{Dir: h.dir, Type: typ, Name: "deny-register"})
	flaky := testenv.StartPlugin(t, plugin.Config{Dir: h.dir, Type: typ, Name: "flaky"})

	h.WaitSocket(ok.Path(), pluginmanager.StateRegistered)
	s := h.WaitSocket(denyValidate.Path(), pluginmanager.StateRejected)
	if want := "validate hook refused the plugin (HTTP 403 Forbidden): deny-validate is not on the list"; s.Reason != pluginmanager.ReasonValidate || s.LastError != want {
		t.Errorf("deny-validate rejected with %s %q, want validate %q", s.Reason, s.LastError, want)
	}
	s = h.WaitSocket(denyRegister.Path(), pluginmanager.StateRejected)
	if want := `register hook refused the plugin (HTTP 409 Conflict): no capacity for\x1b[2J deny-register`; s.Reason != pluginmanager.ReasonRegister || s.LastError != want || s.Attempts != 1 {
		t.Errorf("deny-register = %+v, want rejected at register after 1 attempt with %q", s, want)
	}
	// A 500 is retried, on validate (through Register) as on register.
	if s := h.WaitSocket(flaky.Path(), pluginmanager.StateRegistered); s.Attempts != 3 {
		t.Errorf("flaky registered after %d attempts, want 3", s.Attempts)
	}

	mu.Lock()
	okBodies := received["ok"]
	mu.Unlock()
	if len(okBodies) != 2 {
		t.Fatalf("server received %q for ok, want a validate and a register", okBodies)
	}
	want := pluginmanager.Plugin{Type: typ, Name: "ok", Endpoint: ok.Path(), Versions: []string{"v1"}, Socket: ok.Path()}
	checkMessage(t, okBodies[0], "validate", want)
	checkMessage(t, okBodies[1], "register", want)

	run := hk.Details(pluginmanager.Plugin{Socket: denyRegister.Path()}).(hook.Run)
	if run.Event != "register" || run.Result != "refused" || run.HTTPStatus != 409 || run.ExitStatus != nil || run.Output != `no capacity for\x1b[2J deny-register` {
		t.Errorf("deny-register Details = %+v", run)
	}
	checkRuns(t, reg, "validate", map[string]float64{"accepted": 4, "refused": 1, "error": 1})
	checkRuns(t, reg, "register", map[string]float64{"accepted": 2, "refused": 1, "error": 1})
}

func TestHTTPUnreachable(t *testing.T) {
	srv := httptest.NewServer(http.NotFoundHandler())
	srv.Close() // nothing listens at its address any more
	hk := newHook(t, hook.Config{URL: srv.URL + "/hook?token=s3cret", Events: []string{"validate"}}, hook.Options{})
	h := start(t, hk)
	p := testenv.StartPlugin(t, plugin.Config{Dir: h.dir, Type: typ, Name: "a"})
	ev := h.WaitEvent(p.Path(), pluginmanager.EventFailed)
	// Validate cannot ask for a retry; Register does it for it.
	if ev.Reason != pluginmanager.ReasonRegister || !strings.HasPrefix(ev.Error, "validate hook failed: ") || strings.Contains(ev.Error, "s3cret") {
		t.Errorf("failed with %s %q, want register, a validate hook failure that does not show the URL", ev.Reason, ev.Error)
	}
	if run := hk.Details(ev.Plugin).(hook.Run); run.Event != "validate" || run.Result != "error" {
		t.Errorf("Details = %+v, want a validate run that failed", run)
	}
}

func TestDeregister(t *testing.T) {
	dir := t.TempDir()
	reg := prometheus.NewRegistry()
	var logs testenv.Buffer
	hk := newHook(t, hook.Config{Command: sh(`cat > "$1/$PLUGD_EVENT.json"
if [ "$PLUGD_EVENT" = deregister ]; then echo "cleanup failed" >&2; exit 1; fi`, dir)},
		hook.Options{Registerer: reg, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	h := start(t, hk)
	p := testenv.StartPlugin(t, plugin.Config{Dir: h.dir, Type: typ, Name: "leaving"})
	s := h.WaitSocket(p.Path(), pluginmanager.StateRegistered)
	if hk.Details(s.Plugin) == nil {
		t.Fatal("no Details for a registered plugin")
	}

	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	h.WaitGone(p.Path())
	checkMessage(t, readFile(t, filepath.Join(dir, "deregister.json")), "deregister", s.Plugin)
	if d := hk.Details(s.Plugin); d != nil {
		t.Errorf("Details after deregistration = %+v, want nil", d)
	}
	if l := logs.String(); !strings.Contains(l, "deregister hook did not accept") || !strings.Contains(l, "cleanup failed") {
		t.Errorf("logs do not tell of the failed deregister hook:\n%s", l)
	}
	checkRuns(t, reg, "deregister", map[string]float64{"refused": 1})
}

func TestConfigErrors(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  hook.Config
		want string
	}{
		{"neither", hook.Config{}, "hook: set exactly one of command or url"},
		{"both", hook.Config{Command: []string{"true"}, URL: "http://127.0.0.1/"}, "hook: set exactly one of command or url"},
		{"empty program", hook.Config{Command: []string{"", "x"}}, "hook: command[0] is empty"},
		{"missing program", hook.Config{Command: []string{"plugd-no-such-hook"}}, "hook: command[0]: "},
		{"url scheme", hook.Config{URL: "ftp://example.com/x?token=s3cret"}, "hook: url must be http or https"},
		{"url host", hook.Config{URL: "http:///x"}, "hook: url has no host"},
		{"env with url", hook.Config{URL: "http://127.0.0.1/", Env: []string{"A=b"}}, "hook: env is for a command"},
		{"env entry", hook.Config{Command: []string{"true"}, Env: []string{"A=b", "s3cret"}}, "hook: env[1] is not KEY=VALUE"},
		{"timeout", hook.Config{Command: []string{"true"}, Timeout: -time.Second}, "hook: timeout -1s is negative"},
		{"event", hook.Config{Command: []string{"true"}, Events: []string{"register", "unregister"}}, `hook: events[1]: unknown event "unregister"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h, err := hook.New(tc.cfg, hook.Options{})
			if err == nil || !strings.HasPrefix(err.Error(), tc.want) || strings.Contains(err.Error(), "s3cret") {
				t.Errorf("New = %v, %v; want an error starting %q (and no secret)", h, err, tc.want)
			}
		})
	}
}

func TestSharedRegisterer(t *testing.T) {
	reg := prometheus.NewRegistry()
	a := newHook(t, hook.Config{Command: []string{"true"}}, hook.Options{Registerer: reg})
	b := newHook(t, hook.Config{Command: []string{"true"}, Events: []string{"register"}}, hook.Options{Registerer: reg})
	for _, h := range []*hook.Handler{a, b} {
		if err := h.Register(t.Context(), testPlugin("p")); err != nil {
			t.Fatal(err)
		}
	}
	checkRuns(t, reg, "register", map[string]float64{"accepted": 2})
}

// sh is a command that runs script with /bin/sh, with args as $1...
func sh(script string, args ...string) []string {
	return append([]string{"/bin/sh", "-c", script, "hook"}, args...)
}

func newHook(t *testing.T, cfg hook.Config, opts hook.Options) *hook.Handler {
	t.Helper()
	h, err := hook.New(cfg, opts)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

func testPlugin(name string) pluginmanager.Plugin {
	return pluginmanager.Plugin{Type: typ, Name: name, Endpoint: "/run/" + name + ".sock", Versions: []string{"v1"}, Socket: "/run/plugins/" + name + ".sock"}
}

// checkMessage checks what a hook was given, byte for byte but for the order
// of fields.
func checkMessage(t *testing.T, got, event string, p pluginmanager.Plugin) {
	t.Helper()
	versions := p.Versions
	if versions == nil {
		versions = []string{} // a hook is given [], never null
	}
	want, err := json.Marshal(map[string]any{"event": event, "plugin": map[string]any{
		"type": p.Type, "name": p.Name, "endpoint": p.Endpoint, "versions": versions, "socket": p.Socket,
	}})
	if err != nil {
		t.Fatal(err)
	}
	var g, w any
	if err := json.Unmarshal([]byte(got), &g); err != nil {
		t.Fatalf("hook was given %q: %v", got, err)
	}
	json.Unmarshal(want, &w)
	if !reflect.DeepEqual(g, w) {
		t.Errorf("hook was given\n%s\nwant\n%s", got, want)
	}
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// checkRuns compares plugd_hook_runs_total for event with want, by result;
// results not in want must be zero.
func checkRuns(t *testing.T, reg *prometheus.Registry, event string, want map[string]float64) {
	t.Helper()
	got := make(map[string]float64)
	for _, m := range family(t, reg, "plugd_hook_runs_total") {
		labels := make(map[string]string)
		for _, l := range m.GetLabel() {
			labels[l.GetName()] = l.GetValue()
		}
		if labels["event"] == event && m.GetCounter().GetValue() != 0 {
			got[labels["result"]] = m.GetCounter().GetValue()
		}
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("plugd_hook_runs_total{event=%q} by result = %v, want %v", event, got, want)
	}
}

// durations is how many runs plugd_hook_duration_seconds counted for event.
func durations(t *testing.T, reg *prometheus.Registry, event string) uint64 {
	t.Helper()
	for _, m := range family(t, reg, "plugd_hook_duration_seconds") {
		if m.GetLabel()[0].GetValue() == event {
			return m.GetHistogram().GetSampleCount()
		}
	}
	return 0
}

func family(t *testing.T, reg *prometheus.Registry, name string) []*dto.Metric {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			return mf.GetMetric()
		}
	}
	return nil
}

// harness is a running manager with the hook handler.
type harness struct {
	*plugintest.Manager
	t   *testing.T
	m   *pluginmanager.Manager
	dir string
}

// start runs a manager with fast test timings and h as the handler for typ,
// and stops it at the end of the test, checking that Run returned.
func start(t *testing.T, h pluginmanager.Handler) *harness {
	t.Helper()
	pm := plugintest.NewManagerWith(t, pluginmanager.Options{}, map[string]pluginmanager.Handler{typ: h})
	pm.Timeout = testenv.Timeout
	return &harness{Manager: pm, t: t, m: pm.Manager(), dir: pm.Dir}
}

// statuses returns an OnStatus callback and the channel it feeds.
func statuses() (func(plugin.Status), <-chan plugin.Status) {
	c := make(chan plugin.Status, 100)
	return func(st plugin.Status) { c <- st }, c
}

// waitStatus waits for the plugin's next status from the manager.
func waitStatus(t *testing.T, c <-chan plugin.Status) plugin.Status {
	t.Helper()
	select {
	case st := <-c:
		return st
	case <-time.After(testenv.Timeout):
		t.Fatal("timed out waiting for the manager to notify the plugin")
		return plugin.Status{}
	}
}
