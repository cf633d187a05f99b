package unaryconn

import (
	"time"

	"golang.org/x/net/http2"
)

// The acknowledgements a peer is owed (of its SETTINGS and PINGs) are not
// written the moment they are owed, each in a write of its own: they go out
// with the next thing written, a call's request most often, if that comes
// within ackDelay; else by themselves when ackDelay has passed (a timer
// while no call is in flight, a short read deadline while one waits for its
// answer). Each write saved is a read and a wake-up saved on the peer's side
// too: a registration (GetInfo, then NotifyRegistrationStatus) takes two
// writes rather than five.
//
// A SETTINGS ACK goes before any HEADERS written with it, so that the
// header block that follows it begins with the table size update it may
// call for (RFC 7541 §4.2: "in HTTP/2, this follows a settings
// acknowledgment"). PING ACKs go after a request's DATA: grpc-go's server
// sends a PING (for its BDP estimate) on the first DATA it reads while none
// of its PINGs is unanswered, so the ACK of the last one, read after the
// next request's DATA, spares the peer a PING and us its answer.
//
// RFC 9113 wants SETTINGS acknowledged "immediately", and nghttp2 closes a
// connection whose SETTINGS stay unacknowledged for 10 s; a PING has no such
// bound, but grpc-go's keepalive gives its answer 20 s by default. 20 ms is
// neither, and is what the gap between a registration's two calls needs in a
// burst: in bench's burst of 1000 on 2 cores, 97% of registrations took two
// writes with it, 79% with 5 ms.

// ackDelay is how long an acknowledgement may wait for something to go with
// (a Conn's ackDelay, which tests that need one to wait for the next call
// set on their own connection).
const ackDelay = 20 * time.Millisecond

// maxOwedPings bounds the PING ACKs kept owed: a peer that PINGs faster is
// answered as fast (and, while idle and watched, bounded as a flood).
const maxOwedPings = 16

// pingAckSize is the size of an encoded PING ACK: a frame header and 8 bytes.
const pingAckSize = 9 + 8

// owed is what the peer is owed, and the timer that sees it paid. A
// connection in use keeps one (Conn.acks) from the first time it owes
// something until it is idle and watched, or the timer has paid: an idle
// connection holds none. Conn.mu guards it.
type owed struct {
	settings int         // SETTINGS ACKs
	pings    []byte      // PING ACK frames, encoded
	since    time.Time   // when the oldest became owed
	timer    *time.Timer // made when first needed, then stopped and armed again
	armed    bool        // timer is set to fire
}

// owes reports whether the peer is owed an acknowledgement.
func (c *Conn) owes() bool {
	return c.acks != nil && (c.acks.settings > 0 || len(c.acks.pings) > 0)
}

// owedCount counts the acknowledgements owed.
func (c *Conn) owedCount() int {
	if c.acks == nil {
		return 0
	}
	return c.acks.settings + len(c.acks.pings)/pingAckSize
}

// oweSettingsAck owes the peer an acknowledgement of SETTINGS.
func (c *Conn) oweSettingsAck() {
	c.oweLocked()
	c.acks.settings++
}

// owePingAck owes the peer the acknowledgement of a PING with data.
func (c *Conn) owePingAck(data [8]byte) {
	c.oweLocked()
	c.acks.pings = append(c.acks.pings, 0, 0, 8, byte(http2.FramePing), byte(http2.FlagPingAck), 0, 0, 0, 0)
	c.acks.pings = append(c.acks.pings, data[:]...)
}

func (c *Conn) oweLocked() {
	if c.acks == nil {
		c.acks = new(owed)
	}
	if !c.owes() {
		c.acks.since = time.Now() // not c.now: what it bounds is the socket's and the peer's real time
	}
}

// oweDue is when what is owed must have gone.
func (c *Conn) oweDue() time.Time { return c.acks.since.Add(c.ackDelay) }

// tooManyOwed reports whether the acknowledgements owed should go now,
// whatever else is to come.
func (c *Conn) tooManyOwed() bool {
	return c.acks != nil && len(c.acks.pings) >= maxOwedPings*pingAckSize
}

