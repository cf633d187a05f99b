// Package faults is plugd's fault suite (issue 5): plugins that hang, stay
// silent, lie, flood the registry directory or outnumber the manager, each run
// against a real pluginmanager.Manager in the test process, over real unix
// sockets, with the misbehaving plugin a real process (test/faults/faultplugin)
// where one plugin is enough. Every test asserts the final state, and that no
// goroutine, file descriptor or socket file was left behind (checkLeaks).
//
// Liveness and policy faults (a SIGKILLed plugin, a peer not on the
// allow-list, an endpoint outside the allowed roots, a group-writable
// directory) are in policy_test.go.
package faults

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/plugd/plugd/internal/testenv"
	"github.com/plugd/plugd/plugin"
	"github.com/plugd/plugd/pluginmanager"
)

// A plugin whose GetInfo never answers fails at the GetInfo deadline, and does
// not hold up a plugin that comes while it hangs.
func TestHangInGetInfo(t *testing.T) {
	dir := testenv.ShortDir(t, "f")
	checkLeaks(t, dir)
	rec := newRecorder()
	const deadline = time.Second
	m := runManager(t, pluginmanager.Options{Dir: dir, GetInfoTimeout: deadline}, map[string]pluginmanager.Handler{testType: rec})

	hang := startPlugin(t, dir, "hang-getinfo")
	hang.logged("GetInfo: hanging")
	// The other plugin is served in process: its socket is there at once,
	// well within the hanging call's deadline.
	other := startSDKPlugin(t, dir, "other")

	discovered := m.find("the hanging plugin to be discovered", on(hang.path, pluginmanager.EventDiscovered))
	failed := m.find("the hanging plugin's first failure", on(hang.path, pluginmanager.EventFailed))
	if failed.Reason != pluginmanager.ReasonGetInfo || !strings.Contains(failed.Error, "no answer within 1s") {
		t.Errorf("the hanging plugin failed with %s %q, want get_info, no answer within 1s", failed.Reason, failed.Error)
	}
	endedAt(t, "the hanging plugin failed", failed.Time.Sub(discovered.Time), deadline, defaultCallTimeout)
	// The deadline reached the plugin too: gRPC cancelled its call.
	hang.logged("GetInfo: the client gave up")
	notHeldUp(t, m, other.Path(), hang.path, pluginmanager.EventFailed)

	s := m.status(hang.path, "retried", func(p pluginmanager.PluginStatus) bool { return p.Attempts >= 2 })
	if s.State == pluginmanager.StateRegistered || s.State == pluginmanager.StateRejected {
		t.Errorf("the hanging plugin is %s; a timeout is transient: it should be retried", s.State)
	}
	if validates, _, _ := rec.counts(); validates[hang.path] != 0 {
		t.Errorf("the handler was asked to validate a plugin that never answered")
	}
	if got := rec.heldSockets(); !slices.Equal(got, []string{other.Path()}) {
		t.Errorf("the handler holds %q, want only the other plugin", got)
	}
	rec.checkProblems(t)
}

// A plugin whose NotifyRegistrationStatus never answers stays registered: the
// handler took it, and failing it now would only make the handler flap. Its
// status says the notification failed, and the manager goes on registering
// other plugins meanwhile.
func TestHangInNotify(t *testing.T) {
	dir := testenv.ShortDir(t, "f")
	checkLeaks(t, dir)
	rec := newRecorder()
	const deadline = time.Second
	m := runManager(t, pluginmanager.Options{Dir: dir, NotifyTimeout: deadline}, map[string]pluginmanager.Handler{testType: rec})

	hang := startPlugin(t, dir, "hang-notify")
	hang.logged("NotifyRegistrationStatus: hanging")
	other := startSDKPlugin(t, dir, "other")

	discovered := m.find("the hanging plugin to be discovered", on(hang.path, pluginmanager.EventDiscovered))
	registered := m.find("the hanging plugin to register", on(hang.path, pluginmanager.EventRegistered))
	endedAt(t, "the hanging plugin was registered", registered.Time.Sub(discovered.Time), deadline, defaultCallTimeout)
	notHeldUp(t, m, other.Path(), hang.path, pluginmanager.EventRegistered)
	s := m.WaitSocket(hang.path, pluginmanager.StateRegistered)
	if s.Reason != pluginmanager.ReasonNotify || !strings.Contains(s.LastError, "NotifyRegistrationStatus") || !strings.Contains(s.LastError, "no answer within 1s") {
		t.Errorf("status = %s %q, want the failed notification recorded", s.Reason, s.LastError)
	}
	if s.Attempts != 1 {
		t.Errorf("attempts = %d, want 1: a failed notification is not a failed registration", s.Attempts)
	}
	hang.logged("notified registered=true")
	hang.logged("NotifyRegistrationStatus: the client gave up")

	_, registers, deregisters := rec.counts()
	if registers[hang.path] != 1 || deregisters[hang.path] != 0 {
		t.Errorf("the handler registered the plugin %d times and let it go %d times, want once and never", registers[hang.path], deregisters[hang.path])
	}
	if got, want := rec.heldSockets(), []string{hang.path, other.Path()}; !slices.Equal(got, want) {
		t.Errorf("the handler holds %q, want %q", got, want)
	}
	rec.checkProblems(t)
}

