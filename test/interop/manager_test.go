package interop_test

// The manager itself (pluginmanager, as plugd runs it) registering and
// watching servers of other stacks: what the tests above check of the
// transport, seen where it matters, in what each plugin is told and in the
// manager's states.

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

	testingclock "k8s.io/utils/clock/testing"

	"github.com/plugd/plugd/internal/testenv"
	"github.com/plugd/plugd/pluginmanager"
	"github.com/plugd/plugd/plugintest"
	"github.com/plugd/plugd/test/interop"
)

// managed is a manager, on a fake clock, with a server of stack (and opts)
// registering with it.
type managed struct {
	*plugintest.Manager
	clk      *testingclock.FakeClock
	srv      *interop.Server
	warnings *testenv.Buffer
}

func manage(t *testing.T, stack interop.Stack, opts interop.Options) *managed {
	t.Helper()
	return manageWith(t, stack, opts, pluginmanager.Options{})
}

// manageWith is manage with the manager's options o (its logger and clock
// are the test's).
func manageWith(t *testing.T, stack interop.Stack, opts interop.Options, o pluginmanager.Options) *managed {
	t.Helper()
	log, warnings := testenv.WarnLogger()
	clk := testingclock.NewFakeClock(time.Now())
	o.Logger, o.Clock = log, clk
	m := plugintest.NewManagerWith(t, o, map[string]pluginmanager.Handler{opts.Type: plugintest.NewRecorder()})
	m.Timeout = wait
	opts.Socket = filepath.Join(m.Dir, "plugin.sock")
	srv := interop.Start(t, stack, opts)
	return &managed{Manager: m, clk: clk, srv: srv, warnings: warnings}
}

// registered waits for the plugin to be registered, and checks it was told
// so exactly once.
func (m *managed) registered(t *testing.T) pluginmanager.PluginStatus {
	t.Helper()
	s := m.WaitSocket(m.srv.Socket, pluginmanager.StateRegistered)
	if s.Reason != "" {
		t.Errorf("registered with reason %s: %s", s.Reason, s.LastError)
	}
	m.srv.WaitFor(t, "NotifyRegistrationStatus", 1)
	m.toldOnce(t)
	return s
}

// toldOnce checks the plugin was told, exactly once, that it is registered.
func (m *managed) toldOnce(t *testing.T) {
	t.Helper()
	if told := m.srv.Told(); len(told) != 1 || !told[0].Registered {
		t.Errorf("the %v was told %+v, want registered=true once", m.srv, told)
	}
}

// gone waits for the manager to hear that the plugin went: Unhealthy (its
// socket left behind, nobody listening) or its registration let go (the
// server removed its socket).
func (m *managed) gone(t *testing.T) {
	t.Helper()
	ev := m.WaitEvent(m.srv.Socket, pluginmanager.EventUnhealthy, pluginmanager.EventDeregistered)
	if ev.Type == pluginmanager.EventUnhealthy && ev.State != pluginmanager.StateUnhealthy {
		t.Errorf("event %+v, want Unhealthy", ev)
	}
}

// Each stack's server is registered, told so exactly once, probed (when the
// clock says, and only then), and its death is heard at once, without a
// probe: killed, or stopped gracefully.
func TestManagerRegistersEveryStack(t *testing.T) {
	for _, stack := range interop.Stacks {
		for _, end := range []string{"killed", "stopped"} {
			t.Run(string(stack)+"/"+end, func(t *testing.T) {
				m := manage(t, stack, plugin)
				m.registered(t)
				if n := len(m.srv.Of("GetInfo")); n != 1 {
					t.Errorf("%d GetInfo calls to register, want 1", n)
				}

				m.clk.Step(plugintest.MaxProbeDelay(pluginmanager.DefaultProbeInterval))
				m.srv.WaitFor(t, "GetInfo", 2)
				m.WaitSocket(m.srv.Socket, pluginmanager.StateRegistered)
				m.toldOnce(t)

				if end == "killed" {
					m.srv.Kill(t)
				} else {
					m.srv.Stop(t) // graceful: returns once plugd let its connection go
				}
				m.gone(t)
				m.toldOnce(t)
				if w := m.warnings.String(); strings.Contains(w, "could not") {
					t.Errorf("warnings:\n%s", w)
				}
			})
		}
	}
}

