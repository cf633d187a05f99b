package unaryconn

import (
	"bytes"
	"errors"
	"io"
	"time"

	"golang.org/x/net/http2"
	"google.golang.org/grpc/codes"
)

// Watch keeps an idle connection alive and tells when it ends: whenever
// the peer sends something, it is read and handled (PINGs and SETTINGS
// answered, window updates taken), and onHangup is called once when the
// connection ends while idle, with an error that matches
//
//   - ErrHangup: the peer closed or reset the connection, or sent GOAWAY
//     (a server stopping, or closing idle connections);
//   - ErrFlood: the peer sent more than an idle connection needs (more
//     than about 100 frames at once, or 10 a second, sustained);
//   - ErrProtocol: the peer sent what it may not send an idle connection
//     (an answer, when no call is in flight).
//
// The connection is closed by then (a gracefully stopping gRPC server waits
// for that). onHangup runs on a goroutine of p's and may call any method of
// c, Close included (but not p.Close); it may run while, or just after, a
// racing Close returns, but is never called for what Close did.
//
// p does the watching (see Poller): in its epoll set on Linux, with a
// goroutine elsewhere. A call made on a watched connection takes the socket
// from the watch and gives it back when it ends: what the watch had read of
// a frame is the call's to finish, and what the call read past its answer
// is the watch's. A call that leaves the connection unusable (its error says
// why, or Usable reports false after it) ends the watch with it, and
// onHangup is not called: the caller has heard already. So does the end of
// p (Poller.Close), which leaves the connection open, and not watched.
//
// Watch returns an error, and never calls onHangup, if c is unusable or
// already watched, or p is closed (ErrPollerClosed). It does not block
// (beyond waiting for a call in flight). A connection from Open with no call
// made yet sends its preface now; the peer's first frame must then be
// SETTINGS (else ErrProtocol and ErrHandshake).
//
// What the peer sends an idle, watched connection is acknowledged at once;
// what came with the end of a call's answer may wait a few milliseconds for
// the next call, to go with it (acks.go).
//
// pluginmanager holds every registered plugin's connection so (its
// internal/connset, which owns the Poller), on every platform.
func (c *Conn) Watch(p *Poller, onHangup func(err error)) error {
	if p == nil {
		return errors.New("unaryconn: Watch needs a Poller")
	}
	c.callMu.Lock()
	defer c.callMu.Unlock()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.broken != nil {
		return unusable(c.broken)
	}
	if c.onHangup != nil {
		return errors.New("unaryconn: the connection is already watched")
	}
	if c.preface {
		// From Open, with no call made yet: the connection opens now.
		if err := c.writePrefaceLocked(); err != nil {
			return err
		}
	}
	if onHangup == nil {
		onHangup = func(error) {}
	}
	c.onHangup, c.poller = onHangup, p
	c.flood = bucket{tokens: floodBurst, last: c.now()}
	if err := c.resumeWatchLocked(); err != nil {
		c.onHangup, c.poller = nil, nil
		return err
	}
	return nil
}

// watch is one run of the watch: from Watch, or the end of a call, to a
// hang-up, Close, or the next call. It is either in p's epoll set (set)
// or a goroutine's, blocked in a read (done is set).
type watch struct {
	c   *Conn
	p   *Poller
	id  int32     // its key in p (and in the epoll set)
	set *epollSet // the epoll set its socket is in (poll_linux.go); nil for a goroutine's

	stop bool          // a goroutine's: a call or Close wants the socket back; c.mu guards it
	done chan struct{} // a goroutine's: closed when it no longer touches the socket
	hdr  [9]byte       // what it reads into while nothing of a frame has come
}

// What a watched connection's peer may send: one token a read that returns
// something (a frame takes one or two), floodBurst at once, refilled at
// floodRate a second. A gRPC server sends an idle connection a few frames in
// its life (SETTINGS, a window update, keepalive PINGs, GOAWAY); the floods
// of issue 13 (WINDOW_UPDATE, RST_STREAM, unknown frames, large SETTINGS,
// a frame a byte at a time) cost over half a core per plugin unbounded.
const (
	floodBurst = 200
	floodRate  = 20
)