// settingsAcksTo appends the SETTINGS ACKs owed to b, which then owes them
// no longer.
func (c *Conn) settingsAcksTo(b []byte) []byte {
	if c.acks == nil {
		return b
	}
	for ; c.acks.settings > 0; c.acks.settings-- {
		b = append(b, 0, 0, 0, byte(http2.FrameSettings), byte(http2.FlagSettingsAck), 0, 0, 0, 0)
	}
	return c.paidLocked(b)
}

// acksTo appends everything owed to b: the SETTINGS ACKs, then the PING
// ACKs.
func (c *Conn) acksTo(b []byte) []byte {
	if c.acks == nil {
		return b
	}
	b = c.settingsAcksTo(b)
	b = append(b, c.acks.pings...)
	c.acks.pings = c.acks.pings[:0]
	return c.paidLocked(b)
}

// paidLocked stops the timer once nothing is owed.
func (c *Conn) paidLocked(b []byte) []byte {
	if !c.owes() {
		if cap(c.acks.pings) > 4*pingAckSize {
			c.acks.pings = nil // what a burst of PINGs made is not kept
		}
		c.stopAckTimerLocked()
	}
	return b
}

// stopAckTimerLocked stops the timer, which is kept for the next time.
func (c *Conn) stopAckTimerLocked() {
	if c.acks != nil && c.acks.armed {
		if c.acks.timer.Stop() {
			c.timers.Done() // it will not run
		}
		c.acks.armed = false
	}
}

// idleAcksLocked lets go of what keeps track of acknowledgements, for a
// connection going idle that owes none.
func (c *Conn) idleAcksLocked() {
	if c.acks != nil && !c.acks.armed && !c.owes() {
		c.acks = nil
	}
}

// ackLaterLocked makes sure what is owed goes out by ackDelay after it
// became owed, if no call takes it before: the timer, while no call is in
// flight (a call pays what is owed, or waits for it with a read deadline).
func (c *Conn) ackLaterLocked() {
	if !c.owes() || c.acks.armed || c.broken != nil || c.closed {
		return
	}
	d := time.Until(c.oweDue())
	c.acks.armed = true
	c.timers.Add(1) // done by its run, or by a Stop that prevents it
	if c.acks.timer == nil {
		c.acks.timer = time.AfterFunc(d, c.ackTimer)
	} else {
		c.acks.timer.Reset(d)
	}
}

// ackTimer writes what is owed, unless a call paid it (which stops the
// timer). A firing that waited for c.mu while a call stopped the timer and
// armed it again writes what is owed then a little early: harmless. A
// failed write leaves the connection broken; a watch hears of it from its
// read, which the timer cuts short, and reports the hang-up from its own
// goroutine: the timer's never calls onHangup, so Close may wait for it.
func (c *Conn) ackTimer() {
	defer c.timers.Done()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.acks == nil || !c.acks.armed || c.broken != nil || c.closed {
		return
	}
	c.acks.armed = false
	err := c.writeAcksLocked()
	c.acks = nil // paid, or the connection is broken: no call is in flight to need it
	if err == nil || c.closing.Load() || c.w == nil {
		return // Close cut the write short, or the next call finds c.broken
	}
	if c.w.set != nil {
		// In the epoll set: a socket closed would leave it unseen, one
		// shut for reading is readable, at its end.
		c.nc.CloseRead()
		return
	}
	c.closeSocket() // a goroutine's read fails
}

// writeAcksLocked writes what is owed, now, while no call is in flight: a
// watched connection's (the watch or the timer), or an idle one's (the
// timer). A peer that does not read fails it soon (idleWriteTimeout), and
// leaves the connection broken. c.mu must be held.
func (c *Conn) writeAcksLocked() error {
	if !c.owes() {
		return nil
	}
	var buf [4 * pingAckSize]byte
	b := c.acksTo(buf[:0])
	// A peer that sends PINGs and reads nothing would fill the socket:
	// neither the watch, which a call may be waiting to take the socket
	// from, nor that call may wait long on it.
	c.nc.SetWriteDeadline(time.Now().Add(idleWriteTimeout))
	_, err := c.nc.Write(b)
	c.nc.SetWriteDeadline(time.Time{})
	if err != nil && c.broken == nil {
		c.broken = hangupError("acknowledging the peer's SETTINGS or PING: %v", err)
	}
	return c.broken
}
