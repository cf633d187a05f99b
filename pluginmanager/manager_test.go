package pluginmanager_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"

	"github.com/plugd/plugd/internal/testenv"
	"github.com/plugd/plugd/plugin"
	"github.com/plugd/plugd/pluginmanager"
	"github.com/plugd/plugd/plugintest"
)

func TestRegister(t *testing.T) {
	rec := plugintest.NewRecorder()
	h := start(t, pluginmanager.Options{}, map[string]pluginmanager.Handler{"CSIPlugin": rec})
	onStatus, got := statuses()
	p := testenv.StartPlugin(t, plugin.Config{Dir: h.dir, Type: "CSIPlugin", Name: "csi.example.com", Versions: []string{"1.0.0"}, OnStatus: onStatus})

	if st := told(t, got); !st.Registered || st.Error != "" {
		t.Fatalf("plugin was told %+v, want registered", st)
	}
	s := h.WaitSocket(p.Path(), pluginmanager.StateRegistered)
	want := pluginmanager.Plugin{Type: "CSIPlugin", Name: "csi.example.com", Endpoint: p.Path(), Versions: []string{"1.0.0"}, Socket: p.Path()}
	if !equalPlugin(s.Plugin, want) {
		t.Errorf("status plugin = %+v, want %+v", s.Plugin, want)
	}
	if s.Attempts != 1 || s.LastError != "" || s.RegisteredSince.IsZero() || !s.Newest {
		t.Errorf("status = %+v, want 1 attempt, no error, registered since set, newest", s)
	}
	if got := calls(rec); !slices.Equal(got, []string{"validate csi.example.com", "register csi.example.com"}) {
		t.Errorf("handler calls = %q", got)
	}
	if rp, _ := rec.Holds(p.Path()); !equalPlugin(rp, want) {
		t.Errorf("handler was given %+v, want %+v", rp, want)
	}
	if n := p.Notifications(); n != 1 {
		t.Errorf("plugin was notified %d times, want 1", n)
	}
}

func equalPlugin(a, b pluginmanager.Plugin) bool {
	return a.Type == b.Type && a.Name == b.Name && a.Endpoint == b.Endpoint && a.Socket == b.Socket && slices.Equal(a.Versions, b.Versions)
}

func TestEndpointIsKept(t *testing.T) {
	rec := plugintest.NewRecorder()
	h := start(t, pluginmanager.Options{}, map[string]pluginmanager.Handler{"DRAPlugin": rec})
	p := testenv.StartPlugin(t, plugin.Config{Dir: h.dir, Type: "DRAPlugin", Name: "dra.example.com", Endpoint: "/run/dra/dra.sock", Versions: []string{"v1.DRAPlugin"}})
	if s := h.WaitSocket(p.Path(), pluginmanager.StateRegistered); s.Endpoint != "/run/dra/dra.sock" {
		t.Errorf("endpoint = %q, want the one the plugin sent", s.Endpoint)
	}
}

func TestDeregisterOnRemoval(t *testing.T) {
	rec := plugintest.NewRecorder()
	h := start(t, pluginmanager.Options{}, map[string]pluginmanager.Handler{"CSIPlugin": rec})
	p := testenv.StartPlugin(t, plugin.Config{Dir: h.dir, Type: "CSIPlugin", Name: "a"})
	h.WaitSocket(p.Path(), pluginmanager.StateRegistered)

	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	h.WaitGone(p.Path())
	if got := calls(rec); !slices.Equal(got, []string{"validate a", "register a", "deregister a"}) {
		t.Errorf("handler calls = %q", got)
	}
}

func TestReregisterWhenRecreated(t *testing.T) {
	rec := plugintest.NewRecorder()
	h := start(t, pluginmanager.Options{}, map[string]pluginmanager.Handler{"CSIPlugin": rec})
	cfg := plugin.Config{Dir: h.dir, Socket: "a.sock", Type: "CSIPlugin", Name: "a"}
	first := testenv.StartPlugin(t, cfg)
	h.WaitSocket(first.Path(), pluginmanager.StateRegistered)

	// A restarted plugin removes its old socket and listens anew at the same
	// path (the SDK refuses to take the path of a live one).
	if err := os.Remove(first.Path()); err != nil {
		t.Fatal(err)
	}
	onStatus, got := statuses()
	cfg.OnStatus = onStatus
	second := testenv.StartPlugin(t, cfg)
	if st := told(t, got); !st.Registered {
		t.Fatalf("re-created plugin was told %+v", st)
	}
	rec.WaitCalls(t, "register", "a", 2)
	if got := calls(rec); !slices.Equal(got, []string{"validate a", "register a", "deregister a", "validate a", "register a"}) {
		t.Errorf("handler calls = %q, want the old registration taken back before the new one", got)
	}
	if s := h.WaitSocket(second.Path(), pluginmanager.StateRegistered); s.Attempts != 1 {
		t.Errorf("attempts = %d, want a fresh count for the new socket", s.Attempts)
	}
}