// bucket is a token bucket.
type bucket struct {
	tokens float64
	last   time.Time
}

// take takes a token at now, if there is one.
func (b *bucket) take(now time.Time) bool {
	b.tokens = min(floodBurst, b.tokens+now.Sub(b.last).Seconds()*floodRate)
	b.last = now
	if b.tokens < 1 {
		return false
	}
	b.tokens--
	return true
}

// resumeWatchLocked starts the watch of a watched connection that is still
// usable, in its poller; a watched connection that is not, or whose poller
// is closed, is no longer watched (and the error says why, for Watch).
func (c *Conn) resumeWatchLocked() error {
	if c.onHangup == nil || c.w != nil {
		return nil
	}
	if c.broken != nil || c.closed {
		c.onHangup = nil
		return unusable(c.broken)
	}
	c.idleAcksLocked()
	w := &watch{c: c, p: c.poller}
	if err := w.p.add(w); err != nil {
		c.onHangup = nil
		return err
	}
	c.w = w
	return nil
}

// stopWatchLocked takes the socket back from the watch, if one runs. A
// watch in the epoll set is taken out at once (its turns hold c.mu); a
// goroutine is told to stop, and waited for until it has let go: c.mu is
// unlocked meanwhile, so callers that must not let another call in hold
// c.callMu.
func (c *Conn) stopWatchLocked() {
	w := c.w
	if w == nil {
		return
	}
	if w.set != nil {
		// A turn at reading holds c.mu: none is under way.
		c.endWatchLocked(w)
		return
	}
	w.stop = true
	c.nc.SetReadDeadline(aLongTimeAgo) // cuts its read short; the call sets its own
	c.mu.Unlock()
	<-w.done
	c.mu.Lock()
}

// endWatchLocked ends w, the watch under way: it is taken out of its poller
// (and its socket out of the epoll set, before the socket may be closed and
// its number reused), and a goroutine's watch says it has let go. The
// connection stays watched (onHangup) for the next watch, after a call.
func (c *Conn) endWatchLocked(w *watch) {
	w.p.remove(w)
	c.w = nil
	if w.done != nil {
		close(w.done)
	}
}

// watch reads the idle connection until a call takes it back, Close, or a
// hang-up: a goroutine's watch. It reads exactly what completes the frame
// at hand, no further, so that nothing of what follows is read on its
// behalf while it waits: the peer's next frame stays in the socket for
// whoever reads next.
func (c *Conn) watch(w *watch) {
	c.mu.Lock()
	for {
		if w.stop || c.closed || c.closing.Load() {
			c.endWatchLocked(w)
			c.mu.Unlock()
			return
		}
		// Whole frames the last call read past its answer, or that came
		// complete; an incomplete one is kept.
		if !c.idleFrames(true) {
			if c.closing.Load() {
				continue // its write failed for Close
			}
			c.hangupLocked(w, c.broken)
			return
		}
		n0, buf := c.nextReadLocked(w)
		c.mu.Unlock()

		got, err := c.readWatched(w, buf)

		c.mu.Lock()
		c.readDoneLocked(n0, got)
		if w.stop || c.closed || c.closing.Load() {
			continue // handed back, with what was read of the frame
		}
		if err != nil {
			c.hangupLocked(w, err)
			return
		}
	}
}

// nextReadLocked returns where the watch reads next: exactly what completes
// the frame at hand (its header, or the rest of it), which it appends to
// c.rest, of which n0 bytes are there already.
func (c *Conn) nextReadLocked(w *watch) (n0 int, buf []byte) {
	n0 = len(c.rest)
	need := 9 - n0
	if n0 >= 9 {
		need = 9 + (int(c.rest[0])<<16 | int(c.rest[1])<<8 | int(c.rest[2])) - n0
	}
	if n0 == 0 {
		c.rest = w.hdr[:0] // no allocation while waiting for a frame
	} else if cap(c.rest)-n0 < need {
		c.rest = append(make([]byte, 0, n0+need), c.rest...)
	}
	return n0, c.rest[n0 : n0+need]
}

// readDoneLocked keeps the got bytes read into what nextReadLocked returned.
func (c *Conn) readDoneLocked(n0, got int) {
	c.rest = c.rest[:n0+got]
	if len(c.rest) == 0 {
		c.rest = nil
	}
}

