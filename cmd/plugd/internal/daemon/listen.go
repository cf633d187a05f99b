package daemon

import (
	"context"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/plugd/plugd/internal/peercred"
)

// Bounds on what the status API's clients can make plugd hold. Anyone who
// can reach a listener (the socket's group, or whoever reaches status.tcp)
// can open connections and stop reading, so every connection is bounded
// and so is their number: a flood costs at most these, and never the file
// descriptors the manager needs for plugins' sockets.
const (
	// Connections served at once, on all listeners together: a quarter of
	// the file descriptors plugd may open, at least minStatusConns and at most
	// maxStatusConns, shared equally by the listeners. Beyond it a client
	// waits in the kernel's accept queue, which costs plugd no descriptor.
	minStatusConns = 16
	maxStatusConns = 256
	// sendBuffer is the kernel's send buffer of a status connection
	// (SO_SNDBUF; Linux doubles it): what a client that stops reading can
	// leave queued in the kernel, instead of TCP's autotuned 4 MiB.
	sendBuffer = 32 << 10
	// maxHeaderBytes bounds a request's header (net/http's default is 1 MiB);
	// the API's requests are a path and a short query.
	maxHeaderBytes = 8 << 10
	// answerBudget bounds the bytes of answers (JSON lists, a plugin,
	// metrics) held in memory while they are written, per listener: a
	// client that does not read pins its answer until writeDeadline.
	answerBudget = 4 << 20
	// readHeaderTimeout bounds a request's arrival; idleTimeout how long a
	// keep-alive connection may wait for the next one (and a full listener
	// closes idle ones sooner, see statusListener).
	readHeaderTimeout = 5 * time.Second
	idleTimeout       = 10 * time.Second
)

// statusConnLimit is how many connections each of n listeners serves at
// once, with nofile the file descriptors plugd may open (0: unknown).
func statusConnLimit(nofile uint64, n int) int {
	limit := maxStatusConns
	if nofile > 0 && nofile/4 < uint64(limit) {
		limit = max(int(nofile/4), minStatusConns)
	}
	return max(limit/max(n, 1), 1)
}

// statusListener is a status API listener that serves at most limit
// connections at once. When it is full, a new connection takes the place of
// an idle keep-alive one, so that idle clients cannot keep busy ones out.
// (golang.org/x/net/netutil.LimitListener bounds the count too, but hides
// the connection: the peer, the send buffer and the idle set need it.)
type statusListener struct {
	net.Listener
	slots   chan struct{} // one per connection open
	answers *answers      // of this listener's connections
	done    chan struct{} // closed by Close
	once    sync.Once
	idled   chan struct{} // a connection went idle

	mu   sync.Mutex
	idle map[*statusConn]struct{} // keep-alive connections waiting for a request; guarded by mu
}

func newStatusListener(l net.Listener, limit int) *statusListener {
	return &statusListener{
		Listener: l,
		slots:    make(chan struct{}, limit),
		answers:  newAnswers(),
		done:     make(chan struct{}),
		idled:    make(chan struct{}, 1),
		idle:     map[*statusConn]struct{}{},
	}
}

// Accept waits for a free place, closing idle connections to make one, then
// for a connection.
func (l *statusListener) Accept() (net.Conn, error) {
	for placed := false; !placed; {
		select {
		case l.slots <- struct{}{}:
			placed = true
			continue
		default:
		}
		l.closeAnIdle()
		select {
		case l.slots <- struct{}{}:
			placed = true
		case <-l.idled: // one went idle since: close it
		case <-l.done:
			return nil, net.ErrClosed
		}
	}
	c, err := l.Listener.Accept()
	if err != nil {
		<-l.slots
		return nil, err
	}
	if b, ok := c.(interface{ SetWriteBuffer(int) error }); ok {
		b.SetWriteBuffer(sendBuffer)
	}
	return &statusConn{Conn: c, l: l, peer: peerOf(c)}, nil
}

// Close stops Accept, also one that waits for a place.
func (l *statusListener) Close() error {
	l.once.Do(func() { close(l.done) })
	return l.Listener.Close()
}

// closeAnIdle closes one keep-alive connection that waits for a request, if
// there is one; its place is free once the server has let it go.
func (l *statusListener) closeAnIdle() {
	l.mu.Lock()
	defer l.mu.Unlock()
	for c := range l.idle {
		delete(l.idle, c)
		c.Close()
		return
	}
}

// connState keeps the listener's set of idle connections; it is the
// http.Server's ConnState hook.
func connState(c net.Conn, state http.ConnState) {
	sc, ok := c.(*statusConn)
	if !ok {
		return
	}
	sc.l.mu.Lock()
	defer sc.l.mu.Unlock()
	if state == http.StateIdle {
		sc.l.idle[sc] = struct{}{}
		select {
		case sc.l.idled <- struct{}{}:
		default:
		}
	} else {
		delete(sc.l.idle, sc)
	}
}

// statusConn is a connection of a statusListener; closing it frees its place.
type statusConn struct {
	net.Conn
	l    *statusListener
	peer string // who is at the other end, for per-client limits
	once sync.Once
}

func (c *statusConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() { <-c.l.slots })
	return err
}

// peerOf names the client at the other end of c for per-client limits: the
// uid of a unix socket's peer (where the system tells), the address of a TCP
// peer.
func peerOf(c net.Conn) string {
	switch a := c.RemoteAddr().(type) {
	case *net.TCPAddr:
		return "address " + a.IP.String()
	}
	if uc, ok := c.(*net.UnixConn); ok {
		if p, ok := peercred.Of(uc); ok {
			return "uid " + strconv.FormatUint(uint64(p.UID), 10)
		}
	}
	return "local"
}

type connKey struct{}

// connContext puts the connection in its requests' context; it is the
// http.Server's ConnContext hook.
func connContext(ctx context.Context, c net.Conn) context.Context {
	if sc, ok := c.(*statusConn); ok {
		return context.WithValue(ctx, connKey{}, sc)
	}
	return ctx
}

// connOf is the status connection r came on, nil when r did not come
// through a statusListener (a test calling the handler directly).
func connOf(r *http.Request) *statusConn {
	sc, _ := r.Context().Value(connKey{}).(*statusConn)
	return sc
}

// answers is what the answers written on one listener share: the turn to be
// built, one at a time, as building one holds a copy of every plugin's
// status; and the budget of bytes they hold while they are written.
type answers struct {
	building chan struct{}
	budget   *budget
}

func newAnswers() *answers {
	return &answers{building: make(chan struct{}, 1), budget: newBudget(answerBudget)}
}

// budget is a number of bytes shared by the answers being written.
type budget struct {
	mu   sync.Mutex
	free int // guarded by mu
	size int
}

func newBudget(size int) *budget { return &budget{free: size, size: size} }

// fits says whether n bytes could be taken now.
func (b *budget) fits(n int) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.free >= min(n, b.size)
}

// take takes n bytes, at most the whole budget (so that one answer larger
// than it can still be written, alone), and returns the function that gives
// them back; or false if there is no room.
func (b *budget) take(n int) (release func(), ok bool) {
	n = min(n, b.size)
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.free < n {
		return nil, false
	}
	b.free -= n
	var once sync.Once
	return func() {
		once.Do(func() {
			b.mu.Lock()
			b.free += n
			b.mu.Unlock()
		})
	}, true
}
