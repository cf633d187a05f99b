package kubeletstate

import (
	"maps"
	"time"
)

// Record is what the reads of the kubelet have shown, kept from one read
// to the next: the last good reading, why the last read failed, and what
// the runs of reads showed of each socket path and of the kubelet's
// process. The Watch keeps one; its zero value is a kubelet not read yet.
type Record struct {
	reading *Reading // the last good read; nil while none, or the kubelet is down
	problem *Problem // why the last read failed; nil after a good one
	// impostor says, when the last read found a listener at the kubelet's
	// address that is not the kubelet, who it is.
	impostor string
	// started is the kubelet's start time at the last good read, kept
	// across its downtime, to tell a restart; restarted says one was seen.
	started   time.Time
	restarted bool
	// gone says plugd saw the kubelet go (it was judged not running, or
	// its held connection ended) and has read none since: a certificate
	// that does not verify then is not the kubelet's (impostor).
	gone bool
	// presentSince is, by socket path, the first read of the current run
	// of reads in which the kubelet's actual state held it.
	presentSince map[string]time.Time
	// retrying is, by socket path, the first read of the current run of
	// reads in which the kubelet's desired state held it while its actual
	// state did not (a registration pending, or refused and backing off),
	// kept while the desired state holds it; dropped is the last read
	// that found a registration there gone while the desired state kept
	// the path (the kubelet registering it again).
	retrying, dropped map[string]time.Time
	// reads counts the reads that were recorded: what the evidence says
	// may have changed with each.
	reads uint64
}

// Read records a good read of the kubelet's metrics, r (with its devices,
// or without: then those of the last reading stay). It returns the
// kubelet's start before, if r shows it restarted since (zero if not).
func (rec *Record) Read(r Reading) (restartedFrom time.Time) {
	rec.reads++
	rec.problem, rec.impostor, rec.gone = nil, "", false
	if !rec.started.IsZero() && !r.Started.Equal(rec.started) {
		restartedFrom = rec.started
		rec.restarted = true
		rec.forget()
	}
	rec.started = r.Started
	rec.track(r.Registered, r.Seen, r.At)
	if r.Devices == nil && r.DevicesErr == nil && rec.reading != nil {
		r.Devices, r.DevicesErr = rec.reading.Devices, rec.reading.DevicesErr
	}
	rec.reading = &r
	return restartedFrom
}

// Failed records a read that failed for p; impostor, if not empty, says
// who answered that is not the kubelet. It says whether the reason
// changed. A kubelet that is not running has registered nothing, and the
// next one starts afresh.
func (rec *Record) Failed(p *Problem, impostor string) (changed bool) {
	rec.reads++
	was := rec.problem
	if was != nil && was.Reason == p.Reason {
		p.Since = was.Since
	}
	rec.problem, rec.impostor = p, impostor
	if p.Reason == ReasonNotRunning {
		rec.reading = nil
		rec.forget()
		rec.gone = true
	}
	return was == nil || was.Reason != p.Reason
}

// devicesRead records a read of the devices alone, in a copy of the
// reading: the one before may be in an Evidence being judged.
func (rec *Record) devicesRead(devs map[string]int, err error) {
	rec.reads++
	if rec.reading == nil {
		return
	}
	r := *rec.reading
	if err == nil {
		r.Devices = devs
	}
	r.DevicesErr = err
	rec.reading = &r
}

// track records what a read at now showed of each socket path: the
// kubelet's actual state (registered) and desired state (seen).
func (rec *Record) track(registered, seen map[string]bool, now time.Time) {
	if rec.presentSince == nil {
		rec.presentSince, rec.retrying, rec.dropped = map[string]time.Time{}, map[string]time.Time{}, map[string]time.Time{}
	}
	for p := range registered {
		if _, ok := rec.presentSince[p]; !ok {
			rec.presentSince[p] = now
		}
	}
	for p := range rec.presentSince {
		if !registered[p] {
			delete(rec.presentSince, p)
			if seen[p] {
				rec.dropped[p] = now
			}
		}
	}
	for p := range seen {
		if _, ok := rec.retrying[p]; !ok && !registered[p] {
			rec.retrying[p] = now
		}
	}
	for _, m := range []map[string]time.Time{rec.retrying, rec.dropped} {
		for p := range m {
			if !seen[p] {
				delete(m, p)
			}
		}
	}
}

