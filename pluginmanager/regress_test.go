package pluginmanager_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"

	"github.com/plugd/plugd/internal/testenv"
	"github.com/plugd/plugd/plugin"
	"github.com/plugd/plugd/pluginmanager"
	"github.com/plugd/plugd/plugintest"
)

// slowNotify answers GetInfo, and blocks NotifyRegistrationStatus until released.
type slowNotify struct {
	registerapi.UnimplementedRegistrationServer
	typ     string
	entered chan bool
	release chan struct{}
	once    sync.Once
}

func (s *slowNotify) GetInfo(context.Context, *registerapi.InfoRequest) (*registerapi.PluginInfo, error) {
	return &registerapi.PluginInfo{Type: s.typ, Name: "w"}, nil
}

func (s *slowNotify) NotifyRegistrationStatus(ctx context.Context, r *registerapi.RegistrationStatus) (*registerapi.RegistrationStatusResponse, error) {
	s.entered <- r.PluginRegistered
	first := false
	s.once.Do(func() { first = true })
	if first {
		<-s.release
	}
	return &registerapi.RegistrationStatusResponse{}, nil
}

// AddHandler while an attempt is refusing the plugin for want of a handler
// must not be lost: the plugin registers once the refusal is through.
func TestAddHandlerDuringRefusal(t *testing.T) {
	h := start(t, pluginmanager.Options{ResyncInterval: 100 * time.Millisecond}, nil)
	srv := &slowNotify{typ: "X", entered: make(chan bool, 10), release: make(chan struct{})}
	path := filepath.Join(h.dir, "x.sock")
	serveRaw(t, path, func(s *grpc.Server) { registerapi.RegisterRegistrationServer(s, srv) })
	if reg := <-srv.entered; reg {
		t.Fatal("expected a refusal first")
	}
	// The worker is between its handler lookup and fail(): state is Registering.
	h.m.AddHandler("X", pluginmanager.HandlerFuncs{})
	close(srv.release)
	h.WaitSocket(path, pluginmanager.StateRegistered)
}

// A Register abandoned at its deadline may succeed late; the retry must take
// it back (Deregister) before registering again, or a handler that refuses
// duplicates, as the kubelet's CSI handler does, would reject the plugin it
// holds.
func TestRetryAfterRegisterTimeoutDeregistersFirst(t *testing.T) {
	var mu sync.Mutex
	held := map[string]bool{}
	var calls []string
	release := make(chan struct{})
	n := 0
	handler := pluginmanager.HandlerFuncs{
		ValidateFunc: func(_ context.Context, p pluginmanager.Plugin) error {
			mu.Lock()
			defer mu.Unlock()
			calls = append(calls, "validate")
			if held[p.Name] {
				return errors.New("already registered")
			}
			return nil
		},
		RegisterFunc: func(_ context.Context, p pluginmanager.Plugin) error {
			mu.Lock()
			n++
			first := n == 1
			calls = append(calls, "register")
			mu.Unlock()
			if first {
				<-release // slow, then succeeds
			}
			mu.Lock()
			held[p.Name] = true
			mu.Unlock()
			return nil
		},
		DeregisterFunc: func(_ context.Context, p pluginmanager.Plugin) {
			mu.Lock()
			defer mu.Unlock()
			calls = append(calls, "deregister")
			delete(held, p.Name)
		},
	}
	h := start(t, pluginmanager.Options{HandlerTimeout: 100 * time.Millisecond}, map[string]pluginmanager.Handler{"CSIPlugin": handler})
	onStatus, got := statuses()
	p := testenv.StartPlugin(t, plugin.Config{Dir: h.dir, Type: "CSIPlugin", Name: "slow", OnStatus: onStatus})
	h.WaitSocket(p.Path(), pluginmanager.StateFailed)
	told(t, got) // false: timed out
	close(release)
	s := h.Until("a verdict after the late success", func(ps []pluginmanager.PluginStatus) bool {
		for _, x := range ps {
			if x.Socket == p.Path() && (x.State == pluginmanager.StateRegistered || x.State == pluginmanager.StateRejected) {
				return true
			}
		}
		return false
	})
	mu.Lock()
	defer mu.Unlock()
	if s[0].State != pluginmanager.StateRegistered {
		t.Errorf("plugin the handler holds ended %s (%s): calls %q", s[0].State, s[0].LastError, calls)
	}
	// The late Register may land before or after the retry's Deregister; what
	// matters is that no Register follows another without a Deregister between.
	for i := 1; i < len(calls); i++ {
		if calls[i] == "register" && slices.Contains(calls[:i], "register") && !slices.Contains(calls[:i], "deregister") {
			t.Errorf("second Register without a Deregister before it: %q", calls)
		}
	}
}

