package pluginmanager

import (
	"encoding/binary"
	"errors"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/plugd/plugd/internal/unaryconn"
)

// hangups tells, at once, when the process behind a registered plugin's
// socket goes away, which a periodic probe would only notice up to an
// interval later. The manager keeps the connection it registered each plugin
// over, idle between probes, and a single epoll set (one goroutine for all of
// them, whatever their number) reports when any is hung up. The plugin is
// then probed at once: one that still answers (its server merely closed an
// idle connection) is watched again, on a new connection; one that does not
// is Unhealthy.
type hangups struct {
	epfd, wake int // the epoll set, and an eventfd in it that ends run
	onHangup   func(*hangup)

	mu     sync.Mutex
	next   int32
	byID   map[int32]*hangup
	closed bool
}

// hangup is one watched connection.
type hangup struct {
	id   int32
	path string
	conn *unaryconn.Conn
	fd   int // conn's socket; only used while conn is open and in the set
}

func newHangups(onHangup func(*hangup)) (*hangups, error) {
	epfd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return nil, err
	}
	wake, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		unix.Close(epfd)
		return nil, err
	}
	if err := unix.EpollCtl(epfd, unix.EPOLL_CTL_ADD, wake, &unix.EpollEvent{Events: unix.EPOLLIN, Pad: -1}); err != nil {
		unix.Close(wake)
		unix.Close(epfd)
		return nil, err
	}
	return &hangups{epfd: epfd, wake: wake, onHangup: onHangup, byID: make(map[int32]*hangup)}, nil
}

// watch takes conn, idle, into the set. On error conn is closed.
func (h *hangups) watch(path string, conn *unaryconn.Conn) (*hangup, error) {
	raw, err := conn.SyscallConn()
	if err != nil {
		conn.Close()
		return nil, err
	}
	fd := -1
	raw.Control(func(s uintptr) { fd = int(s) })
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		conn.Close()
		return nil, errors.New("manager stopping")
	}
	// An id is 32 bits (epoll's data), reused after 2^32 watches: skip
	// the ones in use and the eventfd's -1.
	for h.next++; h.next == -1 || h.byID[h.next] != nil; h.next++ {
	}
	w := &hangup{id: h.next, path: path, conn: conn, fd: fd}
	ev := unix.EpollEvent{Events: watchedEvents, Pad: w.id}
	if err := unix.EpollCtl(h.epfd, unix.EPOLL_CTL_ADD, fd, &ev); err != nil {
		conn.Close()
		return nil, err
	}
	h.byID[w.id] = w
	return w, nil
}

// take removes w from the set and hands its connection back, for a probe to
// use; nil if w was hung up or unwatched meanwhile. w may be nil.
func (h *hangups) take(w *hangup) *unaryconn.Conn {
	if w == nil {
		return nil
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.removeLocked(w) {
		return nil
	}
	return w.conn
}

// removeLocked takes w out of the set, and reports whether it was in it. It
// must come before anyone may close w's socket: a closed descriptor's number
// can be reused, and deleting it then would touch whatever it had become.
func (h *hangups) removeLocked(w *hangup) bool {
	if h.byID[w.id] != w {
		return false
	}
	delete(h.byID, w.id)
	unix.EpollCtl(h.epfd, unix.EPOLL_CTL_DEL, w.fd, nil)
	return true
}

// watching reports whether w is still in the set: not hung up, taken or
// unwatched.
func (h *hangups) watching(w *hangup) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.byID[w.id] == w
}

// unwatch stops watching w and closes its connection. w may be nil, and may
// have been unwatched already.
func (h *hangups) unwatch(w *hangup) {
	if w == nil {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.dropLocked(w)
}

func (h *hangups) dropLocked(w *hangup) {
	if h.removeLocked(w) {
		w.conn.Close()
	}
}

// watchedEvents are what the set waits for on each connection: the peer
// going, or the peer saying something (see run). One-shot: a connection is
// re-armed only once what it said has been handled.
const watchedEvents = unix.EPOLLIN | unix.EPOLLRDHUP | unix.EPOLLHUP | unix.EPOLLERR | unix.EPOLLONESHOT

// run reports hang-ups until close is called. A connection the peer wrote to
// while idle is handed to unaryconn's Idle: a PING is answered and the
// connection watched again; a GOAWAY (a plugin's server stopping, or closing
// idle connections) counts as a hang-up, and the connection is closed at once,
// which a gracefully stopping server waits for.
func (h *hangups) run() {
	events := make([]unix.EpollEvent, 64)
	for {
		n, err := unix.EpollWait(h.epfd, events, -1)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return
		}
		var hung, spoke []*hangup
		h.mu.Lock()
		for _, ev := range events[:n] {
			if ev.Pad == -1 {
				h.mu.Unlock()
				return // close
			}
			w := h.byID[ev.Pad]
			switch {
			case w == nil:
			case ev.Events&(unix.EPOLLRDHUP|unix.EPOLLHUP|unix.EPOLLERR) != 0:
				h.dropLocked(w)
				hung = append(hung, w)
			default:
				spoke = append(spoke, w)
			}
		}
		h.mu.Unlock()
		for _, w := range spoke {
			// Outside h.mu: Idle may wait a moment to write. A connection
			// dropped meanwhile fails Idle and is not re-armed: only one
			// still in the set is, whose descriptor is still its own.
			usable := w.conn.Idle()
			h.mu.Lock()
			if h.byID[w.id] == w {
				ev := unix.EpollEvent{Events: watchedEvents, Pad: w.id}
				if !usable || unix.EpollCtl(h.epfd, unix.EPOLL_CTL_MOD, w.fd, &ev) != nil {
					h.dropLocked(w)
					hung = append(hung, w)
				}
			}
			h.mu.Unlock()
		}
		for _, w := range hung {
			h.onHangup(w)
		}
	}
}

// close ends run and closes every watched connection. run must have been
// started, and close is called once, after which watch fails.
func (h *hangups) close() {
	h.mu.Lock()
	h.closed = true
	for _, w := range h.byID {
		h.dropLocked(w)
	}
	h.mu.Unlock()
	var one [8]byte
	binary.NativeEndian.PutUint64(one[:], 1)
	unix.Write(h.wake, one[:])
}

// release frees the epoll set and the eventfd, once run has returned.
func (h *hangups) release() {
	unix.Close(h.wake)
	unix.Close(h.epfd)
}