// forget drops what the reads showed of each path: a kubelet that is not
// running has registered nothing, and the next one starts afresh.
func (rec *Record) forget() {
	clear(rec.presentSince)
	clear(rec.retrying)
	clear(rec.dropped)
}

// Evidence is what the record holds now, a copy.
func (rec *Record) Evidence() Evidence {
	e := Evidence{Reading: rec.reading, Problem: rec.problem, Restarted: rec.restarted, Reads: rec.reads, Impostor: rec.impostor,
		presentSince: maps.Clone(rec.presentSince), retrying: maps.Clone(rec.retrying), dropped: maps.Clone(rec.dropped)}
	if e.Problem != nil {
		p := *e.Problem
		e.Problem = &p
	}
	return e
}

// Evidence is what the reads of the kubelet have shown, at one instant:
// what kubenode judges the plugins by.
type Evidence struct {
	// Reading is the last good read (nil while none, or the kubelet is
	// not running); Problem why the last read failed (nil after a good
	// one). Both may be set: a reading, then reads that fail.
	Reading *Reading
	Problem *Problem
	// Restarted says the reads saw the kubelet restart.
	Restarted bool
	// Reads counts the reads: the same count, the same evidence.
	Reads uint64
	// DevicesAt is the last read of pod-resources (with the metrics, or
	// alone).
	DevicesAt time.Time
	// Impostor, with Problem's reason ReasonNotRunning, says who answers
	// at the kubelet's address that is not the kubelet.
	Impostor string

	presentSince, retrying, dropped map[string]time.Time
}

// PresentSince is the first read of the current run of reads in which the
// kubelet's actual state held socket (zero: it does not).
func (e Evidence) PresentSince(socket string) time.Time { return e.presentSince[socket] }

// Credited says the kubelet's registration at socket's path, which the
// reading holds, is of the socket made at created, not of an older
// socket at that path.
func (e Evidence) Credited(socket string, created time.Time) bool {
	switch {
	case e.Reading == nil:
		return false
	case !e.Reading.Registered[socket]:
		return e.Reregistering(socket, created)
	}
	return credited(created, pathRun{present: e.presentSince[socket], retrying: e.retrying[socket], dropped: e.dropped[socket]}, e.Reading.At)
}

// Reregistering says the kubelet's actual state dropped its registration
// at socket's path, after the socket was made, while its desired state
// kept the path, less than Settle before the reading: its reconciler
// registering the path again, which it does in its next pass. It does so
// when a registration it began before the socket was made (a retry of a
// refused one, blocked dialling) reached the new socket and succeeded
// with the older socket's timestamp; the reads may not have seen that
// retry begin. Credited counts such a path as registered for that pass,
// so that the condition does not follow the kubelet's bookkeeping; a
// registration not back within Settle is lost.
func (e Evidence) Reregistering(socket string, created time.Time) bool {
	r, dropped := e.Reading, e.dropped[socket]
	return r != nil && r.Seen[socket] && !r.Registered[socket] && dropped.After(created) && r.At.Before(dropped.Add(Settle))
}

// pathRun is what the kubelet's reads showed of one socket path: since
// when it has held a registration there, since when it had the path
// without registering it, when it last dropped a registration there.
type pathRun struct {
	present, retrying, dropped time.Time
}

// credited says a registration at a socket's path is of the socket made
// at created, as a read at readAt shows it.
//
// One that began before the socket was made is an older socket's, until
// the kubelet has had time to replace it (Settle). One that began after
// it is the socket's, unless the kubelet was already retrying a
// registration at that path when the socket was made (it refused the
// older one, or could not reach it): that retry, begun with the older
// socket's timestamp, may be what succeeded, against the new socket, and
// the kubelet then registers the path again in its next passes. Such a
// registration counts once it has held for Settle, or once the kubelet
// has dropped one there since the socket was made (the registration
// again, which is the socket's).
func credited(created time.Time, run pathRun, readAt time.Time) bool {
	switch {
	case !run.present.After(created):
		return !readAt.Before(created.Add(Settle))
	case run.retrying.IsZero() || run.retrying.After(created) || run.dropped.After(created):
		return true
	default:
		return !readAt.Before(run.present.Add(Settle))
	}
}
