// Package observed keeps what a handler's Observe saw of the plugins another
// manager (a kubelet) registered: a record of the handler's own kind for
// each registration socket, and the watch of the plugin's endpoint (package
// endpointwatch) that tells the manager, and the record, when the endpoint
// goes and comes back.
//
// What is the same in every handler is the bookkeeping around the watches,
// which is easy to get wrong: each Observe is a look with a number of its
// own, so that the reports of an earlier look's watch, which may still be
// on their way, never write to the record of a later look; a look's watch
// replaces the one before it, which is stopped; Forget and Close stop the
// watches they drop; and a watch is stopped without the handler's lock
// held, since its reports take that lock. What a record holds, and what a
// look and a report change in it, is the handler's.
package observed

import (
	"context"
	"sync"
	"time"

	"github.com/plugd/plugd/handlers/internal/endpointwatch"
	"github.com/plugd/plugd/internal/confine"
	"github.com/plugd/plugd/internal/unaryconn"
	"github.com/plugd/plugd/pluginmanager"
)

// Table holds a record of type R (a pointer to the handler's own type) for
// each registration socket observed, and the watch of its endpoint. Its
// lock is the handler's, so that a handler reads and writes the records
// with the rest of its state. Make one with New. Its methods take the lock
// themselves but for FindLocked, which is called with it held.
type Table[R any] struct {
	mu      *sync.Mutex
	changed func()
	timeout time.Duration
	roots   []string
	poller  *unaryconn.Poller // watches the connections the watches hold; Close closes it

	closed   bool
	looks    uint64 // looks begun so far; the last one's number
	bySocket map[string]*entry[R]
}

// entry is the last look at one registration socket.
type entry[R any] struct {
	plugin pluginmanager.Plugin
	rec    R
	watch  *endpointwatch.Watch // nil if the look failed before it watched
	look   uint64
}

// New returns an empty table guarded by mu, the handler's lock. changed is
// called, with mu held, after every change of a record (the handler wakes
// whoever waits for its state then). The watches connect to an endpoint
// within timeout, and, if roots is not empty, only inside them (the
// manager's Options.EndpointRoots), at every connection.
func New[R any](mu *sync.Mutex, changed func(), timeout time.Duration, roots []string) *Table[R] {
	return &Table[R]{mu: mu, changed: changed, timeout: timeout, roots: roots,
		poller: unaryconn.NewPoller(unaryconn.PollerOptions{}), bySocket: make(map[string]*entry[R])}
}

// Look begins a look, and returns its number, for its Watch and Put. It
// returns false once Close has been called.
func (t *Table[R]) Look() (look uint64, ok bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return 0, false
	}
	t.looks++
	return t.looks, true
}

// Watch starts watching the endpoint of p, the plugin of the look: what the
// watch sees goes to the manager (pluginmanager.EndpointReporter of ctx,
// the context of the Observe call) and, for as long as the look's record is
// its socket's, to seen, which updates the record and says whether it
// changed. seen is called with the lock held, one report at a time. The
// watch's first report, that the endpoint serves, comes before Watch
// returns, so before the look's Put: it reaches only the manager.
func (t *Table[R]) Watch(ctx context.Context, p pluginmanager.Plugin, look uint64, seen func(rec R, err error) (changed bool)) (*endpointwatch.Watch, error) {
	report := pluginmanager.EndpointReporter(ctx)
	return endpointwatch.Start(ctx, p.Endpoint, endpointwatch.Options{
		Timeout: t.timeout,
		Dial:    confine.For(p.Endpoint, p.Socket, t.roots).Dial,
		Poller:  t.poller,
		Report: func(err error) {
			report(err)
			t.mu.Lock()
			defer t.mu.Unlock()
			e := t.bySocket[p.Socket]
			if e == nil || e.look != look {
				return
			}
			if seen(e.rec, err) {
				t.changed()
			}
		},
	})
}

// Put ends a look at p: its socket's record becomes update(old), where old
// is the record of the last look at the socket if that saw a plugin of the
// same name, and the zero R if not. The look's watch w (nil if it has none)
// replaces the last look's, which Put stops. Once Close has been called,
// it stops w instead, and returns false.
func (t *Table[R]) Put(p pluginmanager.Plugin, look uint64, w *endpointwatch.Watch, update func(old R) R) bool {
	var stop *endpointwatch.Watch
	defer func() { stop.Stop() }() // once t.mu is let go: its reports take it
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		stop = w
		return false
	}
	var old R
	if e := t.bySocket[p.Socket]; e != nil {
		stop = e.watch
		if e.plugin.Name == p.Name {
			old = e.rec
		}
	}
	t.bySocket[p.Socket] = &entry[R]{plugin: p, rec: update(old), watch: w, look: look}
	t.changed()
	return true
}

// FindLocked returns the record of p's socket, and the plugin the look that
// made it saw there, if that was of p's name. The lock must be held, and
// the record is the caller's to read only while it is.
func (t *Table[R]) FindLocked(p pluginmanager.Plugin) (seen pluginmanager.Plugin, rec R, ok bool) {
	e := t.bySocket[p.Socket]
	if e == nil || e.plugin.Name != p.Name {
		return pluginmanager.Plugin{}, rec, false
	}
	return e.plugin, e.rec, true
}

// Forget drops the record of p's socket, whatever its name, and stops its
// watch. It does nothing for a socket without a record.
func (t *Table[R]) Forget(p pluginmanager.Plugin) {
	t.mu.Lock()
	e, ok := t.bySocket[p.Socket]
	if ok {
		delete(t.bySocket, p.Socket)
		t.changed()
	}
	t.mu.Unlock()
	if ok {
		e.watch.Stop()
	}
}

// Close drops every record, stops every watch and the Poller they share,
// and returns once its goroutines have; Look and Put fail from then on. It
// may be called more than once.
func (t *Table[R]) Close() {
	t.mu.Lock()
	t.closed = true
	dropped := t.bySocket
	t.bySocket = make(map[string]*entry[R])
	if len(dropped) > 0 {
		t.changed()
	}
	t.mu.Unlock()
	for _, e := range dropped {
		e.watch.Stop()
	}
	t.poller.Close()
}
