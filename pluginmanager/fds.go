package pluginmanager

import (
	"errors"
	"sync"
	"syscall"
	"time"
)

// File descriptors. The manager holds a connection to every registered (or
// observed) plugin, and handlers may hold more to the plugins' endpoints:
// at a limit of 1024 open files, a thousand plugins used them all, and then
// no new plugin could even be dialled. So the manager keeps a reserve of
// descriptors for dialling new registrations, of fdReserveOf(limit):
//
//   - it takes a connection into its set only if the process's open files
//     leave the reserve free with it; a plugin whose connection is not held
//     is watched by its probes alone (every ProbeInterval) until a later
//     look finds room, which is logged once and counted in
//     plugd_fd_reserve_hits_total;
//   - a dial that fails for want of descriptors (EMFILE, ENFILE) is not the
//     plugin's failure: the socket is tried again with backoff, as it was,
//     and that is logged once until a connection is made again, and
//     counted in plugd_fd_exhausted_total.
//
// Counting the open files costs a read of /dev/fd; it is done only near the
// limit, and then once every fdRecount admissions at most, counting the
// connections taken in meanwhile. The limit itself (a getrlimit call) is
// read again near it, at every admission, so that an operator who raises it
// (prlimit) is heard at once where it matters, and far from it once every
// fdLimitAge at most, so that one who lowers it is heard within that.
type fdReserve struct {
	limit func() int       // the open-file limit now; 0: none known
	open  func() int       // the files open now; negative: unknown
	now   func() time.Time // for the limit's age; nil: the limit is read at every admission

	mu          sync.Mutex
	limitRead   int       // the limit last read
	limitAt     time.Time // when; zero: never
	counted     int       // files open when last counted; 0: not counted
	heldCounted int       // connections held then
	since       int       // admissions since
	short       bool      // holding was refused for the reserve, and said so
	exhausted   bool      // a dial failed for want of descriptors, and said so
}

const fdRecount = 16

// fdLimitAge is how long a limit read far from it is used before it is read
// again.
const fdLimitAge = time.Second

// fdReserveOf is the number of descriptors kept free for new registrations
// at an open-file limit of limit.
func fdReserveOf(limit int) int { return max(64, limit/8) }

// admit reports whether one more connection may be held, with held held
// now, and whether that is a change from the last answer (to be logged),
// with the figures to log.
func (f *fdReserve) admit(held int) (ok, changed bool, open, limit int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	limit = f.limitLocked(held)
	if limit <= 0 {
		return true, false, 0, 0
	}
	reserve := fdReserveOf(limit)
	if far(held, limit) {
		return true, f.note(true, true), 0, limit // open: not counted
	}
	f.since++
	if f.counted == 0 || f.since >= fdRecount {
		if n := f.open(); n > 0 {
			f.counted, f.heldCounted, f.since = n, held, 0
		}
	}
	open = held + 2*reserve // unknown: guess, erring towards the reserve
	if f.counted > 0 {
		open = f.counted + held - f.heldCounted
	}
	ok = open+reserve <= limit
	return ok, f.note(ok, open+2*reserve <= limit), open, limit
}

// far reports whether, with held connections held, the process is far
// from an open-file limit of limit, however many files others hold (the
// status API serves at most a quarter of the limit; a handler holds about
// one connection a plugin): there is no need to count them.
func far(held, limit int) bool {
	return 2*held+limit/4+2*fdReserveOf(limit) < limit
}

// limitLocked is the open-file limit: the one last read if that was far
// from it with held connections held and is younger than fdLimitAge, else
// read now.
func (f *fdReserve) limitLocked(held int) int {
	if f.now == nil {
		return f.limit()
	}
	now := f.now()
	if f.limitAt.IsZero() || now.Sub(f.limitAt) >= fdLimitAge || f.limitRead > 0 && !far(held, f.limitRead) {
		f.limitRead, f.limitAt = f.limit(), now
	}
	return f.limitRead
}

// note records an answer of admit, and reports whether it changes what was
// said: short once holding is refused, not short once there is room for
// twice the reserve (so that an edge does not make the log flap).
func (f *fdReserve) note(ok, roomy bool) (changed bool) {
	switch {
	case !ok && !f.short:
		f.short = true
		return true
	case f.short && roomy:
		f.short = false
		return true
	}
	return false
}

// dialFailed reports whether err is a dial failing for want of
// descriptors, and whether that is news (to be logged).
func (f *fdReserve) dialFailed(err error) (outOfFDs, news bool) {
	if !errors.Is(err, syscall.EMFILE) && !errors.Is(err, syscall.ENFILE) {
		return false, false
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	news = !f.exhausted
	f.exhausted = true
	return true, news
}

// connected records that a connection was made: it reports whether dials
// had failed for want of descriptors until now (to be logged).
func (f *fdReserve) connected() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	was := f.exhausted
	f.exhausted = false
	return was
}

// mayHold reports whether a connection to the plugin at path may be taken
// into the set: yes if one is held for path already (it is replaced), and
// otherwise if that leaves the reserve free. A refusal is counted; the
// first of a run of them is logged, and so is the room found again.
func (c *client) mayHold(path string) bool {
	if c.conns.Get(path) != nil {
		return true
	}
	held := c.conns.Len()
	ok, changed, open, limit := c.fds.admit(held)
	if !ok {
		c.metrics.fdReserveHits.Inc()
	}
	switch {
	case changed && ok:
		c.log.Info("file descriptors free again: plugd holds idle connections to plugins again", "limit", limit, "held", held)
	case changed:
		c.log.Warn("file descriptors are short: plugd holds idle connections to no more plugins, so as to keep descriptors for new registrations, and watches the others by their probes alone (every probe interval); raise the open-file limit (LimitNOFILE= in the systemd unit, ulimit -n)",
			"open", open, "limit", limit, "reserve", fdReserveOf(limit), "held", held, "socket", path)
	}
	return ok
}

// outOfFDs reports whether err is a dial that failed for want of file
// descriptors: plugd's own shortage, not the plugin's failure. The first of
// a run is logged; each is counted.
func (c *client) outOfFDs(err error) bool {
	out, news := c.fds.dialFailed(err)
	if !out {
		return false
	}
	c.metrics.fdExhausted.Inc()
	if news {
		c.log.Warn("out of file descriptors: cannot connect to plugins, trying again with backoff; raise the open-file limit (LimitNOFILE= in the systemd unit, ulimit -n)",
			"limit", openFileLimit(), "held", c.conns.Len(), "err", printable(err.Error()))
	}
	return true
}

// connected records that a connection to a plugin was made.
func (c *client) connected() {
	if c.fds.connected() {
		c.log.Info("file descriptors available again: connecting to plugins", "held", c.conns.Len())
	}
}