func TestSubdirectoryCreatedAfterStart(t *testing.T) {
	rec := plugintest.NewRecorder()
	h := start(t, pluginmanager.Options{}, map[string]pluginmanager.Handler{"CSIPlugin": rec})
	<-h.m.Synced() // so the subdirectory is found by its watch event, not the first walk
	sub := filepath.Join(h.dir, "sub", "deeper")
	if err := os.MkdirAll(sub, 0o750); err != nil {
		t.Fatal(err)
	}
	p := testenv.StartPlugin(t, plugin.Config{Dir: sub, Type: "CSIPlugin", Name: "nested"})
	h.WaitSocket(p.Path(), pluginmanager.StateRegistered)

	// And removing the whole directory deregisters what was in it.
	if err := os.RemoveAll(filepath.Join(h.dir, "sub")); err != nil {
		t.Fatal(err)
	}
	h.WaitGone(p.Path())
	rec.WaitCalls(t, "deregister", "nested", 1)
}

func TestIgnoresHiddenNonSocketsAndSymlinks(t *testing.T) {
	dir := testenv.ShortDir(t, "pm")
	rec := plugintest.NewRecorder()
	// Some are there before the manager starts, some appear after.
	ignored := func(tag string) {
		if err := os.WriteFile(filepath.Join(dir, tag+"-file.sock"), nil, 0o600); err != nil {
			t.Fatal(err)
		}
		// The SDK refuses dot-names, so serve this one by hand.
		serveRaw(t, filepath.Join(dir, "."+tag+"-hidden.sock"), func(s *grpc.Server) {
			registerapi.RegisterRegistrationServer(s, &fixedInfo{info: &registerapi.PluginInfo{Type: "CSIPlugin", Name: "hidden-" + tag}, status: make(chan *registerapi.RegistrationStatus, 10)})
		})
		if err := os.Mkdir(filepath.Join(dir, "."+tag+"-dir"), 0o750); err != nil {
			t.Fatal(err)
		}
		testenv.StartPlugin(t, plugin.Config{Dir: filepath.Join(dir, "."+tag+"-dir"), Type: "CSIPlugin", Name: "in-hidden-dir-" + tag})
		// A symlink to a socket outside the directory, and to a directory outside it.
		outside := testenv.ShortDir(t, "pm")
		out := testenv.StartPlugin(t, plugin.Config{Dir: outside, Type: "CSIPlugin", Name: "outside-" + tag})
		if err := os.Symlink(out.Path(), filepath.Join(dir, tag+"-link.sock")); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(outside, filepath.Join(dir, tag+"-linkdir")); err != nil {
			t.Fatal(err)
		}
	}
	ignored("before")
	h := start(t, pluginmanager.Options{Dir: dir}, map[string]pluginmanager.Handler{"CSIPlugin": rec})
	ignored("after")
	// Events are handled in order, so once a plugin created last is registered,
	// everything created before it has been looked at.
	last := testenv.StartPlugin(t, plugin.Config{Dir: dir, Type: "CSIPlugin", Name: "real"})
	h.WaitSocket(last.Path(), pluginmanager.StateRegistered)

	if ps := h.m.Plugins(); len(ps) != 1 {
		t.Errorf("plugins = %+v, want only the real one", ps)
	}
	if got := calls(rec); !slices.Equal(got, []string{"validate real", "register real"}) {
		t.Errorf("handler calls = %q", got)
	}
}

