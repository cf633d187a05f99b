// Package unaryconn makes unary gRPC calls over one HTTP/2 connection to a
// unix socket, one call at a time, and watches the connection while it is
// idle.
//
// The plugin manager holds a connection to every registered plugin, to hear
// at once when the plugin goes away, and to call it again cheaply. A grpc-go
// ClientConn costs about half a millisecond of CPU to set up and five
// goroutines and about 45 KiB for as long as it is open, the standard
// library's HTTP/2 ClientConn one goroutine and about 20 KiB; a Conn, while
// no call is in flight, is a socket, a header decoder and a few counters;
// once watched (Watch), its socket waits with the others in the epoll set
// of a Poller, which its holder owns, on Linux (a goroutine blocked in a
// small read elsewhere): about 2.3 KiB of resident memory in all at 5,000
// connections on Linux, 5.3 KiB with a goroutine each. bench/README.md has
// the figures, measured side by side.
//
// HTTP/2 framing and header compression are golang.org/x/net/http2's; this
// package adds what a unary call needs on top of them: the gRPC message
// prefix (gzip answers included), the deadline sent as grpc-timeout, the
// status read from trailers, flow-control credit, and answers to the peer's
// SETTINGS and PING. Failures are gRPC status errors with the codes grpc-go
// would give, and match sentinels that say what to do next (ErrProtocol,
// ErrHangup, ErrMaybeDelivered, ErrHandshake, ErrFlood). It is plugd's one
// transport of calls to plugins: it speaks what the servers of the interop
// suite send (test/interop: grpc-go old and new, Python grpcio, Node
// grpc-js, and a scripted server that does what those do not); whatever it
// does not speak is ErrProtocol, and a failure of the call.
//
// Every write and read saved counts twice, here and in the plugin's server,
// when thousands of plugins register at once on a small machine. So a
// connection made for a call (Open) sends the call's request with its
// connection preface, and reads the peer's SETTINGS with the answer, instead
// of waiting for them first (NewConn and Dial wait, for a caller that must
// know the peer answered); and the acknowledgements the peer is owed go with
// the next request, or after at most a few milliseconds by themselves
// (acks.go). A registration, GetInfo then NotifyRegistrationStatus on a new
// connection to a grpc-go server, takes two writes: it took five.
//
// The files by concern: conn.go the connection (Dial, NewConn, Open, its
// handshake and SETTINGS, Close); call.go a call (Invoke) and the frames it
// reads; grpcwire.go what gRPC puts in HTTP/2 headers and trailers; acks.go
// the acknowledgements owed to the peer; deadline.go how a context's end
// cuts a read short; watch.go the watch of an idle connection, poller.go
// and poll_*.go the Poller that runs the watches; errors.go what went
// wrong, and the sentinels that say so.
package unaryconn