// The raw HTTP/2 server's scenarios, each a behaviour of some real server:
// the plugin registers and is told exactly once whatever the transport had
// to cope with.
func TestManagerRawScenarios(t *testing.T) {
	for _, tc := range []struct {
		scenario string
		check    func(t *testing.T, m *managed)
	}{{
		scenario: interop.TableSizeZero,
		check: func(t *testing.T, m *managed) {
			m.registered(t)
			if n := len(m.srv.Of("compression-error")); n != 0 {
				t.Errorf("%d header blocks without the table size update", n)
			}
		},
	}, {
		scenario: interop.BigTrailers,
		check:    func(t *testing.T, m *managed) { m.registered(t) },
	}, {
		scenario: interop.ForcedGzip,
		check:    func(t *testing.T, m *managed) { m.registered(t) },
	}, {
		scenario: interop.MaxStreamsZero,
		check: func(t *testing.T, m *managed) {
			m.registered(t)
			// The manager's first call on a connection goes with its
			// preface, before the server's SETTINGS could be read: that
			// stream (1) is refused and sent again once allowed. No other
			// is opened before the server allows one.
			refused := m.srv.Of("refused")
			if len(refused) == 0 {
				t.Error("no stream refused: the manager's first call waited for the server's SETTINGS")
			}
			for _, ev := range refused {
				if ev.Message != "stream 1" {
					t.Errorf("%s opened after the client knew the server allowed none", ev.Message)
				}
			}
		},
	}, {
		scenario: interop.Interim103,
		check:    func(t *testing.T, m *managed) { m.registered(t) },
	}, {
		// GOAWAY not covering the first call: asked again on a new
		// connection at once, with no failure recorded.
		scenario: interop.GoAwayError,
		check: func(t *testing.T, m *managed) {
			if s := m.registered(t); s.Attempts != 1 {
				t.Errorf("%d attempts, want 1", s.Attempts)
			}
		},
	}, {
		// Told, then the connection dropped unanswered: told once, not
		// again, and no failure to tell.
		scenario: interop.DropAfterNotify,
		check:    func(t *testing.T, m *managed) { m.registered(t) },
	}, {
		// PINGs on the held connection are answered; it stays held.
		scenario: interop.Ping,
		check: func(t *testing.T, m *managed) {
			m.registered(t)
			m.srv.WaitFor(t, "ping-ack", 5)
			m.WaitSocket(m.srv.Socket, pluginmanager.StateRegistered)
		},
	}, {
		// The server resets every call of the first connection as if
		// plugd broke the protocol: GetInfo is asked again at once on a
		// new connection, over which the plugin is registered and held,
		// with no failure recorded.
		scenario: interop.ResetFirstConn,
		check: func(t *testing.T, m *managed) {
			if s := m.registered(t); s.Attempts != 1 {
				t.Errorf("%d attempts, want 1", s.Attempts)
			}
			if n := len(m.srv.Of("reset")); n != 1 {
				t.Errorf("%d calls reset, want the first only", n)
			}
		},
	}} {
		t.Run(tc.scenario, func(t *testing.T) {
			opts := plugin
			opts.Scenario = tc.scenario
			m := manage(t, interop.Raw, opts)
			tc.check(t, m)
			if w := m.warnings.String(); w != "" {
				t.Errorf("warnings:\n%s", w)
			}
		})
	}
}