func TestStaleSocketRetriedThenRegistered(t *testing.T) {
	rec := plugintest.NewRecorder()
	clk := fakeClock()
	h := start(t, pluginmanager.Options{BackoffInitial: 20 * time.Millisecond, BackoffMax: 80 * time.Millisecond, Clock: clk},
		map[string]pluginmanager.Handler{"CSIPlugin": rec})
	path := filepath.Join(h.dir, "crashed.sock")
	made := time.Now()
	testenv.DeadSocket(t, path)

	// The first attempt connects again a few times over some 15ms, and
	// then quietly for a couple of seconds, before the refusal counts (a
	// socket that refuses just after it appeared is likely not listening
	// yet). Then it is retried with doubling delays (±20%), up to the cap,
	// each exactly when due.
	clk.Step(pastBindGrace)
	want := []struct{ lo, hi time.Duration }{{16, 24}, {32, 48}, {64, 80}, {64, 80}}
	for i, w := range want {
		ev := h.WaitEvent(path, pluginmanager.EventFailed)
		if i == 0 {
			if took := time.Since(made); took < 15*time.Millisecond {
				t.Errorf("the first attempt failed %s after the socket appeared, want its refused dial retried for 15ms first", took)
			}
		}
		if ev.Reason != pluginmanager.ReasonDial || ev.State != pluginmanager.StateStale || !strings.Contains(ev.Error, "connection refused") || ev.Attempt != i+1 {
			t.Errorf("failure %d = %s %s %q (attempt %d), want a refused dial, Stale", i+1, ev.Reason, ev.State, ev.Error, ev.Attempt)
		}
		if d := ev.NextRetry.Sub(ev.Time); d < w.lo*time.Millisecond || d > w.hi*time.Millisecond {
			t.Errorf("retry delay %d = %s, want within [%dms, %dms]", i+1, d, w.lo, w.hi)
		}
		clk.SetTime(ev.NextRetry)
	}

	// The plugin comes back: it replaces the stale socket and is registered at once.
	onStatus, got := statuses()
	testenv.StartPlugin(t, plugin.Config{Dir: h.dir, Socket: "crashed.sock", Type: "CSIPlugin", Name: "back", OnStatus: onStatus})
	if st := told(t, got); !st.Registered {
		t.Fatalf("told %+v", st)
	}
	if s := h.WaitSocket(path, pluginmanager.StateRegistered); s.Attempts != 1 {
		t.Errorf("attempts = %d, want 1: a new socket starts without the old one's backoff", s.Attempts)
	}
}

func TestNoHandlerRejectedUntilAddHandler(t *testing.T) {
	h := start(t, pluginmanager.Options{}, nil)
	onStatus, got := statuses()
	p := testenv.StartPlugin(t, plugin.Config{Dir: h.dir, Type: "example.com/Widget", Name: "w", OnStatus: onStatus})

	st := told(t, got)
	if st.Registered || !strings.Contains(st.Error, "no handler") || !strings.Contains(st.Error, "example.com/Widget") {
		t.Fatalf("plugin was told %+v, want not registered, no handler for its type", st)
	}
	s := h.WaitSocket(p.Path(), pluginmanager.StateRejected)
	if s.Reason != pluginmanager.ReasonNoHandler || s.Type != "example.com/Widget" || !s.NextRetry.IsZero() {
		t.Errorf("status = %+v", s)
	}

	rec := plugintest.NewRecorder()
	h.m.AddHandler("example.com/Widget", rec)
	if st := told(t, got); !st.Registered {
		t.Fatalf("after AddHandler plugin was told %+v", st)
	}
	if s := h.WaitSocket(p.Path(), pluginmanager.StateRegistered); s.Attempts != 2 {
		t.Errorf("attempts = %d, want 2", s.Attempts)
	}
}

func TestValidationRefusedIsRejected(t *testing.T) {
	rec := plugintest.NewRecorder()
	rec.RefuseValidate("bad", errors.New("version 0.3 is not supported"))
	h := start(t, pluginmanager.Options{BackoffInitial: time.Millisecond, BackoffMax: time.Millisecond},
		map[string]pluginmanager.Handler{"CSIPlugin": rec})
	onStatus, got := statuses()
	bad := testenv.StartPlugin(t, plugin.Config{Dir: h.dir, Type: "CSIPlugin", Name: "bad", OnStatus: onStatus})
	if st := told(t, got); st.Registered || !strings.Contains(st.Error, "version 0.3 is not supported") {
		t.Fatalf("told %+v", st)
	}
	s := h.WaitSocket(bad.Path(), pluginmanager.StateRejected)
	if s.Reason != pluginmanager.ReasonValidate {
		t.Errorf("reason = %s", s.Reason)
	}
	// With a 1ms backoff, a wrongly retried rejection would have been tried many
	// times by the time a later plugin is through.
	good := testenv.StartPlugin(t, plugin.Config{Dir: h.dir, Type: "CSIPlugin", Name: "good"})
	h.WaitSocket(good.Path(), pluginmanager.StateRegistered)
	if n := rec.Count("validate", "bad"); n != 1 {
		t.Errorf("validated %d times, want once", n)
	}
	if n := bad.Notifications(); n != 1 {
		t.Errorf("rejected plugin was notified %d times, want once", n)
	}
}

