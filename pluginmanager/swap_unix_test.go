//go:build unix

package pluginmanager_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"

	"github.com/plugd/plugd/internal/confine"
	"github.com/plugd/plugd/internal/testenv"
	"github.com/plugd/plugd/pluginmanager"
	"github.com/plugd/plugd/plugintest"
)

// swapper is a plugin that, while it answers its swapAt-th GetInfo,
// replaces its socket with what swap puts there; with hangUp set, it then
// hangs up (hangUp drops the connection) instead of answering.
type swapper struct {
	*teller
	swapAt int
	swap   func() error
	hangUp func()
	err    chan error // swap's result
	calls  atomic.Int32
}

func (s *swapper) GetInfo(ctx context.Context, r *registerapi.InfoRequest) (*registerapi.PluginInfo, error) {
	if int(s.calls.Add(1)) == s.swapAt {
		s.err <- s.swap()
		if s.hangUp != nil {
			s.hangUp()
			<-ctx.Done()
			return nil, ctx.Err()
		}
	}
	return s.teller.GetInfo(ctx, r)
}

// renameOverWith puts a new file at path, atomically, as make makes it at a
// hidden name beside it (which the manager ignores).
func renameOverWith(path string, make func(string) error) error {
	tmp := filepath.Join(filepath.Dir(path), ".swap-"+filepath.Base(path))
	if err := make(tmp); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// symlinkTo is a make for renameOverWith: a symlink to target.
func symlinkTo(target string) func(string) error {
	return func(p string) error { return os.Symlink(target, p) }
}

// answered is the state of a plugin that answered: Registered, or
// observing, Answering.
func answered(observe bool) pluginmanager.State {
	if observe {
		return pluginmanager.StateAnswering
	}
	return pluginmanager.StateRegistered
}

// mode names a test's run in one mode or the other.
func mode(observe bool) string {
	if observe {
		return "observe"
	}
	return "manage"
}

// A plugin that swaps its socket for a symlink to a socket outside the
// registry directory while it answers GetInfo, and hangs up before it is
// told, so that telling it needs a new connection, does not lead plugd to
// that socket: the third party listening there is never connected to, nor
// told it was registered; the plugin is let go as if its socket were
// removed.
func TestSocketSwappedForASymlinkDuringGetInfo(t *testing.T) {
	evilPath := filepath.Join(testenv.ShortDir(t, "out"), "evil.sock")
	evilL := listenLast(t, evilPath)
	evil := &teller{typ: "CSIPlugin"}
	serveTeller(t, evilL, evil)

	dir := testenv.ShortDir(t, "pm")
	path := filepath.Join(dir, "swap.sock")
	l := listenLast(t, path)
	s := &swapper{teller: &teller{typ: "CSIPlugin"}, swapAt: 1, err: make(chan error, 1),
		swap: func() error { return renameOverWith(path, symlinkTo(evilPath)) }}
	serveTeller(t, l, s)
	var registers, deregisters atomic.Int32
	h := start(t, pluginmanager.Options{Dir: dir, ProbeInterval: -1, ResyncInterval: -1}, map[string]pluginmanager.Handler{
		"CSIPlugin": pluginmanager.HandlerFuncs{
			RegisterFunc: func(context.Context, pluginmanager.Plugin) error {
				registers.Add(1)
				l.drop() // the plugin hangs up: telling it needs a new connection
				return nil
			},
			DeregisterFunc: func(context.Context, pluginmanager.Plugin) { deregisters.Add(1) },
		},
	})
	if ev := h.WaitEvent(path, pluginmanager.EventRegistered, pluginmanager.EventRemoved); ev.Type != pluginmanager.EventRemoved {
		t.Errorf("%s after its socket was swapped for a symlink, want it Removed: %+v", ev.Type, ev)
	}
	if err := <-s.err; err != nil {
		t.Fatalf("swapping the socket: %v", err)
	}
	h.Stop() // nothing more can happen
	if n := evilL.accepted(); n != 0 {
		t.Errorf("the socket the symlink points to, outside the registry directory, was connected to %d times; told %v", n, evil.verdicts())
	}
	if got := s.verdicts(); len(got) != 0 {
		t.Errorf("the plugin was told %v, on a connection it had hung up", got)
	}
	if r, d := registers.Load(), deregisters.Load(); r != 1 || d != 1 {
		t.Errorf("handler: %d registrations, %d deregistrations; want it let go once registered", r, d)
	}
}

// A plugin asked by a probe, in both modes, that swaps its socket for a
// symlink to a socket outside the registry directory and hangs up, so that
// the probe connects again, does not lead plugd there either: the plugin is
// let go, and the third party never connected to.
func TestSocketSwappedForASymlinkDuringAProbe(t *testing.T) {
	for _, observe := range []bool{false, true} {
		t.Run(mode(observe), func(t *testing.T) {
			evilPath := filepath.Join(testenv.ShortDir(t, "out"), "evil.sock")
			evilL := listenLast(t, evilPath)
			evil := &teller{typ: "CSIPlugin"} // it answers as the plugin did
			serveTeller(t, evilL, evil)

			dir := testenv.ShortDir(t, "pm")
			path := filepath.Join(dir, "swap.sock")
			l := listenLast(t, path)
			s := &swapper{teller: &teller{typ: "CSIPlugin"}, swapAt: 2, err: make(chan error, 1), hangUp: l.drop,
				swap: func() error { return renameOverWith(path, symlinkTo(evilPath)) }}
			serveTeller(t, l, s)
			clk := fakeClock()
			const every = time.Minute
			h := start(t, pluginmanager.Options{Dir: dir, Observe: observe, Clock: clk, ProbeInterval: every, ResyncInterval: -1},
				map[string]pluginmanager.Handler{"CSIPlugin": pluginmanager.HandlerFuncs{}})
			h.WaitSocket(path, answered(observe))
			clk.Step(plugintest.MaxProbeDelay(every))
			h.WaitGone(path)
			if err := <-s.err; err != nil {
				t.Fatalf("swapping the socket: %v", err)
			}
			h.Stop()
			if n := evilL.accepted(); n != 0 {
				t.Errorf("the socket the symlink points to, outside the registry directory, was connected to %d times", n)
			}
		})
	}
}

// A registered (or observed) socket renamed over by a regular file, a FIFO
// or a symlink is let go at the watch event, with no probe and no resync to
// find it.
func TestRenamedOverByANonSocketLetsGo(t *testing.T) {
	kinds := []struct {
		name string
		make func(string) error
	}{
		{"file", func(p string) error { return os.WriteFile(p, nil, 0o600) }},
		{"fifo", func(p string) error { return syscall.Mkfifo(p, 0o600) }},
		{"symlink", symlinkTo("/dev/null")},
	}
	for _, observe := range []bool{false, true} {
		for _, k := range kinds {
			t.Run(mode(observe)+"/"+k.name, func(t *testing.T) {
				dir := testenv.ShortDir(t, "pm")
				path := filepath.Join(dir, "p.sock")
				l := listenLast(t, path)
				serveTeller(t, l, &teller{typ: "CSIPlugin"})
				h := start(t, pluginmanager.Options{Dir: dir, Observe: observe, ProbeInterval: -1, ResyncInterval: -1},
					map[string]pluginmanager.Handler{"CSIPlugin": pluginmanager.HandlerFuncs{}})
				h.WaitSocket(path, answered(observe))
				if err := renameOverWith(path, k.make); err != nil {
					t.Fatal(err)
				}
				if !observe {
					h.WaitEvent(path, pluginmanager.EventDeregistered)
				}
				h.WaitEvent(path, pluginmanager.EventRemoved)
			})
		}
	}
}

// A socket whose path is longer than a unix socket's may be is refused
// once, saying so and by how much, with no connection tried, and counted;
// observing, it is NotAnswering, likewise.
func TestSocketPathTooLong(t *testing.T) {
	const over = 9
	for _, observe := range []bool{false, true} {
		t.Run(mode(observe), func(t *testing.T) {
			// bind(2) takes no path that long: the socket is bound at a
			// short one, and its directory renamed to a long name.
			dir := testenv.ShortDir(t, "pm")
			short := filepath.Join(dir, "s")
			if err := os.Mkdir(short, 0o750); err != nil {
				t.Fatal(err)
			}
			l := listenLast(t, filepath.Join(short, "p.sock"))
			serveTeller(t, l, &teller{typ: "CSIPlugin"})
			long := filepath.Join(dir, strings.Repeat("d", confine.MaxPath+over-len(dir)-len("//p.sock")))
			if err := os.Rename(short, long); err != nil {
				t.Fatal(err)
			}
			path := filepath.Join(long, "p.sock")
			if len(path) != confine.MaxPath+over {
				t.Fatalf("the path is %d bytes long, want %d", len(path), confine.MaxPath+over)
			}
			t.Cleanup(func() { os.Rename(long, short) }) // for the listener to remove its socket

			reg := prometheus.NewRegistry()
			h := start(t, pluginmanager.Options{Dir: dir, Observe: observe, Registerer: reg, ProbeInterval: -1, ResyncInterval: -1},
				map[string]pluginmanager.Handler{"CSIPlugin": pluginmanager.HandlerFuncs{}})
			want := pluginmanager.StateRejected
			if observe {
				want = pluginmanager.StateNotAnswering
			}
			st := h.WaitSocket(path, want)
			h.Stop()
			if st.Reason != pluginmanager.ReasonDial || !strings.Contains(st.LastError, "too long") ||
				!strings.Contains(st.LastError, fmt.Sprintf("%d more than the %d", over, confine.MaxPath)) || !strings.Contains(st.LastError, "shorter") {
				t.Errorf("reason %s, error %q: want dial, saying the path is %d bytes too long and what to do", st.Reason, st.LastError, over)
			}
			if st.Attempts != 0 || l.accepted() != 0 {
				t.Errorf("%d attempts, %d connections: want none", st.Attempts, l.accepted())
			}
			if n := failures(t, reg, pluginmanager.ReasonDial); n != 1 {
				t.Errorf("counted %v failures of reason dial, want 1", n)
			}
		})
	}
}

// failures is plugd_registration_failures_total for reason, of every type.
func failures(t *testing.T, reg *prometheus.Registry, reason pluginmanager.Reason) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var n float64
	for _, mf := range mfs {
		if mf.GetName() != "plugd_registration_failures_total" {
			continue
		}
		for _, m := range mf.Metric {
			for _, lp := range m.Label {
				if lp.GetName() == "reason" && lp.GetValue() == string(reason) {
					n += m.GetCounter().GetValue()
				}
			}
		}
	}
	return n
}