// notHeldUp checks that the plugin at other registered while the manager was
// waiting on the hanging plugin at hung: before the event of type end that
// ended the hung attempt under way when other's socket was discovered. A
// manager that waited for the hanging call would register other only after.
func notHeldUp(t *testing.T, m *manager, other, hung string, end pluginmanager.EventType) {
	t.Helper()
	discovered := m.find("the other plugin to be discovered", on(other, pluginmanager.EventDiscovered))
	registered := m.find("the other plugin to register", on(other, pluginmanager.EventRegistered))
	ended := m.find("the hanging attempt to end", func(ev pluginmanager.Event) bool {
		return on(hung, end)(ev) && ev.Seq > discovered.Seq
	})
	t.Logf("the other plugin registered %s after its socket was discovered", registered.Time.Sub(discovered.Time).Round(time.Millisecond))
	if registered.Seq > ended.Seq {
		t.Errorf("the other plugin registered (event %d) only after the hanging call gave up (event %d): the manager waited for it", registered.Seq, ended.Seq)
	}
}

// A socket that accepts connections and never says a word fails at the dial
// deadline (gRPC never sees the server's HTTP/2 preface), and is retried with
// backoff, without a goroutine left behind per attempt.
func TestSilentSocket(t *testing.T) {
	dir := testenv.ShortDir(t, "f")
	checkLeaks(t, dir)
	const deadline = 300 * time.Millisecond
	m := runManager(t, pluginmanager.Options{Dir: dir, DialTimeout: deadline, BackoffInitial: 20 * time.Millisecond, BackoffMax: 100 * time.Millisecond},
		map[string]pluginmanager.Handler{testType: newRecorder()})

	quiet := startPlugin(t, dir, "silent")
	start := m.find("the silent socket to be discovered", on(quiet.path, pluginmanager.EventDiscovered)).Time
	const attempts = 9

	// floors[k] is the fewest goroutines seen between failures k and k+1.
	// The count goes up by the few goroutines of each attempt under way,
	// but its floor, in the backoff gaps, stays put; a pile-up would raise
	// it by the goroutines of a gRPC connection (several) per attempt.
	var (
		mu     sync.Mutex
		floors = make([]int, attempts+1)
		phase  int
	)
	stopSampling := make(chan struct{})
	var sampling sync.WaitGroup
	sampling.Go(func() {
		tick := time.NewTicker(2 * time.Millisecond)
		defer tick.Stop()
		for {
			n := runtime.NumGoroutine()
			mu.Lock()
			if phase > 0 && (floors[phase] == 0 || n < floors[phase]) {
				floors[phase] = n
			}
			mu.Unlock()
			select {
			case <-tick.C:
			case <-stopSampling:
				return
			}
		}
	})

	var seq uint64
	for i := 1; i <= attempts; i++ {
		ev := m.find(fmt.Sprintf("failure %d of the silent socket", i), func(ev pluginmanager.Event) bool {
			return on(quiet.path, pluginmanager.EventFailed)(ev) && ev.Seq > seq
		})
		seq = ev.Seq
		mu.Lock()
		phase = i
		mu.Unlock()
		if ev.Reason != pluginmanager.ReasonDial || !strings.Contains(ev.Error, "no connection within 300ms") || ev.Attempt != i {
			t.Errorf("failure %d: attempt %d, %s %q, want attempt %d failing at the dial deadline", i, ev.Attempt, ev.Reason, ev.Error, i)
		}
		endedAt(t, fmt.Sprintf("attempt %d gave up", i), ev.Time.Sub(start), deadline, defaultCallTimeout)
		if !ev.NextRetry.After(ev.Time) {
			t.Errorf("failure %d: no retry scheduled (next retry %v)", i, ev.NextRetry)
		}
		start = ev.NextRetry
	}
	close(stopSampling)
	sampling.Wait()

	// Each attempt opened a connection and left it: the plugin saw them all.
	if n := quiet.stderr.count("silent: accepted a connection"); n < attempts {
		t.Errorf("the silent plugin accepted %d connections in %d attempts", n, attempts)
	}
	floors = floors[1:attempts] // the last phase was cut short
	t.Logf("fewest goroutines between failed attempts: %v", floors)
	if early, late := floors[1], floors[len(floors)-1]; late > early+1 {
		t.Errorf("goroutines grew from %d to %d over %d attempts: %v", early, late, len(floors)-1, floors)
	}
}