func TestRegisterFailureRetried(t *testing.T) {
	clk := fakeClock()
	rec := plugintest.NewRecorder()
	rec.FailRegister("flaky", errors.New("backend not ready (1)"))
	h := start(t, pluginmanager.Options{Clock: clk}, map[string]pluginmanager.Handler{"CSIPlugin": rec})
	onStatus, got := statuses()
	p := testenv.StartPlugin(t, plugin.Config{Dir: h.dir, Type: "CSIPlugin", Name: "flaky", OnStatus: onStatus})

	for i := 1; i <= 2; i++ {
		st := told(t, got)
		if st.Registered || st.Error != fmt.Sprintf("backend not ready (%d)", i) {
			t.Fatalf("notification %d = %+v, want a failure", i, st)
		}
		ev := h.WaitEvent(p.Path(), pluginmanager.EventFailed)
		if ev.Reason != pluginmanager.ReasonRegister || !ev.NextRetry.After(ev.Time) {
			t.Fatalf("failure %d = %+v, want the register step, retried later", i, ev)
		}
		if i == 1 {
			rec.FailRegister("flaky", errors.New("backend not ready (2)"))
		} else {
			rec.FailRegister("flaky", nil)
		}
		clk.SetTime(ev.NextRetry) // the retry is due: exactly then
	}
	if st := told(t, got); !st.Registered {
		t.Fatalf("third notification = %+v, want registered", st)
	}
	if s := h.WaitSocket(p.Path(), pluginmanager.StateRegistered); s.Attempts != 3 {
		t.Errorf("attempts = %d, want 3", s.Attempts)
	}
	// The failed attempts never reached the handler's registered set.
	if rec.Count("deregister", "flaky") != 0 {
		t.Errorf("calls = %q", calls(rec))
	}
}

func TestRegisterTerminalErrorRejects(t *testing.T) {
	rec := plugintest.NewRecorder()
	rec.FailRegister("x", pluginmanager.TerminalError(errors.New("license refused")))
	h := start(t, pluginmanager.Options{}, map[string]pluginmanager.Handler{"CSIPlugin": rec})
	p := testenv.StartPlugin(t, plugin.Config{Dir: h.dir, Type: "CSIPlugin", Name: "x"})
	s := h.WaitSocket(p.Path(), pluginmanager.StateRejected)
	if s.Reason != pluginmanager.ReasonRegister || s.LastError != "license refused" {
		t.Errorf("status = %+v", s)
	}
}

// blockingInfo is a Registration server whose GetInfo never answers.
type blockingInfo struct {
	registerapi.UnimplementedRegistrationServer
	entered chan struct{}
}

func (b *blockingInfo) GetInfo(ctx context.Context, _ *registerapi.InfoRequest) (*registerapi.PluginInfo, error) {
	b.entered <- struct{}{}
	<-ctx.Done()
	return nil, ctx.Err()
}

func TestHangingGetInfoDoesNotDelayOthers(t *testing.T) {
	rec := plugintest.NewRecorder()
	h := start(t, pluginmanager.Options{GetInfoTimeout: 2 * time.Second, Workers: 2},
		map[string]pluginmanager.Handler{"CSIPlugin": rec})
	hang := &blockingInfo{entered: make(chan struct{}, 10)}
	path := filepath.Join(h.dir, "hang.sock")
	serveRaw(t, path, func(s *grpc.Server) { registerapi.RegisterRegistrationServer(s, hang) })
	select {
	case <-hang.entered:
	case <-time.After(testenv.Timeout):
		t.Fatal("GetInfo was never called")
	}

	// While it hangs, another plugin registers.
	other := testenv.StartPlugin(t, plugin.Config{Dir: h.dir, Type: "CSIPlugin", Name: "other"})
	h.WaitSocket(other.Path(), pluginmanager.StateRegistered)
	for _, s := range h.m.Plugins() {
		if s.Socket == path && s.State != pluginmanager.StateRegistering {
			t.Errorf("hanging plugin is %s before its deadline; the test needs it still waiting", s.State)
		}
	}

	s := h.WaitSocket(path, pluginmanager.StateFailed)
	if s.Reason != pluginmanager.ReasonGetInfo || !strings.Contains(s.LastError, "no answer within 2s") {
		t.Errorf("status = %s %q, want GetInfo given up at its deadline", s.Reason, s.LastError)
	}
}