// Issue 25, item 6: a server that insists on the HPACK table size update
// in a connection's first header block, even the one sent with the
// preface, is registered, probed and held over one connection, as every
// other plugin is: no call is made with another client on a connection of
// its own (before, grpc-go's, a new one for every call), and its death is
// heard at once, without a probe.
func TestManagerTableSizeStrict(t *testing.T) {
	opts := plugin
	opts.Scenario = interop.TableSizeStrict
	m := manage(t, interop.Raw, opts)
	m.registered(t)
	for i := range 3 {
		// The probe's timer is armed a moment after the state shows
		// Registered: step until the probe has come (a second one is
		// only another probe on the held connection).
		testenv.StepUntil(t, m.clk, plugintest.MaxProbeDelay(pluginmanager.DefaultProbeInterval), "a probe", func() bool {
			return len(m.srv.Of("GetInfo")) >= 2+i
		})
		m.WaitSocket(m.srv.Socket, pluginmanager.StateRegistered)
	}
	if n := len(m.srv.Of("compression-error")); n != 0 {
		t.Errorf("%d header blocks without the table size update", n)
	}
	if n := len(m.srv.Of("accepted")); n != 1 {
		t.Errorf("%d connections for a registration and 3 probes, want 1, held", n)
	}
	if w := m.warnings.String(); w != "" {
		t.Errorf("warnings:\n%s", w)
	}
	m.srv.Kill(t)
	m.gone(t) // the clock stands still: heard on the held connection
	m.toldOnce(t)
}

// Issue 25, item 5: a server that answers GetInfo with GOAWAY(its stream,
// ENHANCE_YOUR_CALM, "calm down") and keeps the socket open fails the
// attempt at once, not at GetInfo's deadline (here longer than the test
// waits), and the failure says the code and the debug data.
func TestManagerGoAwayCalm(t *testing.T) {
	opts := plugin
	opts.Scenario = interop.GoAwayCalm
	m := manageWith(t, interop.Raw, opts, pluginmanager.Options{GetInfoTimeout: 10 * time.Minute})
	s := m.WaitSocket(m.srv.Socket, pluginmanager.StateFailed)
	if s.Reason != pluginmanager.ReasonGetInfo {
		t.Errorf("reason %s, want %s", s.Reason, pluginmanager.ReasonGetInfo)
	}
	for _, want := range []string{"ENHANCE_YOUR_CALM", "calm down"} {
		if !strings.Contains(s.LastError, want) {
			t.Errorf("last error %q does not say %s", s.LastError, want)
		}
	}
	if told := m.srv.Told(); len(told) != 0 {
		t.Errorf("told %+v: nothing was accepted", told)
	}
}

// A server flooding the idle connection plugd holds to it has that
// connection closed: it is logged once, the plugin stays registered, and it
// is connected to again only after a backoff. (The flood begins 100 ms
// after the server's first answer on a connection, GetInfo's: on a slow
// machine it may break the registration's NotifyRegistrationStatus on that
// connection instead, and the plugin is then told on a new one, which is
// not flooded, and nothing is logged. The server says which it was.)
func TestManagerFlood(t *testing.T) {
	logged := 0
	for _, scenario := range []string{interop.FloodWindow, interop.FloodReset, interop.FloodUnknown, interop.FloodSettings} {
		t.Run(scenario, func(t *testing.T) {
			opts := plugin
			opts.Scenario = scenario
			m := manage(t, interop.Raw, opts)
			m.registered(t)
			m.srv.WaitFor(t, "flood-end", 1) // the flooded connection is closed
			// The flood began on the connection held idle, after the
			// plugin was told: then it is logged, as the manager looks at
			// the hang-up, a moment after the server saw it closed.
			held := m.srv.Of("flood-end")[0].Idle
			if held {
				m.warnings.Wait(t, "flooded", wait)
			}
			m.clk.Step(time.Second) // past the backoff: connected again
			m.WaitSocket(m.srv.Socket, pluginmanager.StateRegistered)
			w := m.warnings.String() // one read decides
			if n := strings.Count(w, "level=WARN"); n > 1 || n == 1 && !strings.Contains(w, "flooded") {
				t.Errorf("warnings, want at most the flood's, once:\n%s", w)
			}
			if held {
				logged++
			}
			t.Logf("the flood hit the connection held idle: %v", held)
			m.toldOnce(t)
		})
	}
	if logged == 0 {
		t.Error("no flood of a held connection was seen: this tests nothing")
	}
}
