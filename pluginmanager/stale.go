package pluginmanager

import (
	"context"
	"os"
	"time"
)

// Stale sockets: a socket file nobody listens on, as a crashed plugin
// leaves, is Stale and retried with backoff; with Options.RemoveStaleAfter,
// one older than that is removed. A Rejected plugin often exits too
// (node-driver-registrar does, when told it was not registered), leaving
// its socket: it is looked at again once old enough, and removed if nobody
// listens on it any more.

// rejected looks at a Rejected socket whose stale check is due
// (Options.RemoveStaleAfter): one nobody listens on any more, as a rejected
// node-driver-registrar leaves behind, is removed; one whose plugin still
// listens is looked at again after as long.
func (r *registrar) rejected(ctx context.Context, path string, e *entry, now time.Time) result {
	if r.opts.RemoveStaleAfter <= 0 || e.due.IsZero() || tooLong(path) != nil {
		return result{}
	}
	if now.Before(e.due) {
		return result{at: e.due}
	}
	conn, err := r.client.dialIdle(ctx, e, path)
	if err == nil {
		conn.Close()
	}
	if ctx.Err() != nil {
		return result{}
	}
	r.reg.lock()
	remove := err != nil && refused(err) && r.staleDue(e, now)
	e.due = now.Add(r.opts.RemoveStaleAfter)
	at := e.due
	r.reg.unlock()
	if remove {
		r.removeStale(e, now)
	}
	return result{at: at}
}

// staleDue reports whether the Stale socket of e is to be removed now:
// Options.RemoveStaleAfter is set, and the socket is older.
func (r *registrar) staleDue(e *entry, now time.Time) bool {
	return r.opts.RemoveStaleAfter > 0 && now.Sub(e.status.Created) >= r.opts.RemoveStaleAfter
}

// removeStale removes the Stale socket of e (staleDue), a crashed plugin's
// leftover that nobody will come back for, with the registry's lock free.
// Only the very file that was found stale is removed. A failure is warned
// of once for the socket file: it is tried again at each retry.
func (r *registrar) removeStale(e *entry, now time.Time) {
	path, age := e.status.Socket, now.Sub(e.status.Created).Round(time.Second)
	removed, err := removeStale(path, e.id)
	switch {
	case err != nil && !e.live.unremovable:
		e.live.unremovable = true
		r.reg.lock()
		r.reg.warnLocked(e, now, "could not remove a stale socket", "socket", path, "err", err)
		r.reg.unlock()
	case removed:
		r.log.Info("removed a stale socket", "socket", path, "age", age)
	}
}

// removeStale removes the socket file id at path, if it is still that
// file, and reports whether it did.
func removeStale(path string, id fileID) (removed bool, err error) {
	if got, ok := statSocket(path); !ok || got != id {
		return false, nil
	}
	if err := os.Remove(path); err != nil {
		return false, err
	}
	return true, nil
}