func TestNotServingRegistrationIsRejected(t *testing.T) {
	h := start(t, pluginmanager.Options{}, map[string]pluginmanager.Handler{"CSIPlugin": plugintest.NewRecorder()})
	path := filepath.Join(h.dir, "other-service.sock")
	serveRaw(t, path, nil) // a gRPC server, but not a plugin
	s := h.WaitSocket(path, pluginmanager.StateRejected)
	if s.Reason != pluginmanager.ReasonGetInfo || !strings.Contains(s.LastError, "Unimplemented") {
		t.Errorf("status = %s %q", s.Reason, s.LastError)
	}
}

// fixedInfo is a Registration server answering GetInfo with whatever it is given.
type fixedInfo struct {
	registerapi.UnimplementedRegistrationServer
	info   *registerapi.PluginInfo
	status chan *registerapi.RegistrationStatus
}

func (f *fixedInfo) GetInfo(context.Context, *registerapi.InfoRequest) (*registerapi.PluginInfo, error) {
	return f.info, nil
}

func (f *fixedInfo) NotifyRegistrationStatus(_ context.Context, s *registerapi.RegistrationStatus) (*registerapi.RegistrationStatusResponse, error) {
	f.status <- s
	return &registerapi.RegistrationStatusResponse{}, nil
}

func TestMalformedInfoRejected(t *testing.T) {
	for _, tc := range []struct {
		name string
		info *registerapi.PluginInfo
		want string
	}{
		{"empty name", &registerapi.PluginInfo{Type: "CSIPlugin"}, "name is empty"},
		{"empty type", &registerapi.PluginInfo{Name: "x"}, "type is empty"},
		{"long name", &registerapi.PluginInfo{Type: "CSIPlugin", Name: strings.Repeat("n", 300)}, "name is 300 bytes long"},
		{"control character", &registerapi.PluginInfo{Type: "CSIPlugin", Name: "a\x1bb"}, "not printable"},
		{"too many versions", &registerapi.PluginInfo{Type: "CSIPlugin", Name: "x", SupportedVersions: make([]string, 100)}, "100 supported versions"},
		{"huge answer", &registerapi.PluginInfo{Type: "CSIPlugin", Name: "x", Endpoint: strings.Repeat("e", 1<<20)}, "ResourceExhausted"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := start(t, pluginmanager.Options{}, map[string]pluginmanager.Handler{"CSIPlugin": plugintest.NewRecorder()})
			srv := &fixedInfo{info: tc.info, status: make(chan *registerapi.RegistrationStatus, 10)}
			path := filepath.Join(h.dir, "bad.sock")
			serveRaw(t, path, func(s *grpc.Server) { registerapi.RegisterRegistrationServer(s, srv) })
			var s pluginmanager.PluginStatus
			h.Until("a verdict", func(ps []pluginmanager.PluginStatus) bool {
				for _, p := range ps {
					// A dial refused between the bind and the listen of the raw
					// server is retried at once; wait for the verdict on the answer.
					if p.Socket == path && p.Reason != pluginmanager.ReasonDial &&
						(p.State == pluginmanager.StateRejected || p.State == pluginmanager.StateFailed) {
						s = p
						return true
					}
				}
				return false
			})
			if !strings.Contains(s.LastError, tc.want) {
				t.Errorf("error = %q, want it to say %q", s.LastError, tc.want)
			}
			if s.Reason == pluginmanager.ReasonInvalidInfo {
				if s.State != pluginmanager.StateRejected {
					t.Errorf("state = %s, want Rejected", s.State)
				}
				select {
				case st := <-srv.status:
					if st.PluginRegistered || !strings.Contains(st.Error, tc.want) {
						t.Errorf("plugin told %+v", st)
					}
				case <-time.After(testenv.Timeout):
					t.Error("plugin was not told why it was refused")
				}
			}
		})
	}
}

