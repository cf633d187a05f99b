// Package connset holds the idle connections the plugin manager keeps to
// registered plugins, and tells at once when one is hung up: the kernel
// closes a connection when the process behind it goes, which a periodic probe
// would only notice up to an interval later.
//
// A Set keeps at most one connection per registration socket path, idle
// between probes; a single epoll set (one goroutine for all of them,
// whatever their number) reports when any is hung up. A probe takes the
// connection out to use it and gives it back with Watch.
package connset

import (
	"encoding/binary"
	"errors"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/plugd/plugd/internal/unaryconn"
)

// Set is the connections watched, by socket path. Make one with New, start
// Run in a goroutine and end it with Close. Its methods are safe for
// concurrent use.
type Set struct {
	epfd, wake int // the epoll set, and an eventfd in it that ends Run
	onHangup   func(path string)
	done       chan struct{} // closed when Run returns

	mu     sync.Mutex
	next   int32
	byID   map[int32]*watched
	byPath map[string]*watched
	closed bool
}

// watched is one connection in the set.
type watched struct {
	id   int32
	path string
	conn *unaryconn.Conn
	fd   int // conn's socket; only used while conn is open and in the set
}

// ErrClosed is Watch's error once Close has been called.
var ErrClosed = errors.New("connset: closed")

// New returns an empty set. onHangup is called, from Run's goroutine and
// with no lock held, with the path of each connection that was hung up; the
// connection is out of the set and closed by then.
func New(onHangup func(path string)) (*Set, error) {
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
	return &Set{
		epfd: epfd, wake: wake, onHangup: onHangup, done: make(chan struct{}),
		byID: make(map[int32]*watched), byPath: make(map[string]*watched),
	}, nil
}

// Watch takes conn, idle, into the set for path, in place of any connection
// watched for path before (which is closed). The set owns conn from now on:
// on error it is closed.
func (s *Set) Watch(path string, conn *unaryconn.Conn) error {
	raw, err := conn.SyscallConn()
	if err != nil {
		conn.Close()
		return err
	}
	fd := -1
	raw.Control(func(sfd uintptr) { fd = int(sfd) })
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		conn.Close()
		return ErrClosed
	}
	if old := s.byPath[path]; old != nil {
		s.dropLocked(old)
	}
	// An id is 32 bits (epoll's data), reused after 2^32 watches: skip
	// the ones in use and the eventfd's -1.
	for s.next++; s.next == -1 || s.byID[s.next] != nil; s.next++ {
	}
	w := &watched{id: s.next, path: path, conn: conn, fd: fd}
	ev := unix.EpollEvent{Events: watchedEvents, Pad: w.id}
	if err := unix.EpollCtl(s.epfd, unix.EPOLL_CTL_ADD, fd, &ev); err != nil {
		conn.Close()
		return err
	}
	s.byID[w.id] = w
	s.byPath[path] = w
	return nil
}

// Watching reports whether a connection for path is in the set: watched,
// and neither hung up, taken nor unwatched since.
func (s *Set) Watching(path string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.byPath[path] != nil
}

// Take removes path's connection from the set and hands it back, open, for
// a probe to use; nil if there is none.
func (s *Set) Take(path string) *unaryconn.Conn {
	s.mu.Lock()
	defer s.mu.Unlock()
	w := s.byPath[path]
	if w == nil || !s.removeLocked(w) {
		return nil
	}
	return w.conn
}

// Unwatch closes path's connection, if the set has one.
func (s *Set) Unwatch(path string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if w := s.byPath[path]; w != nil {
		s.dropLocked(w)
	}
}

// removeLocked takes w out of the set, and reports whether it was in it. It
// must come before anyone may close w's socket: a closed descriptor's number
// can be reused, and deleting it then would touch whatever it had become.
func (s *Set) removeLocked(w *watched) bool {
	if s.byID[w.id] != w {
		return false
	}
	delete(s.byID, w.id)
	if s.byPath[w.path] == w {
		delete(s.byPath, w.path)
	}
	unix.EpollCtl(s.epfd, unix.EPOLL_CTL_DEL, w.fd, nil)
	return true
}

func (s *Set) dropLocked(w *watched) {
	if s.removeLocked(w) {
		w.conn.Close()
	}
}

// watchedEvents are what the set waits for on each connection: the peer
// going, or the peer saying something (see Run). One-shot: a connection is
// re-armed only once what it said has been handled.
const watchedEvents = unix.EPOLLIN | unix.EPOLLRDHUP | unix.EPOLLHUP | unix.EPOLLERR | unix.EPOLLONESHOT

// Run reports hang-ups until Close is called. A connection the peer wrote to
// while idle is handed to unaryconn's Idle: a PING is answered and the
// connection watched again; a GOAWAY (a plugin's server stopping, or closing
// idle connections) counts as a hang-up, and the connection is closed at once,
// which a gracefully stopping server waits for.
func (s *Set) Run() {
	defer close(s.done)
	events := make([]unix.EpollEvent, 64)
	for {
		n, err := unix.EpollWait(s.epfd, events, -1)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return
		}
		var hung, spoke []*watched
		s.mu.Lock()
		for _, ev := range events[:n] {
			if ev.Pad == -1 {
				s.mu.Unlock()
				return // Close
			}
			w := s.byID[ev.Pad]
			switch {
			case w == nil:
			case ev.Events&(unix.EPOLLRDHUP|unix.EPOLLHUP|unix.EPOLLERR) != 0:
				s.dropLocked(w)
				hung = append(hung, w)
			default:
				spoke = append(spoke, w)
			}
		}
		s.mu.Unlock()
		for _, w := range spoke {
			// Outside s.mu: Idle may wait a moment to write. A connection
			// dropped meanwhile fails Idle and is not re-armed: only one
			// still in the set is, whose descriptor is still its own.
			usable := w.conn.Idle()
			s.mu.Lock()
			if s.byID[w.id] == w {
				ev := unix.EpollEvent{Events: watchedEvents, Pad: w.id}
				if !usable || unix.EpollCtl(s.epfd, unix.EPOLL_CTL_MOD, w.fd, &ev) != nil {
					s.dropLocked(w)
					hung = append(hung, w)
				}
			}
			s.mu.Unlock()
		}
		for _, w := range hung {
			s.onHangup(w.path)
		}
	}
}

// Close ends Run, closes every connection in the set, waits for Run to
// return and frees the epoll set. Watch fails from then on. Run must have
// been started; Close is called once.
func (s *Set) Close() {
	s.mu.Lock()
	s.closed = true
	for _, w := range s.byID {
		s.dropLocked(w)
	}
	s.mu.Unlock()
	var one [8]byte
	binary.NativeEndian.PutUint64(one[:], 1)
	unix.Write(s.wake, one[:])
	<-s.done
	unix.Close(s.wake)
	unix.Close(s.epfd)
}