import (
	"bytes"
	"context"
	"errors"
	"math"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// Limits on what the peer may send, whatever a caller allows.
const (
	maxFrameSize      = 16 << 10 // HTTP/2's default SETTINGS_MAX_FRAME_SIZE, which we never raise
	maxHeaderListSize = 16 << 20 // headers or trailers of one answer, decoded, as HTTP/2 counts them: grpc-go's client default
	streamWindow      = 1 << 18  // our SETTINGS_INITIAL_WINDOW_SIZE: room for any answer a caller may accept
	connWindow        = 1 << 20  // our connection-level receive window
	defaultWindow     = 65535    // HTTP/2's initial window, until SETTINGS say otherwise
	maxStreamID       = 1<<31 - 1
)

// MaxRecvSize is the largest answer a caller may accept: beyond it the
// stream's flow-control window could not hold the answer.
const MaxRecvSize = streamWindow - 5

// Conn is one HTTP/2 connection carrying unary gRPC calls. Calls are made one
// at a time; a call that finds another in flight waits for it. All methods
// are safe for concurrent use.
type Conn struct {
	nc        *net.UnixConn
	closeOnce sync.Once // closes nc: Close, or the watch at a hang-up
	closeErr  error

	callMu sync.Mutex // held for a call's length: one at a time

	// mu guards what follows. A call holds it while it runs; the watch
	// (see Watch) holds it while it reads without waiting and handles
	// what it read, not while it waits to read.
	mu          sync.Mutex
	dec         *hpack.Decoder // the peer's header compression state, which lasts as long as the connection
	rest        []byte         // bytes read past the last call's last frame
	next        uint32         // the next stream ID
	sendConn    int64          // what the peer's connection window lets us send
	sendInit    int64          // the peer's SETTINGS_INITIAL_WINDOW_SIZE
	credit      uint32         // DATA received and not yet given back to the peer's window
	frameSize   uint32         // the peer's SETTINGS_MAX_FRAME_SIZE
	maxStreams  uint32         // the peer's SETTINGS_MAX_CONCURRENT_STREAMS
	acks        *owed          // the acknowledgements the peer is owed (acks.go)
	preface     bool           // Open: our connection preface is still to be sent, with the first call
	settled     bool           // the peer's first SETTINGS have come
	handshakeBy time.Time      // Open: when they must have come by, if before a call's deadline
	goAway      *callError     // the peer's GOAWAY, if one came
	tableUpdate bool           // our next header block begins with our table's size: the connection's first, and the first after the peer's SETTINGS_HEADER_TABLE_SIZE
	broken      error          // why no further call can be made; set once
	closed      bool           // Close was called
	closing     atomic.Bool    // Close was called: set before it closes the socket, which the watch may see first

	onHangup func(error) // Watch's callback, while the connection is watched
	poller   *Poller     // Watch's, which watches it while it is idle
	w        *watch      // the watch of the idle connection, if one runs
	flood    bucket      // what the peer may still send a watched connection

	timers sync.WaitGroup // the acknowledgement timer's runs, armed or under way (acks.go)

	now      func() time.Time // the clock; tests set their own
	ackDelay time.Duration    // how long what is owed waits for a call (ackDelay); tests set their own
}

// Dial connects to the unix socket at path and opens an HTTP/2 connection on
// it, as a gRPC client does: it returns once the peer has answered with its
// SETTINGS, so a socket that accepts and says nothing, or says something other
// than HTTP/2, fails here, at ctx's deadline or at once.
func Dial(ctx context.Context, path string) (*Conn, error) {
	var d net.Dialer
	nc, err := d.DialContext(ctx, "unix", path)
	if err != nil {
		return nil, err
	}
	return NewConn(ctx, nc.(*net.UnixConn))
}

// NewConn opens an HTTP/2 connection on nc, a unix socket connection the
// caller made its own way (through a path that cannot follow a swapped
// symlink, say), as Dial does after connecting: it returns once the peer has
// answered, which a connection that is only to be watched needs to know. The
// Conn owns nc from then on: it is closed if the handshake fails. Its errors
// match ErrHandshake.
func NewConn(ctx context.Context, nc *net.UnixConn) (*Conn, error) {
	c := newConn(nc)
	if err := c.handshake(ctx); err != nil {
		c.nc.Close()
		if errors.Is(err, os.ErrDeadlineExceeded) {
			// The socket's deadline is ctx's (or ctx's end cut it short),
			// and may fire a moment before ctx reports it.
			<-ctx.Done()
		}
		if ctx.Err() != nil {
			err = contextError(ctx.Err())
		}
		return nil, handshakeError(err)
	}
	return c, nil
}

// Open starts an HTTP/2 connection on nc, as NewConn does, without waiting
// for the peer: our connection preface goes out with the first call's
// request, in one write, and the peer's SETTINGS are read with its answer
// (RFC 9113 §3.4 lets a client send frames right after its preface). That
// saves a round trip, a write and a read on each side, where a connection is
// made for a call.
//
// The peer's SETTINGS must have come by handshakeDeadline (if not zero, and
// before the call's deadline). If the first call fails before they came
// (the peer said nothing, hung up, or is not HTTP/2), its error matches
// ErrHandshake and says what NewConn would have said. A peer that hung up
// or is not HTTP/2 acted on nothing (an HTTP/2 server sends its SETTINGS
// before anything else); one that said nothing by the deadline may still
// read the request, sent with the preface, and act on it: that error also
// matches ErrMaybeDelivered. A call that must not reach the peer twice is
// better made on a connection from NewConn. A stream refused because it was sent before the peer's
// SETTINGS_MAX_CONCURRENT_STREAMS was known is sent again once allowed.
//
// The Conn owns nc, as NewConn's does.
func Open(nc *net.UnixConn, handshakeDeadline time.Time) *Conn {
	c := newConn(nc)
	c.preface = true
	c.handshakeBy = handshakeDeadline
	return c
}

func newConn(nc *net.UnixConn) *Conn {
	c := &Conn{
		nc:         nc,
		dec:        hpack.NewDecoder(4096, nil),
		next:       1,
		sendConn:   defaultWindow,
		sendInit:   defaultWindow,
		frameSize:  maxFrameSize,
		maxStreams: math.MaxUint32, // unlimited until the peer says
		// The connection's first header block says that our table is
		// empty (0): a peer that lowered its table's size may insist on
		// it there, even in a block sent before its SETTINGS could be
		// read (RFC 7541 asks it only after they are acknowledged). It is
		// always allowed, and costs a byte.
		tableUpdate: true,
		now:         time.Now,
		ackDelay:    ackDelay,
	}
	c.dec.SetMaxStringLength(maxHeaderListSize)
	return c
}

// writePreface queues our connection preface: the magic string, our
// SETTINGS and the connection window we give.
func writePreface(b *bytes.Buffer, fr *http2.Framer) {
	b.WriteString(http2.ClientPreface)
	fr.WriteSettings(
		http2.Setting{ID: http2.SettingEnablePush, Val: 0},
		http2.Setting{ID: http2.SettingInitialWindowSize, Val: streamWindow},
		http2.Setting{ID: http2.SettingMaxHeaderListSize, Val: maxHeaderListSize},
	)
	fr.WriteWindowUpdate(0, connWindow-defaultWindow)
}

// handshake sends our connection preface and reads the peer's, which must
// begin with SETTINGS. Our SETTINGS ACK goes out with the first call, or
// after ackDelay.
func (c *Conn) handshake(ctx context.Context) error {
	dl, _ := ctx.Deadline()
	c.nc.SetDeadline(dl)
	defer c.nc.SetDeadline(time.Time{})
	var cut cutter
	cut.start(ctx, c.nc)
	defer cut.stop()

	var b bytes.Buffer
	fr := http2.NewFramer(&b, c.nc) // unbuffered reads: what follows SETTINGS stays in the socket
	fr.SetMaxReadFrameSize(maxFrameSize)
	writePreface(&b, fr)
	if _, err := c.nc.Write(b.Bytes()); err != nil {
		return hangupError("sending: %v", err)
	}
	f, err := fr.ReadFrame()
	if err != nil {
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return err // NewConn waits for ctx to say it
		}
		return firstFrameError(err)
	}
	if err := c.firstFrame(f); err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	_, err = c.settings(f.(*http2.SettingsFrame))
	if err == nil {
		c.oweSettingsAck()
		c.ackLaterLocked()
	}
	return err
}