func TestHandlerBlocksOrPanics(t *testing.T) {
	release := make(chan struct{})
	var mu sync.Mutex
	calls := map[string]int{}
	handler := pluginmanager.HandlerFuncs{
		RegisterFunc: func(ctx context.Context, p pluginmanager.Plugin) error {
			mu.Lock()
			calls[p.Name]++
			n := calls[p.Name]
			mu.Unlock()
			switch {
			case p.Name == "blocks" && n == 1:
				<-release // ignores its context, as a broken handler does
			case p.Name == "panics" && n == 1:
				panic("handler bug")
			}
			return nil
		},
	}
	h := start(t, pluginmanager.Options{HandlerTimeout: 200 * time.Millisecond}, map[string]pluginmanager.Handler{"CSIPlugin": handler})
	t.Cleanup(func() {
		select {
		case <-release:
		default:
			close(release)
		}
	})

	blocks := testenv.StartPlugin(t, plugin.Config{Dir: h.dir, Type: "CSIPlugin", Name: "blocks"})
	panics := testenv.StartPlugin(t, plugin.Config{Dir: h.dir, Type: "CSIPlugin", Name: "panics"})
	fine := testenv.StartPlugin(t, plugin.Config{Dir: h.dir, Type: "CSIPlugin", Name: "fine"})

	h.WaitSocket(fine.Path(), pluginmanager.StateRegistered)
	s := h.WaitSocket(blocks.Path(), pluginmanager.StateFailed)
	if s.Reason != pluginmanager.ReasonRegister || !strings.Contains(s.LastError, "did not return within 200ms") {
		t.Errorf("blocking handler: %s %q", s.Reason, s.LastError)
	}
	// The panic is recovered, reported, and the retry succeeds.
	h.WaitSocket(panics.Path(), pluginmanager.StateRegistered)

	// Not called again while the abandoned call still runs; once it returns,
	// the socket is retried and registers.
	close(release)
	h.WaitSocket(blocks.Path(), pluginmanager.StateRegistered)
	mu.Lock()
	defer mu.Unlock()
	if calls["blocks"] != 2 || calls["panics"] != 2 {
		t.Errorf("register calls = %v, want 2 each", calls)
	}
}

func TestPanicIsReported(t *testing.T) {
	handler := pluginmanager.HandlerFuncs{
		ValidateFunc: func(context.Context, pluginmanager.Plugin) error { panic("boom") },
	}
	h := start(t, pluginmanager.Options{}, map[string]pluginmanager.Handler{"CSIPlugin": handler})
	p := testenv.StartPlugin(t, plugin.Config{Dir: h.dir, Type: "CSIPlugin", Name: "x"})
	s := h.WaitSocket(p.Path(), pluginmanager.StateFailed)
	if s.Reason != pluginmanager.ReasonValidate || !strings.Contains(s.LastError, "handler Validate panicked: boom") {
		t.Errorf("status = %s %q, want a retried panic", s.Reason, s.LastError)
	}
}

// TestNotifyRedialsAfterSlowHandler: the plugin's connection dies while the
// handler works; the notification must still arrive.
func TestNotifyRedialsAfterSlowHandler(t *testing.T) {
	var (
		mu    sync.Mutex
		conns []net.Conn
	)
	srv := &fixedInfo{info: &registerapi.PluginInfo{Type: "CSIPlugin", Name: "x"}, status: make(chan *registerapi.RegistrationStatus, 10)}
	handler := pluginmanager.HandlerFuncs{
		RegisterFunc: func(context.Context, pluginmanager.Plugin) error {
			// Cut every connection the plugin has accepted so far.
			mu.Lock()
			defer mu.Unlock()
			for _, c := range conns {
				c.Close()
			}
			return nil
		},
	}
	h := start(t, pluginmanager.Options{}, map[string]pluginmanager.Handler{"CSIPlugin": handler})
	path := filepath.Join(h.dir, "x.sock")
	l := testenv.ListenUnix(t, path)
	gs := grpc.NewServer()
	registerapi.RegisterRegistrationServer(gs, srv)
	served := make(chan struct{})
	go func() {
		defer close(served)
		gs.Serve(recordingListener{l, func(c net.Conn) { mu.Lock(); conns = append(conns, c); mu.Unlock() }})
	}()
	t.Cleanup(func() { gs.Stop(); <-served })

	select {
	case st := <-srv.status:
		if !st.PluginRegistered {
			t.Fatalf("told %+v", st)
		}
	case <-time.After(testenv.Timeout):
		t.Fatal("plugin never told it was registered")
	}
	if s := h.WaitSocket(path, pluginmanager.StateRegistered); s.LastError != "" {
		t.Errorf("registered with error %q", s.LastError)
	}
}

