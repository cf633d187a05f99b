package observed

import (
	"context"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/plugd/plugd/internal/testenv"
	"github.com/plugd/plugd/pluginmanager"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// record is a handler's record: the looks that wrote it, and what its
// watch reported.
type record struct {
	looks   []uint64
	reports []error
}

// table is a Table as a handler holds one, with its lock and the channel
// its changes wake.
type table struct {
	*Table[*record]
	mu      sync.Mutex
	changed chan struct{} // closed and made anew at each change
}

func newTable(t *testing.T) *table {
	tb := &table{changed: make(chan struct{})}
	tb.Table = New[*record](&tb.mu, func() {
		close(tb.changed)
		tb.changed = make(chan struct{})
	}, testenv.Timeout, nil)
	t.Cleanup(tb.Close)
	return tb
}

// observe is one look at p that reaches its endpoint, as a handler's
// Observe makes it: the look's watch records what it sees, and the record
// keeps the looks that wrote it.
func (tb *table) observe(t *testing.T, p pluginmanager.Plugin) uint64 {
	t.Helper()
	look, ok := tb.Look()
	if !ok {
		t.Fatal("Look failed on an open table")
	}
	w, err := tb.Watch(context.Background(), p, look, func(r *record, err error) bool {
		r.reports = append(r.reports, err)
		return true
	})
	if err != nil {
		t.Fatal(err)
	}
	if !tb.Put(p, look, w, func(old *record) *record {
		if old == nil {
			old = &record{}
		}
		old.looks = append(old.looks, look)
		return old
	}) {
		t.Fatal("Put failed on an open table")
	}
	return look
}

// find is FindLocked with the lock held.
func (tb *table) find(p pluginmanager.Plugin) (pluginmanager.Plugin, record, bool) {
	tb.mu.Lock()
	defer tb.mu.Unlock()
	seen, r, ok := tb.FindLocked(p)
	if !ok {
		return seen, record{}, false
	}
	return seen, *r, true
}

// until waits for cond to hold of the record of p, checking again at each
// change the table tells.
func (tb *table) until(t *testing.T, p pluginmanager.Plugin, what string, cond func(r record) bool) record {
	t.Helper()
	deadline := time.After(testenv.Timeout)
	for {
		tb.mu.Lock()
		changed := tb.changed
		tb.mu.Unlock()
		_, r, _ := tb.find(p)
		if cond(r) {
			return r
		}
		select {
		case <-changed:
		case <-deadline:
			t.Fatalf("no %s within %s; record %+v", what, testenv.Timeout, r)
		}
	}
}

const socket = "/reg/thing.sock"

func plugin(name, endpoint string) pluginmanager.Plugin {
	return pluginmanager.Plugin{Type: "example.com/Thing", Name: name, Endpoint: endpoint, Socket: socket}
}

func endpoints(t *testing.T) (a, b string) {
	dir := testenv.ShortDir(t, "obs")
	return filepath.Join(dir, "a.sock"), filepath.Join(dir, "b.sock")
}

// A look's watch holds a connection to the endpoint and writes what it
// sees to the look's record; the next look at the socket replaces the
// watch, stopping the old one, and is given the record to update when it
// sees the same plugin name, a fresh one when not.
func TestLookReplacesTheLastOne(t *testing.T) {
	a, b := endpoints(t)
	srvA, srvB := testenv.ServeGRPC(t, a, nil), testenv.ServeGRPC(t, b, nil)
	tb := newTable(t)

	first := tb.observe(t, plugin("thing.example.com", a))
	srvA.WaitConns(t, 1, testenv.Timeout)
	if _, r, ok := tb.find(plugin("thing.example.com", a)); !ok || len(r.looks) != 1 || len(r.reports) != 0 {
		t.Fatalf("record after the first look = %+v, %v; want the look's, with no report yet (the watch's first one precedes Put)", r, ok)
	}

	second := tb.observe(t, plugin("thing.example.com", b))
	srvA.WaitConns(t, 0, testenv.Timeout) // the first look's watch was stopped
	srvB.WaitConns(t, 1, testenv.Timeout)
	seen, r, ok := tb.find(plugin("thing.example.com", b))
	if !ok || seen.Endpoint != b || len(r.looks) != 2 || r.looks[0] != first || r.looks[1] != second {
		t.Fatalf("record after the second look = %+v of %+v, %v; want both looks in one record, at endpoint %s", r, seen, ok, b)
	}

	tb.observe(t, plugin("other.example.com", a))
	srvB.WaitConns(t, 0, testenv.Timeout)
	if _, _, ok := tb.find(plugin("thing.example.com", a)); ok {
		t.Error("the socket's record is still found under the old name")
	}
	if _, r, ok := tb.find(plugin("other.example.com", a)); !ok || len(r.looks) != 1 {
		t.Errorf("record of the new name = %+v, %v; want a fresh one, of its look only", r, ok)
	}
}

// What the watch sees after Put goes to the look's record, each change
// told; a watch begun for a look not yet Put writes to no record.
func TestReportsReachOnlyTheirLook(t *testing.T) {
	a, b := endpoints(t)
	srvA := testenv.ServeGRPC(t, a, nil)
	testenv.ServeGRPC(t, b, nil)
	tb := newTable(t)
	p := plugin("thing.example.com", a)
	tb.observe(t, p)

	// The next look's watch reports the endpoint serving as it starts,
	// while the record is still the first look's.
	look, _ := tb.Look()
	w, err := tb.Watch(context.Background(), plugin("thing.example.com", b), look, func(*record, error) bool {
		t.Error("a report of a look not yet Put reached the record")
		return true
	})
	if err != nil {
		t.Fatal(err)
	}
	w.Stop()

	srvA.Stop()
	r := tb.until(t, p, "report of the endpoint's loss", func(r record) bool { return len(r.reports) > 0 })
	if r.reports[0] == nil {
		t.Fatalf("reports = %v, want the endpoint's loss first", r.reports)
	}
	testenv.ServeGRPC(t, a, nil)
	r = tb.until(t, p, "report of the endpoint back", func(r record) bool { return len(r.reports) > 1 })
	if len(r.reports) != 2 || r.reports[1] != nil {
		t.Errorf("reports = %v, want the loss, then nil", r.reports)
	}
}

// Forget drops a socket's record and stops its watch; Close stops every
// watch, and a look ending after it has its watch stopped.
func TestForgetAndCloseStopTheWatches(t *testing.T) {
	a, b := endpoints(t)
	srvA, srvB := testenv.ServeGRPC(t, a, nil), testenv.ServeGRPC(t, b, nil)
	tb := newTable(t)
	pa, pb := plugin("a.example.com", a), plugin("b.example.com", b)
	pb.Socket = "/reg/other.sock"
	tb.observe(t, pa)
	tb.observe(t, pb)
	srvA.WaitConns(t, 1, testenv.Timeout)
	srvB.WaitConns(t, 1, testenv.Timeout)

	tb.Forget(pa)
	srvA.WaitConns(t, 0, testenv.Timeout)
	if _, _, ok := tb.find(pa); ok {
		t.Error("a's record is still there after Forget")
	}
	tb.Forget(pa) // again: nothing to do

	look, _ := tb.Look()
	w, err := tb.Watch(context.Background(), pa, look, func(*record, error) bool { return true })
	if err != nil {
		t.Fatal(err)
	}
	srvA.WaitConns(t, 1, testenv.Timeout)
	tb.Close()
	srvB.WaitConns(t, 0, testenv.Timeout)
	if tb.Put(pa, look, w, func(*record) *record { return &record{} }) {
		t.Error("Put after Close succeeded")
	}
	srvA.WaitConns(t, 0, testenv.Timeout) // Put stopped the look's watch
	if _, ok := tb.Look(); ok {
		t.Error("Look after Close succeeded")
	}
	if _, _, ok := tb.find(pb); ok {
		t.Error("b's record is still there after Close")
	}
}