// A GetInfo answer with a 1 MiB name is refused by the message size cap
// without the manager holding on to it.
func TestHugeName(t *testing.T) {
	dir := testenv.ShortDir(t, "f")
	checkLeaks(t, dir)
	before := heapInuse()
	m := runManager(t, pluginmanager.Options{Dir: dir}, map[string]pluginmanager.Handler{testType: newRecorder()})

	huge := startPlugin(t, dir, "huge-name")
	s := m.verdict(huge.path)
	// Refused for good: retrying would only have it send its megabyte again.
	if s.State != pluginmanager.StateRejected || s.Reason != pluginmanager.ReasonInvalidInfo || !strings.Contains(s.LastError, "ResourceExhausted") {
		t.Fatalf("status = %s %s %q, want Rejected, invalid_info, for the size of the answer", s.State, s.Reason, s.LastError)
	}
	huge.logged("notified registered=false")
	if len(s.Name) > 1024 || len(s.LastError) > 1024 {
		t.Errorf("the status keeps %d bytes of name and %d of error", len(s.Name), len(s.LastError))
	}
	after := heapInuse()
	t.Logf("%s after %d attempts: %q; heap in use %d KiB before, %d KiB after", s.State, s.Attempts, s.LastError, before>>10, after>>10)
	if after > before+16*mib {
		t.Errorf("heap in use grew by %d MiB", (after-before)/mib)
	}
}

// GetInfo answers that break a rule are rejected for good, and the plugin is
// told why.
func TestMalformedInfoRejected(t *testing.T) {
	for _, tc := range []struct {
		mode string
		want string // in the reason, as stored and as told
	}{
		{"nul-name", "not printable"},
		{"many-versions", "10000 supported versions"},
		{"relative-endpoint", "absolute"},
	} {
		t.Run(tc.mode, func(t *testing.T) {
			dir := testenv.ShortDir(t, "f")
			checkLeaks(t, dir)
			rec := newRecorder()
			m := runManager(t, pluginmanager.Options{Dir: dir}, map[string]pluginmanager.Handler{testType: rec})

			p := startPlugin(t, dir, tc.mode)
			s := m.verdict(p.path)
			// ReasonPolicy is for a rule of the manager's options (endpoint
			// roots) rather than of form; either will do for a relative endpoint.
			if s.State != pluginmanager.StateRejected || (s.Reason != pluginmanager.ReasonInvalidInfo && s.Reason != pluginmanager.ReasonPolicy) || !strings.Contains(s.LastError, tc.want) {
				t.Fatalf("status = %s %s %q, want Rejected, invalid_info (or policy), saying %q", s.State, s.Reason, s.LastError, tc.want)
			}
			if strings.ContainsRune(s.LastError, 0) || strings.ContainsRune(s.Name, 0) {
				t.Errorf("a NUL byte the plugin sent reached the status: %q %q", s.Name, s.LastError)
			}
			told := p.logged("notified registered=")
			if !strings.Contains(told, "registered=false") || !strings.Contains(told, tc.want) {
				t.Errorf("the plugin was told: %s; want not registered, saying %q", told, tc.want)
			}
			if validates, _, _ := rec.counts(); validates[p.path] != 0 {
				t.Errorf("the handler was asked to validate a malformed plugin")
			}
		})
	}
}