type recordingListener struct {
	net.Listener
	accepted func(net.Conn)
}

func (l recordingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.accepted(c)
	}
	return c, err
}

func TestSeveralInstancesOfOnePlugin(t *testing.T) {
	rec := plugintest.NewRecorder()
	h := start(t, pluginmanager.Options{}, map[string]pluginmanager.Handler{"DRAPlugin": rec})
	old := testenv.StartPlugin(t, plugin.Config{Dir: h.dir, Socket: "dra-old.sock", Type: "DRAPlugin", Name: "dra.example.com"})
	h.WaitSocket(old.Path(), pluginmanager.StateRegistered)
	newer := testenv.StartPlugin(t, plugin.Config{Dir: h.dir, Socket: "dra-new.sock", Type: "DRAPlugin", Name: "dra.example.com"})
	h.WaitSocket(newer.Path(), pluginmanager.StateRegistered)

	for _, s := range h.m.Plugins() {
		if want := s.Socket == newer.Path(); s.Newest != want {
			t.Errorf("%s: newest = %v, want %v", filepath.Base(s.Socket), s.Newest, want)
		}
	}
	// Removing the old instance leaves the new one registered.
	old.Close()
	h.WaitGone(old.Path())
	if s := h.WaitSocket(newer.Path(), pluginmanager.StateRegistered); !s.Newest {
		t.Errorf("remaining instance not newest: %+v", s)
	}
	if rec.Count("register", "dra.example.com") != 2 || rec.Count("deregister", "dra.example.com") != 1 {
		t.Errorf("calls = %q", calls(rec))
	}
}

func TestChmodIsNotANewSocket(t *testing.T) {
	rec := plugintest.NewRecorder()
	h := start(t, pluginmanager.Options{ResyncInterval: 50 * time.Millisecond}, map[string]pluginmanager.Handler{"CSIPlugin": rec})
	p := testenv.StartPlugin(t, plugin.Config{Dir: h.dir, Type: "CSIPlugin", Name: "x"})
	h.WaitSocket(p.Path(), pluginmanager.StateRegistered)
	if err := os.Chmod(p.Path(), 0o600); err != nil {
		t.Fatal(err)
	}
	// Let several resyncs pass (each one would see a changed identity), marked
	// by a plugin registered after them.
	for i := range 3 {
		q := testenv.StartPlugin(t, plugin.Config{Dir: h.dir, Type: "CSIPlugin", Name: fmt.Sprint("marker", i)})
		h.WaitSocket(q.Path(), pluginmanager.StateRegistered)
	}
	if n := rec.Count("register", "x"); n != 1 {
		t.Errorf("registered %d times after a chmod, want once", n)
	}
}

func TestBurstOf1000(t *testing.T) {
	if testing.Short() {
		t.Skip("1000 plugins")
	}
	const n = 1000
	rec := plugintest.NewRecorder()
	h := start(t, pluginmanager.Options{}, map[string]pluginmanager.Handler{"CSIPlugin": rec})
	begin := time.Now()
	servers := make([]*plugin.Server, n)
	for i := range n {
		servers[i] = testenv.StartPlugin(t, plugin.Config{Dir: h.dir, Type: "CSIPlugin", Name: fmt.Sprintf("p%04d", i)})
	}
	h.Until("all registered", func(ps []pluginmanager.PluginStatus) bool {
		registered := 0
		for _, p := range ps {
			if p.State == pluginmanager.StateRegistered {
				registered++
			}
		}
		return registered == n
	})
	t.Logf("%d plugins registered %s after the first socket appeared", n, time.Since(begin))
	for _, s := range servers {
		if !s.Registered() || s.Notifications() != 1 {
			t.Fatalf("%s: registered=%v after %d notifications, want told once", s.Path(), s.Registered(), s.Notifications())
		}
	}
	if got := len(calls(rec)); got != 2*n {
		t.Errorf("%d handler calls, want %d", got, 2*n)
	}
}
