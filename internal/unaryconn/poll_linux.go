package unaryconn

import (
	"errors"
	"io"
	"os"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// epollSet is a Poller's epoll set of watched sockets (see Poller), waited
// on by a goroutine of the Poller's (run).
type epollSet struct {
	fd     int      // the epoll set
	f      *os.File // fd, in Go's netpoller; closed with the last socket
	polled int      // the sockets in it
}

// pollEvents is what a watched socket is waited for: anything to read, the
// peer's hang-up (EPOLLHUP and EPOLLERR come anyway), once.
const pollEvents = unix.EPOLLIN | unix.EPOLLRDHUP | unix.EPOLLONESHOT

// errWouldBlock is readNow's error when nothing has come.
var errWouldBlock = errors.New("nothing to read yet")

// pollLocked puts w's socket into the epoll set, made if there is none. On
// error the caller watches with a goroutine instead. p.mu must be held.
func (p *Poller) pollLocked(w *watch) error {
	if p.set == nil {
		s, raw, err := newEpollSet()
		if err != nil {
			return err
		}
		p.set = s
		p.goLocked(func() { p.run(raw) })
	}
	if err := w.ctl(p.set, unix.EPOLL_CTL_ADD); err != nil {
		if p.set.polled == 0 {
			// A set that never held a socket: run has no event in hand,
			// so it is not waiting for p.mu.
			p.set.f.Close()
			p.set = nil
		}
		return err
	}
	p.set.polled++
	w.set = p.set
	return nil
}

// unpoll takes w's socket out of the epoll set, and closes the set if it was
// the last.
func (p *Poller) unpoll(w *watch) {
	s := w.set
	// Control refuses a socket that is closed (or closing): its
	// registration goes with it, once nothing else holds the socket open.
	w.ctl(s, unix.EPOLL_CTL_DEL)
	p.mu.Lock()
	s.polled--
	last := s.polled == 0
	if last && p.set == s {
		p.set = nil
	}
	p.mu.Unlock()
	if last {
		// Not under p.mu: Close waits for run to let go of the set, and
		// run may have an event in hand for which start waits for the
		// lock. run never takes a Conn's mu.
		if hook := p.hookPoll; hook != nil {
			hook("close")
		}
		s.f.Close()
	}
}

// ctl adds, arms again or deletes w's socket in the epoll set s.
func (w *watch) ctl(s *epollSet, op int) error {
	raw, err := w.c.nc.SyscallConn()
	if err != nil {
		return err
	}
	var cerr error
	err = raw.Control(func(fd uintptr) { // the socket stays open meanwhile
		ev := unix.EpollEvent{Events: pollEvents, Fd: w.id}
		cerr = unix.EpollCtl(s.fd, op, int(fd), &ev)
	})
	if err != nil {
		return err
	}
	if cerr != nil {
		return os.NewSyscallError("epoll_ctl", cerr)
	}
	return nil
}

// pollStep is a turn of a watch in the epoll set, its socket being readable:
// it reads what has come, as the goroutine does (the rest of the frame at
// hand, no further), handles the frames completed, and arms the socket
// again, or ends the watch at a hang-up. It holds c.mu throughout: none of
// its reads waits.
func (c *Conn) pollStep(w *watch) {
	c.mu.Lock()
	if c.w != w {
		c.mu.Unlock() // ended meanwhile
		return
	}
	for {
		if c.closed || c.closing.Load() {
			c.endWatchLocked(w)
			c.mu.Unlock()
			return
		}
		if !c.idleFrames(true) {
			if c.closing.Load() {
				continue // its write failed for Close
			}
			c.hangupLocked(w, c.broken)
			return
		}
		n0, buf := c.nextReadLocked(w)
		got, err := c.readNow(w, buf)
		c.readDoneLocked(n0, got)
		if c.closed || c.closing.Load() {
			continue
		}
		if err == errWouldBlock {
			if err = w.rearm(); err == nil {
				c.mu.Unlock()
				return
			}
			if c.closing.Load() {
				continue
			}
			err = hangupError("watching the idle connection: %v", err)
		}
		if err != nil {
			c.hangupLocked(w, err)
			return
		}
	}
}

// rearm arms w's socket in the epoll set again, for its next turn.
func (w *watch) rearm() error { return w.ctl(w.set, unix.EPOLL_CTL_MOD) }

// readNow reads what has come into buf, without waiting: errWouldBlock if
// nothing has.
func (c *Conn) readNow(w *watch, buf []byte) (int, error) {
	raw, err := c.nc.SyscallConn()
	if err != nil {
		return 0, frameError("watching the idle connection", err)
	}
	got := 0
	for got < len(buf) {
		var n int
		var rerr error
		err = raw.Read(func(fd uintptr) bool {
			for {
				n, rerr = unix.Read(int(fd), buf[got:])
				if rerr != unix.EINTR {
					return true // never wait: only what has arrived
				}
			}
		})
		switch {
		case err != nil:
		case rerr == unix.EAGAIN:
			if got == 0 {
				return 0, errWouldBlock
			}
			return got, nil
		case rerr != nil:
			err = rerr
		case n == 0:
			err = io.EOF
		}
		n = max(n, 0)
		got += n
		if ferr := c.tookRead(w, n); ferr != nil {
			return got, ferr
		}
		if err != nil {
			return got, frameError("watching the idle connection", err)
		}
	}
	return got, nil
}

// newEpollSet makes an epoll set, in Go's netpoller.
func newEpollSet() (*epollSet, syscall.RawConn, error) {
	fd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return nil, nil, os.NewSyscallError("epoll_create1", err)
	}
	if err := unix.SetNonblock(fd, true); err != nil {
		unix.Close(fd)
		return nil, nil, err
	}
	f := os.NewFile(uintptr(fd), "epoll")
	// An *os.File is waited on by the netpoller only if it accepted it;
	// one it did not refuses deadlines.
	raw, err := f.SyscallConn()
	if err == nil {
		err = f.SetReadDeadline(time.Time{})
	}
	if err != nil {
		f.Close()
		return nil, nil, err
	}
	return &epollSet{fd: fd, f: f}, raw, nil
}

// run waits for the watched sockets of the set raw is to be readable and
// starts their turns, until the set is closed.
func (p *Poller) run(raw syscall.RawConn) {
	var events [64]unix.EpollEvent
	for {
		err := raw.Read(func(fd uintptr) bool {
			for {
				n, err := unix.EpollWait(int(fd), events[:], 0)
				if err == unix.EINTR {
					continue
				}
				if n <= 0 {
					return false // wait until the set is readable again
				}
				if hook := p.hookPoll; hook != nil {
					hook("start")
				}
				p.start(events[:n])
			}
		})
		if err != nil {
			return // closed: the last watch has ended
		}
	}
}

// start starts the turns of the watches of events.
func (p *Poller) start(events []unix.EpollEvent) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, ev := range events {
		// A watch that ended since has no turn; one that took its id
		// since has one for nothing, which only finds nothing to read.
		if w := p.watches[ev.Fd]; w != nil && w.set != nil {
			p.goLocked(func() { w.c.pollStep(w) })
		}
	}
}
