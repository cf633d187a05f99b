package unaryconn

import (
	"errors"
	"io"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// On Linux the watched connections' sockets wait together, in one epoll set
// for the process, on one goroutine: a goroutine blocked in a read of each
// would cost its 2 KiB stack and 0.5 KiB of runtime state, 12 MiB at 5,000
// plugins, a quarter of plugd's memory there. When a socket is readable, a
// goroutine that lasts as long as reading what came takes a turn
// (pollStep), and arms the socket again: EPOLLONESHOT, so one turn at a
// time. The epoll set is itself waited on by Go's netpoller, like any
// socket, and exists while connections are watched: it is made for the
// first and closed with the last, so that nothing outlives them.

// procPoller is the process's epoll set, if connections are watched.
var procPoller struct {
	mu sync.Mutex
	p  *poller // nil while none is
}

// poller is an epoll set of watched sockets and the goroutine waiting on it.
type poller struct {
	fd int      // the epoll set
	f  *os.File // fd, in Go's netpoller; closed with the last watch

	// What follows is guarded by procPoller.mu.
	watches map[int32]*watch // by the id in their sockets' epoll data
	next    int32
}

// pollEvents is what a watched socket is waited for: anything to read, the
// peer's hang-up (EPOLLHUP and EPOLLERR come anyway), once.
const pollEvents = unix.EPOLLIN | unix.EPOLLRDHUP | unix.EPOLLONESHOT

// errWouldBlock is readNow's error when nothing has come.
var errWouldBlock = errors.New("nothing to read yet")

// pollLocked puts w's socket into the epoll set. On error the caller
// watches with a goroutine instead.
func (c *Conn) pollLocked(w *watch) error {
	procPoller.mu.Lock()
	defer procPoller.mu.Unlock()
	p := procPoller.p
	if p == nil {
		var err error
		if p, err = newPoller(); err != nil {
			return err
		}
		procPoller.p = p
	}
	for p.next++; p.next == 0 || p.watches[p.next] != nil; p.next++ {
	}
	w.p, w.id = p, p.next
	p.watches[w.id] = w
	if err := w.ctl(unix.EPOLL_CTL_ADD); err != nil {
		if f := p.removeLocked(w); f != nil {
			// A set that never held a socket: run has no event in
			// hand, so it is not waiting for procPoller.mu.
			f.Close()
		}
		w.p = nil
		return err
	}
	if len(c.rest) > 0 {
		// What the last call read past its answer will not make the
		// socket readable.
		go c.pollStep(w)
	}
	return nil
}

// unpollLocked takes w's socket out of the epoll set, and closes the set if
// it was the last.
func (c *Conn) unpollLocked(w *watch) {
	// Control refuses a socket that is closed (or closing): its
	// registration goes with it, once nothing else holds the socket open.
	w.ctl(unix.EPOLL_CTL_DEL)
	procPoller.mu.Lock()
	f := w.p.removeLocked(w)
	procPoller.mu.Unlock()
	if f != nil {
		// Not under procPoller.mu: Close waits for run to let go of the
		// set, and run may have an event in hand for which start waits
		// for the lock. run never takes c.mu.
		if hook := testHookPoll.Load(); hook != nil {
			(*hook)("close")
		}
		f.Close()
	}
}

// testHookPoll, if set, is called where run has events in hand ("start")
// and before the set is closed ("close").
var testHookPoll atomic.Pointer[func(where string)]

// ctl adds, arms again or deletes w's socket in the epoll set.
func (w *watch) ctl(op int) error {
	raw, err := w.c.nc.SyscallConn()
	if err != nil {
		return err
	}
	var cerr error
	err = raw.Control(func(fd uintptr) { // the socket stays open meanwhile
		ev := unix.EpollEvent{Events: pollEvents, Fd: w.id}
		cerr = unix.EpollCtl(w.p.fd, op, int(fd), &ev)
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
			c.unpollLocked(w)
			c.w = nil
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
		got, err := c.readNow(buf)
		c.readDoneLocked(n0, got)
		if c.closed || c.closing.Load() {
			continue
		}
		if err == errWouldBlock {
			if err = w.ctl(unix.EPOLL_CTL_MOD); err == nil {
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

// readNow reads what has come into buf, without waiting: errWouldBlock if
// nothing has.
func (c *Conn) readNow(buf []byte) (int, error) {
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
		if ferr := c.tookRead(n); ferr != nil {
			return got, ferr
		}
		if err != nil {
			return got, frameError("watching the idle connection", err)
		}
	}
	return got, nil
}

// newPoller makes an epoll set and starts its goroutine.
func newPoller() (*poller, error) {
	fd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return nil, os.NewSyscallError("epoll_create1", err)
	}
	if err := unix.SetNonblock(fd, true); err != nil {
		unix.Close(fd)
		return nil, err
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
		return nil, err
	}
	p := &poller{fd: fd, f: f, watches: make(map[int32]*watch)}
	go p.run(raw)
	return p, nil
}

// run waits for watched sockets to be readable and starts their turns,
// until the set is closed.
func (p *poller) run(raw syscall.RawConn) {
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
				if hook := testHookPoll.Load(); hook != nil {
					(*hook)("start")
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
func (p *poller) start(events []unix.EpollEvent) {
	procPoller.mu.Lock()
	defer procPoller.mu.Unlock()
	for _, ev := range events {
		// A watch that ended since has no turn; one that took its id
		// since has one for nothing, which only finds nothing to read.
		if w := p.watches[ev.Fd]; w != nil {
			go w.c.pollStep(w)
		}
	}
}

// removeLocked takes w out of p. With its last watch gone, p is the
// process's set no longer, and removeLocked returns its file for the caller
// to close once it has let go of procPoller.mu. procPoller.mu must be held.
func (p *poller) removeLocked(w *watch) *os.File {
	if p.watches[w.id] == w {
		delete(p.watches, w.id)
	}
	if len(p.watches) == 0 && procPoller.p == p {
		procPoller.p = nil
		return p.f
	}
	return nil
}