// A storm of sockets created and removed at random: most bare (a socket file
// nobody listens on, as a crashed plugin leaves), some real plugins started
// and stopped. When it is over, the manager knows exactly the sockets on disk,
// has registered exactly the live plugins, and the handler holds exactly
// those; memory and goroutines stayed bounded on the way.
//
// The storm lasts 30 s, as CI runs it (go test -race ./...); with -short it
// lasts 5 s, for a quick local run. It is at least 10,000 operations either
// way: if the machine is too slow for the pace, the storm goes on until it
// has done them.
func TestRegistrationStorm(t *testing.T) {
	length := 30 * time.Second
	if testing.Short() {
		length = 5 * time.Second
	}
	const (
		workers  = 4
		minOps   = 10000
		perTick  = 5 // operations per worker per 10ms: 2,000 per second in all
		bareN    = 100
		realN    = 4
		realEach = 40 // one operation in realEach is on a real plugin
	)
	dir := testenv.ShortDir(t, "f")
	checkLeaks(t, dir)
	rec := newRecorder()
	m := runManager(t, pluginmanager.Options{Dir: dir, BackoffMax: time.Second}, map[string]pluginmanager.Handler{testType: rec})
	m.keepHistory = false   // tens of thousands of events; and they would count as the manager's memory
	m.Timeout = time.Minute // how long it takes to settle is logged, not asserted
	select {
	case <-m.m.Synced():
	case <-time.After(testenv.Timeout):
		t.Fatal("the manager did not walk the registry directory")
	}
	baseGoroutines, baseHeap := runtime.NumGoroutine(), heapInuse()

	// Peaks, sampled while the storm runs.
	var peakGoroutines int
	var peakHeap uint64
	stopSampling := make(chan struct{})
	var sampling sync.WaitGroup
	sampling.Go(func() {
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		var ms runtime.MemStats
		for {
			peakGoroutines = max(peakGoroutines, runtime.NumGoroutine())
			runtime.ReadMemStats(&ms)
			peakHeap = max(peakHeap, ms.HeapInuse)
			select {
			case <-tick.C:
			case <-stopSampling:
				return
			}
		}
	})

	seed := uint64(time.Now().UnixNano())
	t.Logf("storm of %s, seed %d", length, seed)
	ws := make([]*stormWorker, workers)
	t.Cleanup(func() { // on a failure before the clear-up at the end
		for _, w := range ws {
			for _, s := range w.live {
				s.Close()
			}
		}
	})
	var ops atomic.Int64
	end := time.Now().Add(length)
	var wg sync.WaitGroup
	for i := range ws {
		w := &stormWorker{dir: dir, bare: map[string]bool{}, live: map[string]*plugin.Server{}}
		ws[i] = w
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(seed, uint64(i)))
			tick := time.NewTicker(10 * time.Millisecond)
			defer tick.Stop()
			for w.err == nil && (time.Now().Before(end) || ops.Load() < minOps) {
				<-tick.C // pacing, not synchronisation
				for range perTick {
					if rng.IntN(realEach) == 0 {
						w.err = w.toggleReal(fmt.Sprintf("p%d-%d", i, rng.IntN(realN)))
					} else {
						w.err = w.toggleBare(filepath.Join(dir, fmt.Sprintf("s%d-%03d.sock", i, rng.IntN(bareN))))
					}
					if w.err != nil {
						return
					}
					ops.Add(1)
				}
			}
		})
	}
	wg.Wait()
	close(stopSampling)
	sampling.Wait()
	stormed := time.Now()

	live := map[string]bool{}
	var stale []string
	starts := 0
	for _, w := range ws {
		if w.err != nil {
			t.Fatal(w.err)
		}
		for path := range w.live {
			live[path] = true
		}
		for path := range w.bare {
			stale = append(stale, path)
		}
		starts += w.starts
	}
	onDisk := socketsIn(t, dir)
	t.Logf("%d operations (%d real plugin starts); left %d sockets on disk, %d of them live plugins", ops.Load(), starts, len(onDisk), len(live))
	if len(onDisk) != len(live)+len(stale) {
		t.Fatalf("%d sockets on disk, but the storm left %d live and %d stale", len(onDisk), len(live), len(stale))
	}
	wantHeld := slices.Sorted(func(yield func(string) bool) {
		for p := range live {
			if !yield(p) {
				return
			}
		}
	})

	// The final state: converged once nothing changes any more.
	m.Until("the manager to know exactly the sockets on disk, and the handler to hold exactly the live plugins", func(ps []pluginmanager.PluginStatus) bool {
		known := make([]string, 0, len(ps))
		for _, p := range ps {
			known = append(known, p.Socket)
			registered := p.State == pluginmanager.StateRegistered || p.State == pluginmanager.StateUnhealthy
			if registered != live[p.Socket] || (live[p.Socket] && p.State != pluginmanager.StateRegistered) {
				return false
			}
		}
		return slices.Equal(known, onDisk) && slices.Equal(rec.heldSockets(), wantHeld)
	})
	t.Logf("converged %s after the storm", time.Since(stormed).Round(time.Millisecond))
	rec.checkProblems(t)

	t.Logf("peaks during the storm: %d goroutines (%d before), %d MiB heap in use (%d MiB before)",
		peakGoroutines, baseGoroutines, peakHeap/mib, baseHeap/mib)
	if peakGoroutines > baseGoroutines+500 {
		t.Errorf("goroutines peaked at %d, %d before the storm", peakGoroutines, baseGoroutines)
	}
	if peakHeap > baseHeap+64*mib {
		t.Errorf("heap in use peaked at %d MiB, %d MiB before the storm", peakHeap/mib, baseHeap/mib)
	}

	// Clear up: everything goes, and the manager forgets everything.
	for _, w := range ws {
		for _, s := range w.live {
			if err := s.Close(); err != nil {
				t.Error(err)
			}
		}
	}
	for _, path := range stale {
		if err := os.Remove(path); err != nil {
			t.Error(err)
		}
	}
	m.Until("the manager to forget every socket, and the handler to hold none", func(ps []pluginmanager.PluginStatus) bool {
		return len(ps) == 0 && len(rec.heldSockets()) == 0
	})
	rec.checkProblems(t)
}