// A long refusal reason is cut to a bound; cut mid-character it would not be
// valid UTF-8, the notification could not be sent, and the plugin would never
// hear why it was refused.
func TestLongReasonIsCutCleanly(t *testing.T) {
	reason := "x" + strings.Repeat("é", 700)
	h := start(t, pluginmanager.Options{}, map[string]pluginmanager.Handler{"CSIPlugin": pluginmanager.HandlerFuncs{
		ValidateFunc: func(context.Context, pluginmanager.Plugin) error { return errors.New(reason) },
	}})
	onStatus, got := statuses()
	p := testenv.StartPlugin(t, plugin.Config{Dir: h.dir, Type: "CSIPlugin", Name: "u", OnStatus: onStatus})
	h.WaitSocket(p.Path(), pluginmanager.StateRejected)
	st := told(t, got)
	if st.Registered || !strings.HasPrefix(st.Error, "xéé") || len(st.Error) > 1024 || !utf8.ValidString(st.Error) {
		t.Errorf("told registered=%v, %d bytes of reason, valid UTF-8: %v", st.Registered, len(st.Error), utf8.ValidString(st.Error))
	}
}

// A registry directory that is a symlink is followed (it is the operator's
// choice), for the first walk as for the watch.
func TestRegistryDirIsASymlink(t *testing.T) {
	real := testenv.ShortDir(t, "pm")
	link := filepath.Join(testenv.ShortDir(t, "pm"), "l")
	if err := os.Symlink(real, link); err != nil {
		t.Fatal(err)
	}
	testenv.StartPlugin(t, plugin.Config{Dir: real, Type: "CSIPlugin", Name: "pre"})
	h := start(t, pluginmanager.Options{Dir: link}, map[string]pluginmanager.Handler{"CSIPlugin": plugintest.NewRecorder()})
	q := testenv.StartPlugin(t, plugin.Config{Dir: link, Type: "CSIPlugin", Name: "post"})
	h.WaitSocket(q.Path(), pluginmanager.StateRegistered)
	h.WaitSocket(filepath.Join(link, "pre.sock"), pluginmanager.StateRegistered)
}

// Once Synced is closed, every socket present at start is in Plugins.
func TestSyncedMeansKnown(t *testing.T) {
	dir := testenv.ShortDir(t, "pm")
	for i := range 50 {
		testenv.StartPlugin(t, plugin.Config{Dir: dir, Type: "CSIPlugin", Name: fmt.Sprint("s", i)})
	}
	h := start(t, pluginmanager.Options{Dir: dir, Workers: 1}, map[string]pluginmanager.Handler{"CSIPlugin": plugintest.NewRecorder()})
	<-h.m.Synced()
	if n := len(h.m.Plugins()); n != 50 {
		t.Errorf("after Synced, Plugins() knows %d of 50 sockets", n)
	}
}

