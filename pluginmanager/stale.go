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
	r.reg.mu.Lock()
	defer r.reg.mu.Unlock()
	if err != nil && refused(err) {
		r.removeIfStaleLocked(e, now)
	}
	e.due = now.Add(r.opts.RemoveStaleAfter)
	return result{at: e.due}
}

// removeIfStaleLocked removes a Stale socket older than
// Options.RemoveStaleAfter, if set: a crashed plugin's leftover that nobody
// will come back for. Only the very file that was found stale is removed.
func (r *registrar) removeIfStaleLocked(e *entry, now time.Time) {
	if r.opts.RemoveStaleAfter <= 0 || now.Sub(e.status.Created) < r.opts.RemoveStaleAfter {
		return
	}
	if id, ok := statSocket(e.status.Socket); !ok || id != e.id {
		return
	}
	if err := os.Remove(e.status.Socket); err != nil {
		if !e.live.unremovable {
			e.live.unremovable = true // it is tried again at each retry: said once
			r.reg.warnLocked(e, now, "could not remove a stale socket", "socket", e.status.Socket, "err", err)
		}
		return
	}
	r.log.Info("removed a stale socket", "socket", e.status.Socket, "age", now.Sub(e.status.Created).Round(time.Second))
}