// The registry directory removed under the manager: the plugins in it are
// deregistered; re-created, a plugin started in it registers. Recovery may
// wait for the next walk of the directory, so ResyncInterval is 1s here, and
// the test allows any time short of the default interval (30s), which would
// mean the 1s was not applied; a manager that watches for the directory's
// return recovers in milliseconds.
func TestRegistryDirRemovedAndRecreated(t *testing.T) {
	dir := filepath.Join(testenv.ShortDir(t, "f"), "registry")
	checkLeaks(t, dir)
	rec := newRecorder()
	const resync = time.Second
	m := runManager(t, pluginmanager.Options{Dir: dir, ResyncInterval: resync}, map[string]pluginmanager.Handler{testType: rec})
	select {
	case <-m.m.Synced(): // Run has created the directory
	case <-time.After(testenv.Timeout):
		t.Fatal("the manager did not walk the registry directory")
	}
	first := startPlugin(t, dir, "ok", "-name", "first")
	m.WaitSocket(first.path, pluginmanager.StateRegistered)

	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	m.WaitGone(first.path)
	if _, _, deregisters := rec.counts(); deregisters[first.path] != 1 {
		t.Errorf("the plugin whose socket went with the directory was deregistered %d times, want once", deregisters[first.path])
	}
	// Its process runs on, its socket gone; it exits cleanly, leaving nothing.
	first.stop()

	if err := os.Mkdir(dir, 0o750); err != nil {
		t.Fatal(err)
	}
	recreated := time.Now()
	second := startPlugin(t, dir, "ok", "-name", "second")
	// WaitSocket's bound, testenv.Timeout, is shorter than the default
	// interval (30s): a manager that did not apply the 1s fails it.
	s := m.WaitSocket(second.path, pluginmanager.StateRegistered)
	took := s.RegisteredSince.Sub(recreated)
	t.Logf("a plugin in the re-created directory registered %s after it was re-created (resync every %s)", took.Round(time.Millisecond), resync)

	// The watch is back too: a third plugin is found by its event.
	created := time.Now()
	third := startPlugin(t, dir, "ok", "-name", "third")
	s = m.WaitSocket(third.path, pluginmanager.StateRegistered)
	t.Logf("a third plugin was discovered %s after its process was started", s.Discovered.Sub(created).Round(time.Millisecond))
	if got, want := rec.heldSockets(), []string{second.path, third.path}; !slices.Equal(got, want) {
		t.Errorf("the handler holds %q, want %q", got, want)
	}
	rec.checkProblems(t)
}