// writePrefaceLocked sends our connection preface by itself, for a
// connection from Open watched before its first call. c.mu must be held.
func (c *Conn) writePrefaceLocked() error {
	var b bytes.Buffer
	writePreface(&b, http2.NewFramer(&b, nil))
	c.preface = false
	c.nc.SetWriteDeadline(time.Now().Add(idleWriteTimeout))
	_, err := c.nc.Write(b.Bytes())
	c.nc.SetWriteDeadline(time.Time{})
	if err != nil {
		c.broken = handshakeError(hangupError("sending: %v", err))
		return c.broken
	}
	return nil
}

// firstFrame checks the peer's first frame, which must be SETTINGS, valid
// ones: then the handshake is done.
func (c *Conn) firstFrame(f http2.Frame) *callError {
	sf, ok := f.(*http2.SettingsFrame)
	if !ok || sf.IsAck() {
		return protocolError("the peer is not an HTTP/2 server: its first frame is %v, not SETTINGS", f.Header().Type)
	}
	if err := sf.ForeachSetting(http2.Setting.Valid); err != nil {
		return protocolError("bad SETTINGS from the peer: %v", err)
	}
	c.settled = true
	return nil
}

// settings applies the peer's SETTINGS and returns by how much they changed
// the send window of streams.
func (c *Conn) settings(f *http2.SettingsFrame) (windowDelta int64, err error) {
	err = f.ForeachSetting(func(s http2.Setting) error {
		if err := s.Valid(); err != nil {
			return err
		}
		switch s.ID {
		case http2.SettingInitialWindowSize:
			windowDelta += int64(s.Val) - c.sendInit
			c.sendInit = int64(s.Val)
		case http2.SettingMaxFrameSize:
			c.frameSize = s.Val
		case http2.SettingMaxConcurrentStreams:
			c.maxStreams = s.Val
		case http2.SettingHeaderTableSize:
			// RFC 7541 §4.2: the next header block must begin with a
			// dynamic table size update at most this. nghttp2 refuses a
			// block without one (COMPRESSION_ERROR) once the size has
			// been lowered; we send one whatever the value.
			c.tableUpdate = true
		}
		return nil
	})
	if err != nil {
		return 0, protocolError("bad SETTINGS from the peer: %v", err)
	}
	return windowDelta, nil
}

// SyscallConn gives access to the socket, to ask the kernel who is at the
// other end (SO_PEERCRED). Watch, not the socket, is how to learn of a
// hang-up.
func (c *Conn) SyscallConn() (syscall.RawConn, error) { return c.nc.SyscallConn() }

// Close closes the connection. A call in flight fails; a watch ends without
// calling its onHangup (unless it was already doing so: Close and a hang-up
// may cross). Close returns once the watch has let go of the connection and
// no timer of the connection's runs, and may be called more than once, and
// from onHangup.
func (c *Conn) Close() error {
	c.closing.Store(true)
	err := c.closeSocket() // first, without c.mu: a call in flight fails at once
	c.mu.Lock()
	c.closed = true
	if c.broken == nil {
		c.broken = hangupError("closed by this side")
	}
	c.stopAckTimerLocked()
	c.stopWatchLocked()
	c.mu.Unlock()
	c.timers.Wait() // a run under way waits for c.mu, then finds c closed
	return err
}

// closeSocket closes the socket, once, and returns what that first close
// returned.
func (c *Conn) closeSocket() error {
	c.closeOnce.Do(func() { c.closeErr = c.nc.Close() })
	return c.closeErr
}

// Usable reports whether a call could be made: false once an error, the
// peer's GOAWAY or a hang-up seen by a call left the connection unusable.
func (c *Conn) Usable() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.broken == nil
}