// readWatched fills buf from the socket, for a goroutine's watch. It fails
// with ErrFlood as soon as the peer has sent more than the bucket allows.
func (c *Conn) readWatched(w *watch, buf []byte) (int, error) {
	got := 0
	for got < len(buf) {
		n, err := c.nc.Read(buf[got:])
		got += n
		if err := c.tookRead(w, n); err != nil {
			return got, err
		}
		if err != nil {
			return got, frameError("watching the idle connection", err)
		}
	}
	return got, nil
}

// tookRead counts a read of n bytes against what the peer may send: it
// fails with ErrFlood as soon as the peer has sent more than the bucket
// allows.
func (c *Conn) tookRead(w *watch, n int) error {
	if hook := w.p.hookRead; hook != nil {
		hook(n)
	}
	if n > 0 && !c.flood.take(c.now()) {
		return newError(codes.Unavailable, ErrFlood,
			"the peer sent an idle connection more than it needs (over %d frames at once, or %d a second); closed it",
			floodBurst/2, floodRate/2)
	}
	return nil
}

// hangupLocked ends the watch on a hang-up: the connection is closed and
// onHangup called, after c.mu is released.
func (c *Conn) hangupLocked(w *watch, err error) {
	if c.broken == nil {
		c.broken = err
	}
	err = c.broken
	c.endWatchLocked(w) // before the socket's number may be reused
	c.closeSocket()
	onHangup := c.onHangup
	c.onHangup = nil
	c.mu.Unlock()
	onHangup(err)
}

// idleFrames handles the complete frames in c.rest, keeping the rest of an
// incomplete one for later. c.mu must be held. What they call for (SETTINGS
// and PING ACKs) is written at once when the watch read them (ackNow): no
// call is likely to come within ackDelay to take it, and a peer may be
// waiting for it; what came with the end of a call's answer may wait for the
// next call (acks.go).
func (c *Conn) idleFrames(ackNow bool) bool {
	r := bytes.NewReader(c.rest)
	k := call{c: c, callIO: &callIO{fr: http2.NewFramer(io.Discard, r)}} // what it calls for is owed (acks.go), not written
	k.fr.SetMaxReadFrameSize(maxFrameSize)
	owed := c.owedCount()
	for r.Len() >= 9 {
		b := c.rest[len(c.rest)-r.Len():]
		if size := int(b[0])<<16 | int(b[1])<<8 | int(b[2]); size > maxFrameSize {
			c.broken = protocolError("the peer sent a frame of %d bytes", size)
			return false
		} else if r.Len() < 9+size {
			break
		}
		f, err := k.fr.ReadFrame()
		if err != nil {
			c.broken = frameError("reading what the peer sent an idle connection", err)
			return false
		}
		if !c.settled {
			if err := c.firstFrame(f); err != nil {
				c.broken = handshakeError(err)
				return false
			}
		}
		switch f := f.(type) {
		case *http2.SettingsFrame, *http2.PingFrame, *http2.WindowUpdateFrame, *http2.GoAwayFrame:
			k.handle(f)
		case *http2.PriorityFrame, *http2.UnknownFrame:
		case *http2.RSTStreamFrame:
			// A server may reset a stream it has answered in full (RFC
			// 9113 §8.1): harmless for a stream of ours that has ended.
			if f.StreamID >= c.next {
				c.broken = protocolError("the peer reset stream %d, which was never opened", f.StreamID)
				return false
			}
		default:
			c.broken = protocolError("the peer sent %v on an idle connection", f.Header().Type)
			return false
		}
	}
	// What is left is less than a frame (its size was checked above),
	// kept where it is if no frame came before it.
	if r.Len() == 0 {
		c.rest = nil
	} else if r.Len() < len(c.rest) {
		c.rest = append([]byte(nil), c.rest[len(c.rest)-r.Len():]...)
	}
	if c.broken == nil && (ackNow && c.owedCount() > owed || c.tooManyOwed()) {
		return c.writeAcksLocked() == nil
	}
	c.ackLaterLocked()
	return c.broken == nil
}