// A manager restarted with 500 plugins in its directory registers them all
// again, notifies each again, and tells its handler of each exactly once;
// the first manager, stopping, lets none of them go.
func TestRestartWith500Plugins(t *testing.T) {
	const n = 500
	dir := testenv.ShortDir(t, "f")
	checkLeaks(t, dir)
	// In process, with the SDK: 500 processes would cost more than they show.
	servers := make([]*plugin.Server, n)
	for i := range servers {
		s, err := plugin.Start(plugin.Config{Dir: dir, Type: testType, Name: fmt.Sprintf("p%03d", i), Versions: []string{"1.0.0"}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		servers[i] = s
	}
	// Timeouts are not what this test is about: 500 registrations take about
	// 2s under -race on two idle cores, but 10s and more when other work
	// shares them, and single calls then outlast the short test timeouts.
	opts := pluginmanager.Options{Dir: dir, EventBuffer: 4 * n, DialTimeout: 10 * time.Second, GetInfoTimeout: 10 * time.Second, NotifyTimeout: 10 * time.Second}

	for round := 1; round <= 2; round++ {
		rec := newRecorder()
		m := runManager(t, opts, map[string]pluginmanager.Handler{testType: rec})
		m.Timeout = time.Minute // measured, not asserted: see the log
		ps := m.Until(fmt.Sprintf("all %d plugins registered", n), func(ps []pluginmanager.PluginStatus) bool {
			registered := 0
			for _, p := range ps {
				if p.State == pluginmanager.StateRegistered {
					registered++
				}
			}
			return registered == n
		})
		var last time.Time
		for _, p := range ps {
			if p.RegisteredSince.After(last) {
				last = p.RegisteredSince
			}
		}
		t.Logf("manager %d: all %d plugins registered %s after Run started", round, n, last.Sub(m.started).Round(time.Millisecond))
		m.Stop() // DeregisterOnShutdown is off: the handler keeps them

		validates, registers, deregisters := rec.counts()
		for _, s := range servers {
			if validates[s.Path()] != 1 || registers[s.Path()] != 1 || deregisters[s.Path()] != 0 {
				t.Errorf("manager %d: handler validated %s %d times, registered it %d times, let it go %d times; want once, once, never",
					round, filepath.Base(s.Path()), validates[s.Path()], registers[s.Path()], deregisters[s.Path()])
			}
			if got := s.Notifications(); got != round || !s.Registered() {
				t.Errorf("after manager %d: %s was notified %d times (registered: %v), want %d", round, filepath.Base(s.Path()), got, s.Registered(), round)
			}
		}
		if len(rec.heldSockets()) != n {
			t.Errorf("manager %d: the handler holds %d plugins after the manager stopped, want %d", round, len(rec.heldSockets()), n)
		}
		rec.checkProblems(t)
		if t.Failed() {
			return
		}
	}
}

// Run refuses a registry directory every user may write to, and says so.
func TestWorldWritableDirRefused(t *testing.T) {
	dir := testenv.ShortDir(t, "f")
	if err := os.Chmod(dir, 0o777); err != nil {
		t.Fatal(err)
	}
	checkLeaks(t, dir)
	m, err := pluginmanager.New(pluginmanager.Options{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), testenv.Timeout)
	defer cancel()
	err = m.Run(ctx)
	if err == nil {
		t.Fatal("Run accepted a world-writable registry directory")
	}
	// The wording is the manager's ("writable by every user", "by users
	// other than its owner"): it must name the directory and the fault.
	if msg := err.Error(); !strings.Contains(msg, dir) || !strings.Contains(msg, "writable") {
		t.Errorf("Run = %q, want it to say the directory is writable by others", msg)
	}
	if ctx.Err() != nil {
		t.Error("Run returned only at the test's deadline")
	}
	select {
	case <-m.Synced():
		t.Error("the manager walked the refused directory")
	default:
	}
}

// stormWorker is one goroutine of the storm, and what it left behind.
type stormWorker struct {
	dir    string
	bare   map[string]bool           // bare sockets it left on disk
	live   map[string]*plugin.Server // real plugins running, by socket
	starts int
	err    error
}

// toggleBare creates a socket file nobody listens on at path, or removes the
// one there.
func (w *stormWorker) toggleBare(path string) error {
	if w.bare[path] {
		delete(w.bare, path)
		return os.Remove(path)
	}
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		return err
	}
	l.SetUnlinkOnClose(false)
	w.bare[path] = true
	return l.Close()
}

// toggleReal starts the plugin called name (in process, with the SDK), or
// stops it if it runs.
func (w *stormWorker) toggleReal(name string) error {
	path := filepath.Join(w.dir, name+".sock")
	if s, ok := w.live[path]; ok {
		delete(w.live, path)
		return s.Close()
	}
	s, err := plugin.Start(plugin.Config{Dir: w.dir, Type: testType, Name: name, Versions: []string{"1.0.0"}})
	if err != nil {
		return err
	}
	w.live[path] = s
	w.starts++
	return nil
}