// DeregisterOnShutdown with a hung Deregister: shutdown takes a bounded time,
// not one HandlerTimeout per plugin.
func TestShutdownDeregistersInParallel(t *testing.T) {
	dir := testenv.ShortDir(t, "pm")
	block := make(chan struct{})
	defer close(block)
	m, err := pluginmanager.New(pluginmanager.Options{Dir: dir, DeregisterOnShutdown: true, HandlerTimeout: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	m.AddHandler("CSIPlugin", pluginmanager.HandlerFuncs{DeregisterFunc: func(context.Context, pluginmanager.Plugin) { <-block }})
	var ps []*plugin.Server
	for i := range 10 {
		ps = append(ps, testenv.StartPlugin(t, plugin.Config{Dir: dir, Type: "CSIPlugin", Name: fmt.Sprint("d", i)}))
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- m.Run(ctx) }()
	for _, p := range ps {
		if err := p.WaitRegistered(ctx); err != nil {
			t.Fatal(err)
		}
	}
	begin := time.Now()
	cancel()
	<-done
	d := time.Since(begin)
	if d > time.Second {
		t.Errorf("shutdown took %s: deregistrations are sequential", d)
	}
}

// Text a plugin controls never reaches the status raw: not its GetInfo error
// (escape sequences, newlines, any length), not a socket name with control
// characters (ignored).
func TestPluginTextIsMadePrintable(t *testing.T) {
	h := start(t, pluginmanager.Options{}, map[string]pluginmanager.Handler{"CSIPlugin": plugintest.NewRecorder()})
	evil := "\x1b]0;pwned\x07\x1b[31mred\nsecond line" + strings.Repeat("x", 5000)
	path := filepath.Join(h.dir, "evil.sock")
	serveRaw(t, path, func(s *grpc.Server) { registerapi.RegisterRegistrationServer(s, &failingInfo{msg: evil}) })
	var s pluginmanager.PluginStatus
	h.Until("GetInfo's error recorded", func(ps []pluginmanager.PluginStatus) bool {
		for _, p := range ps {
			if p.Socket == path && p.Reason == pluginmanager.ReasonGetInfo {
				s = p
				return true
			}
		}
		return false
	})
	if strings.ContainsAny(s.LastError, "\x1b\x07\n") || len(s.LastError) > 1024 || !strings.Contains(s.LastError, `\x1b]0;pwned\a\x1b[31mred\nsecond line`) {
		t.Errorf("last error = %q, want it escaped and at most 1024 bytes", s.LastError)
	}

	// A socket whose name has a control character is not picked up at all;
	// one created after it is.
	testenv.StartPlugin(t, plugin.Config{Dir: h.dir, Socket: "bad\x1b[2Jname.sock", Type: "CSIPlugin", Name: "bad"})
	good := testenv.StartPlugin(t, plugin.Config{Dir: h.dir, Type: "CSIPlugin", Name: "good"})
	h.WaitSocket(good.Path(), pluginmanager.StateRegistered)
	for _, p := range h.m.Plugins() {
		if strings.Contains(p.Socket, "\x1b") {
			t.Errorf("a socket with a control character in its name is known: %q", p.Socket)
		}
	}
}

type failingInfo struct {
	registerapi.UnimplementedRegistrationServer
	msg string
}

func (f *failingInfo) GetInfo(context.Context, *registerapi.InfoRequest) (*registerapi.PluginInfo, error) {
	return nil, status.Error(codes.Internal, f.msg)
}

func TestWorldWritableRegistryDirIsRefused(t *testing.T) {
	dir := testenv.ShortDir(t, "ww")
	if err := os.Chmod(dir, 0o777); err != nil {
		t.Fatal(err)
	}
	m, err := pluginmanager.New(pluginmanager.Options{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	err = m.Run(context.Background())
	if err == nil || !strings.Contains(err.Error(), "writable by users other than its owner") || !strings.Contains(err.Error(), "chmod go-w") {
		t.Errorf("Run on a world-writable directory = %v", err)
	}
}

// The registry directory removed and made again: its plugins are let go, and
// plugins in the new one register at once, without waiting for a resync.
func TestRegistryDirRemovedAndRecreated(t *testing.T) {
	rec := plugintest.NewRecorder()
	h := start(t, pluginmanager.Options{ResyncInterval: -1}, map[string]pluginmanager.Handler{"CSIPlugin": rec})
	before := testenv.StartPlugin(t, plugin.Config{Dir: h.dir, Type: "CSIPlugin", Name: "before"})
	h.WaitSocket(before.Path(), pluginmanager.StateRegistered)

	if err := os.RemoveAll(h.dir); err != nil {
		t.Fatal(err)
	}
	h.WaitGone(before.Path())
	rec.WaitCalls(t, "deregister", "before", 1)

	if err := os.Mkdir(h.dir, 0o750); err != nil {
		t.Fatal(err)
	}
	after := testenv.StartPlugin(t, plugin.Config{Dir: h.dir, Type: "CSIPlugin", Name: "after"})
	h.WaitSocket(after.Path(), pluginmanager.StateRegistered)
}
