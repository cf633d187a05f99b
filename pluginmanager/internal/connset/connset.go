// Package connset holds the idle connections the plugin manager keeps to
// plugins, one per registration socket path, and tells at once when one is
// hung up: the kernel closes a connection when the process behind it goes,
// and a gRPC server that stops sends GOAWAY, both of which a periodic probe
// would only notice up to an interval later.
//
// Each connection is watched by unaryconn's Watch, which answers the peer's
// PINGs and SETTINGS and bounds what the peer may send, with the set's own
// unaryconn.Poller: on Linux every socket waits in its one epoll set (about
// 0.1 KiB a connection), elsewhere a goroutine each waits in a small read
// (about 3 KiB; bench/README.md). Close stops the Poller and waits for its
// goroutines. A call may be made on a connection in the set (Get): the
// watch hands the socket over for the call and takes it back after.
package connset

import (
	"errors"
	"sync"

	"github.com/plugd/plugd/internal/unaryconn"
)

// Set is the connections held, by socket path. Make one with New and end it
// with Close. Its methods are safe for concurrent use.
type Set struct {
	onHangup func(path string, err error)
	poller   *unaryconn.Poller // watches every connection in the set; its goroutines call onHangup

	mu     sync.Mutex
	byPath map[string]*unaryconn.Conn
	closed bool
}

// ErrClosed is Watch's error once Close has been called.
var ErrClosed = errors.New("connset: closed")

// New returns an empty set; nothing runs until a connection is watched.
// onHangup is called, from a goroutine of the set's Poller and with no lock
// held, with the path of each
// connection the peer hung up and why (an error matching unaryconn.ErrHangup,
// ErrFlood or ErrProtocol); the connection is out of the set and closed by
// then. It is never called for a connection the set closed itself
// (replaced, Unwatch, Close), nor once Close has returned.
func New(onHangup func(path string, err error)) *Set {
	return &Set{onHangup: onHangup, poller: unaryconn.NewPoller(unaryconn.PollerOptions{}), byPath: make(map[string]*unaryconn.Conn)}
}

// Watch takes conn into the set for path, in place of any connection held
// for path before (which is closed), and watches it. The set owns conn from
// now on: on error it is closed. Watching the connection the set already
// holds for path does nothing: it is still watched after a call made on it.
func (s *Set) Watch(path string, conn *unaryconn.Conn) error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		conn.Close()
		return ErrClosed
	}
	old := s.byPath[path]
	if old == conn {
		s.mu.Unlock()
		return nil
	}
	s.byPath[path] = conn
	s.mu.Unlock()
	if old != nil {
		old.Close()
	}
	if err := conn.Watch(s.poller, func(err error) { s.hungUp(path, conn, err) }); err != nil {
		s.mu.Lock()
		if s.byPath[path] == conn {
			delete(s.byPath, path)
		}
		s.mu.Unlock()
		conn.Close()
		return err
	}
	return nil
}

// hungUp is conn's watch ending on the peer's account.
func (s *Set) hungUp(path string, conn *unaryconn.Conn, err error) {
	s.mu.Lock()
	if s.closed || s.byPath[path] != conn {
		s.mu.Unlock()
		return
	}
	delete(s.byPath, path)
	s.mu.Unlock()
	s.onHangup(path, err) // on the Poller's goroutine, which Close waits for
}

// Watching reports whether the set holds a usable connection for path:
// neither hung up, closed nor left unusable by a call since.
func (s *Set) Watching(path string) bool {
	s.mu.Lock()
	c := s.byPath[path]
	s.mu.Unlock()
	return c != nil && c.Usable()
}

// Get returns the connection held for path, nil if there is none, for a call
// to be made on it; it stays in the set. A call that leaves it unusable ends
// its watch (no hang-up is reported: the caller has its error), and the
// caller then replaces it (Watch) or drops it (Unwatch).
func (s *Set) Get(path string) *unaryconn.Conn {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.byPath[path]
}

// Len is the number of connections held.
func (s *Set) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.byPath)
}

// Unwatch closes path's connection, if the set has one.
func (s *Set) Unwatch(path string) {
	s.mu.Lock()
	c := s.byPath[path]
	delete(s.byPath, path)
	s.mu.Unlock()
	if c != nil {
		c.Close()
	}
}

// Close closes every connection in the set and stops its Poller, and
// returns once every goroutine the Poller started has returned, onHangup
// calls included. Watch fails from then on. It may be called more than
// once.
func (s *Set) Close() {
	s.mu.Lock()
	s.closed = true
	conns := make([]*unaryconn.Conn, 0, len(s.byPath))
	for _, c := range s.byPath {
		conns = append(conns, c)
	}
	clear(s.byPath)
	s.mu.Unlock()
	for _, c := range conns {
		c.Close()
	}
	s.poller.Close()
}
