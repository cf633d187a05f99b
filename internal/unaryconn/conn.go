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
// once watched (Watch), its socket waits with the others in one epoll set
// on Linux (a goroutine blocked in a small read elsewhere): about 2.3 KiB of
// resident memory in all at 5,000 connections on Linux, 5.3 KiB with a
// goroutine each. bench/README.md has the figures, measured side by side.
//
// HTTP/2 framing and header compression are golang.org/x/net/http2's; this
// package adds what a unary call needs on top of them: the gRPC message
// prefix (gzip answers included), the deadline sent as grpc-timeout, the
// status read from trailers, flow-control credit, and answers to the peer's
// SETTINGS and PING. Failures are gRPC status errors with the codes grpc-go
// would give, and match sentinels that say what to do next (ErrProtocol,
// ErrHangup, ErrMaybeDelivered, ErrHandshake, ErrFlood). Whatever it does not
// speak is ErrProtocol: a caller then makes the call with grpc-go
// (InvokeGRPC).
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
package unaryconn

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
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
	tableUpdate bool           // the peer's SETTINGS_HEADER_TABLE_SIZE came: our next header block says our table's size
	broken      error          // why no further call can be made; set once
	closed      bool           // Close was called
	closing     atomic.Bool    // Close was called: set before it closes the socket, which the watch may see first

	onHangup func(error) // Watch's callback, while the connection is watched
	w        *watch      // the watch of the idle connection, if one runs
	flood    bucket      // what the peer may still send a watched connection

	now func() time.Time // the clock; tests set their own
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
		now:        time.Now,
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

// firstFrameError is the error of reading the peer's first frame, but for
// the deadline, which each caller says in its own way.
func firstFrameError(err error) *callError {
	if errors.Is(err, io.EOF) {
		return hangupError("the peer closed the connection without a word")
	}
	return frameError("the peer is not an HTTP/2 server", err)
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

// handshakeError is the failure of a connection before the peer's SETTINGS
// came: nothing was processed.
func handshakeError(err error) error {
	var ce *callError
	if !errors.As(err, &ce) {
		return fmt.Errorf("HTTP/2 handshake: %w (%w)", err, ErrHandshake)
	}
	return &callError{
		st:          status.New(ce.st.Code(), "HTTP/2 handshake: "+ce.st.Message()),
		kinds:       append(slices.DeleteFunc(slices.Clone(ce.kinds), func(k error) bool { return k == ErrMaybeDelivered }), ErrHandshake),
		unprocessed: true,
	}
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
// may cross). Close returns once the watch has let go of the connection,
// and may be called more than once, and from onHangup.
func (c *Conn) Close() error {
	c.closing.Store(true)
	err := c.closeSocket() // first, without c.mu: a call in flight fails at once
	c.mu.Lock()
	defer c.mu.Unlock()
	c.closed = true
	if c.broken == nil {
		c.broken = hangupError("closed by this side")
	}
	c.stopAckTimerLocked()
	c.stopWatchLocked()
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

// deadlineSkew is how far ahead of our deadline a peer's reset of the stream
// is taken for the peer enforcing that deadline.
const deadlineSkew = 50 * time.Millisecond

// idleWriteTimeout bounds the answers to the peer that an idle connection
// owes it (PING and SETTINGS acknowledgements).
const idleWriteTimeout = 100 * time.Millisecond

// aLongTimeAgo is a deadline that makes a blocked read or write return now.
var aLongTimeAgo = time.Unix(1, 0)

// cutter makes the end of a context cut short a read or write on the socket
// until it is stopped. stop waits for a cut already begun, which
// context.AfterFunc's stop does not: left running, the cut could set its
// deadline after the next call set its own, and fail that call.
type cutter struct {
	nc       *net.UnixConn
	stopFunc func() bool // context.AfterFunc's; nil for a context that never ends early

	mu      sync.Mutex
	stopped bool
}

// start cuts nc short at the end of ctx, until stop.
func (k *cutter) start(ctx context.Context, nc *net.UnixConn) {
	if ctx.Done() == nil {
		return // it never ends: nothing to cut
	}
	k.nc = nc
	k.stopFunc = context.AfterFunc(ctx, k.cut)
}

func (k *cutter) cut() {
	k.mu.Lock()
	defer k.mu.Unlock()
	if !k.stopped {
		k.nc.SetDeadline(aLongTimeAgo)
	}
}

// stop ends what start began, once a cut begun has ended.
func (k *cutter) stop() {
	if k.stopFunc != nil && !k.stopFunc() {
		k.mu.Lock() // the cut has begun: it is done, or will do nothing
		k.stopped = true
		k.mu.Unlock()
	}
}

// callIO is what a call reads and writes with. They are reused between
// calls (callIOs): an idle connection holds no buffer. (The reader reads
// ahead; what it read past the call's end is kept in Conn.rest.)
type callIO struct {
	br  *bufio.Reader
	out bytes.Buffer  // frames to send
	fr  *http2.Framer // reads br, writes out
}

var callIOs = sync.Pool{New: func() any {
	b := &callIO{br: bufio.NewReaderSize(nil, 4096)}
	b.fr = http2.NewFramer(&b.out, b.br)
	b.fr.SetMaxReadFrameSize(maxFrameSize)
	b.fr.MaxHeaderListSize = maxHeaderListSize
	return b
}}

// maxPooledOut bounds the write buffer kept for the next call: a large
// request's is let go.
const maxPooledOut = 64 << 10

// Invoke calls method (as "/package.Service/Method") with req and decodes the
// answer into resp. An answer larger than maxRecv bytes (at most MaxRecvSize)
// fails with codes.ResourceExhausted. The call ends at ctx's deadline, which
// the peer is told, or when ctx is cancelled.
func (c *Conn) Invoke(ctx context.Context, method string, req, resp proto.Message, maxRecv int) error {
	body, err := proto.Marshal(req)
	if err != nil {
		return newError(codes.Internal, nil, "encoding the request: %v", err)
	}
	maxRecv = min(maxRecv, MaxRecvSize)

	c.callMu.Lock()
	defer c.callMu.Unlock()
	c.mu.Lock()
	defer c.mu.Unlock()
	c.stopWatchLocked()
	defer c.resumeWatchLocked() // after invoke's own deferred work
	return c.invoke(ctx, method, body, resp, maxRecv)
}

// invoke is Invoke once the call has the connection to itself.
func (c *Conn) invoke(ctx context.Context, method string, body []byte, resp proto.Message, maxRecv int) error {
	if c.broken != nil {
		return unusable(c.broken)
	}
	if err := ctx.Err(); err != nil {
		return contextError(err)
	}

	dl, hasDeadline := ctx.Deadline()
	call := call{c: c, ctx: ctx, maxRecv: maxRecv, dl: dl}
	if !c.settled && !c.handshakeBy.IsZero() && (!hasDeadline || c.handshakeBy.Before(dl)) {
		call.dl = c.handshakeBy // until the peer's SETTINGS come
		call.byHandshake = true
	}
	c.nc.SetDeadline(call.dl)           // the zero time when there is none: no deadline
	defer c.nc.SetDeadline(time.Time{}) // after the cut below has stopped: the watch reads with none
	call.cut.start(ctx, c.nc)
	defer call.cut.stop()

	call.callIO = callIOs.Get().(*callIO)
	call.fr.ReadMetaHeaders = c.dec
	if len(c.rest) > 0 {
		call.br.Reset(io.MultiReader(bytes.NewReader(c.rest), c.nc))
		c.rest = nil
	} else {
		call.br.Reset(c.nc)
	}
	defer call.release()

	msg := make([]byte, 5+len(body))
	binary.BigEndian.PutUint32(msg[1:], uint32(len(body)))
	copy(msg[5:], body)
	var timeout string
	if hasDeadline {
		timeout = encodeTimeout(dl.Sub(c.now()))
	}
	answer, err := call.run(method, timeout, msg)
	if err == nil {
		if err := proto.Unmarshal(answer, resp); err != nil {
			return also(protocolError("decoding the answer: %v", err), ErrMaybeDelivered)
		}
		return nil
	}
	if ctx.Err() != nil {
		// The deadline or the cancellation cut the call short, not the peer.
		err = contextError(ctx.Err())
	} else if status.Code(err) == codes.Canceled && hasDeadline && dl.Sub(c.now()) < deadlineSkew {
		// The peer enforces the deadline it was sent on its own clock and
		// resets the stream (CANCEL) when it passes, which may be a moment
		// before ours does. grpc-go reports that as the deadline too.
		err = contextError(context.DeadlineExceeded)
	}
	if !c.settled {
		// No HTTP/2 server spoke: it would have sent SETTINGS first. One
		// that hung up or said something else acted on nothing; one still
		// silent at the deadline may yet read the request, which was sent.
		silent := call.sent && (errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled))
		err = handshakeError(err)
		c.broken = err
		if silent {
			return also(err, ErrMaybeDelivered)
		}
		return err
	}
	var ce *callError
	if call.sent && errors.As(err, &ce) && !ce.unprocessed {
		// Not the peer's answer, and the peer had the whole request.
		err = also(err, ErrMaybeDelivered)
	}
	return err
}

// call is one unary call in flight.
type call struct {
	c   *Conn
	ctx context.Context
	dl  time.Time // the socket's deadline
	cut cutter    // ctx's end cuts the call short
	// byHandshake: dl is Open's handshake deadline, until the peer's
	// SETTINGS come
	byHandshake bool
	stream      uint32
	maxRecv     int
	*callIO

	early   bool   // the stream was opened before the peer's SETTINGS came
	headers bool   // the answer's headers have come
	data    []byte // the answer's DATA, gRPC prefix included
	window  int64  // what the peer's window for this stream lets us send

	encoding string // the answer's grpc-encoding

	last bool // k.out holds the request's last DATA frame
	sent bool // the whole request was written to the socket
}

// release keeps what the reader took past the call's last frame for the next
// call, and returns what it read and wrote with to the pool, holding no
// reference to the connection. The framer of a call that broke the
// connection is not reused: it may have been left inside a header block.
func (k *call) release() {
	if n := k.br.Buffered(); n > 0 && k.c.broken == nil {
		b, _ := k.br.Peek(n)
		k.c.rest = bytes.Clone(b)
	}
	k.br.Reset(nil)
	k.fr.ReadMetaHeaders = nil
	if k.c.broken == nil && k.out.Cap() <= maxPooledOut {
		k.out.Reset()
		callIOs.Put(k.callIO)
	}
	k.callIO = nil
	if len(k.c.rest) > 0 && k.c.broken == nil {
		// What came after the answer (a PING, a GOAWAY) will not make the
		// socket readable again: handle it now.
		k.c.idleFrames(false)
	}
	k.c.ackLaterLocked()
}

// fail marks the connection unusable because of err, and returns it.
func (k *call) fail(err *callError) error {
	if k.c.broken == nil {
		k.c.broken = err
	}
	return err
}

// run sends the request and reads frames until this call's stream ends.
func (k *call) run(method, timeout string, msg []byte) ([]byte, error) {
	c := k.c
	if c.preface {
		writePreface(&k.out, k.fr)
		c.preface = false
	}
	if c.credit > 0 {
		k.fr.WriteWindowUpdate(0, c.credit)
		c.credit = 0
	}
	for {
		if err := k.waitForStream(); err != nil {
			return nil, err
		}
		if c.next > maxStreamID {
			c.broken = hangupError("stream IDs exhausted")
			return nil, unusable(c.broken)
		}
		k.stream = c.next
		c.next += 2
		k.early = !c.settled
		k.headers, k.data, k.encoding, k.sent = false, nil, "", false
		k.window = c.sendInit
		// The SETTINGS ACKs owed go before the header block, which says
		// the table size their SETTINGS may have changed.
		k.out.Write(c.settingsAcksTo(k.out.AvailableBuffer()))
		writeRequestHeaders(k.fr, k.stream, method, timeout, c.tableUpdate)
		c.tableUpdate = false
		answer, err, again := k.stream1(msg)
		if !again {
			return answer, err
		}
	}
}

// stream1 sends the request on k.stream, whose HEADERS are queued, and reads
// frames until the stream ends. again: the peer refused a stream sent before
// its SETTINGS came; the request goes again on a new stream, once allowed.
func (k *call) stream1(msg []byte) (answer []byte, err error, again bool) {
	c := k.c
	for {
		// The request goes out in as many DATA frames as the peer's frame
		// size and windows allow, each as soon as they allow it: a request
		// that waited to fit in one frame would never be sent if larger.
		for len(msg) > 0 {
			n := min(int64(len(msg)), c.sendConn, k.window, int64(c.frameSize))
			if n <= 0 {
				break // until the peer's WINDOW_UPDATE
			}
			k.last = n == int64(len(msg))
			k.fr.WriteData(k.stream, k.last, msg[:n])
			c.sendConn -= n
			k.window -= n
			msg = msg[n:]
		}
		if err := k.flush(); err != nil {
			return nil, err, false
		}
		f, err := k.readFrame()
		if err != nil {
			return nil, err, false
		}
		done, err := k.handle(f)
		if ce, ok := err.(*callError); ok && done && k.early && c.broken == nil && ce.unprocessed {
			// REFUSED_STREAM, for a stream sent before the limit
			// on streams was known: as an HTTP/2 client must, sent
			// again once the limit allows.
			return nil, nil, true
		}
		if done || err != nil {
			answer, err := k.answer(err)
			return answer, err, false
		}
	}
}

// readFrame reads the peer's next frame. The first must be SETTINGS; once
// they have come, the call's own deadline holds. While acknowledgements are
// owed, it waits for the frame no longer than they may wait, and writes them
// then.
func (k *call) readFrame() (http2.Frame, error) {
	c := k.c
	if c.owes() && k.br.Buffered() == 0 {
		if err := k.awaitFrame(); err != nil {
			return nil, err
		}
	}
	f, err := k.fr.ReadFrame()
	if err != nil {
		return nil, k.readError(err)
	}
	if !c.settled {
		if err := c.firstFrame(f); err != nil {
			return nil, k.fail(err)
		}
		if k.byHandshake {
			dl, _ := k.ctx.Deadline()
			k.byHandshake = false
			k.setDeadline(dl)
		}
	}
	return f, nil
}

// awaitFrame waits for the next frame to begin arriving, but no longer than
// the acknowledgements owed may wait: it writes them then.
func (k *call) awaitFrame() error {
	c := k.c
	due := c.oweDue()
	if !k.dl.IsZero() && !due.Before(k.dl) {
		return nil // the call ends first; they wait for after it
	}
	if time.Now().Before(due) {
		dl := k.dl
		k.setDeadline(due)
		_, err := k.br.Peek(1) // what it read stays read
		k.setDeadline(dl)
		if err == nil {
			return nil
		}
		if !errors.Is(err, os.ErrDeadlineExceeded) || k.ctx.Err() != nil {
			return k.readError(err)
		}
	}
	return k.flushWithAcks()
}

// setDeadline sets the socket's deadline to dl, unless the call's context
// has ended: then the deadline that cut the call short is set again, in case
// dl undid it.
func (k *call) setDeadline(dl time.Time) {
	k.dl = dl
	k.c.nc.SetDeadline(dl)
	if k.ctx.Err() != nil {
		k.c.nc.SetDeadline(aLongTimeAgo)
	}
}

// waitForStream waits until the peer allows a stream. A peer may allow none
// for a while (SETTINGS_MAX_CONCURRENT_STREAMS 0) and raise the limit
// later; grpc-go's client waits for that within the call's deadline, and so
// do we, answering what the peer sends meanwhile at once: it may wait for
// that. Every earlier stream has ended (a call that ends before its stream
// breaks the connection, and a refused one has ended), so one is allowed
// whenever the limit is not 0.
func (k *call) waitForStream() error {
	c := k.c
	for c.maxStreams == 0 {
		if err := k.flushWithAcks(); err != nil {
			return err
		}
		f, err := k.readFrame()
		if err != nil {
			return err
		}
		if f.Header().StreamID >= c.next {
			return k.fail(protocolError("the peer sent %v on stream %d, which was not opened", f.Header().Type, f.Header().StreamID))
		}
		if _, err := k.handle(f); err != nil {
			return err
		}
		if c.broken != nil {
			// A GOAWAY came: the stream will never be allowed.
			e := unusable(c.broken)
			e.unprocessed = true
			return e
		}
	}
	return nil
}

// flushWithAcks is flush for a call about to wait on the peer: the
// acknowledgements owed go now, even with nothing else to write, since the
// peer may wait for them.
func (k *call) flushWithAcks() error {
	k.out.Write(k.c.acksTo(k.out.AvailableBuffer()))
	return k.flush()
}

// flush writes the frames queued so far, and with them the acknowledgements
// owed, which go after the request's DATA (see acks.go).
func (k *call) flush() error {
	if k.out.Len() == 0 && !k.c.tooManyOwed() {
		return nil
	}
	k.out.Write(k.c.acksTo(k.out.AvailableBuffer()))
	_, err := k.c.nc.Write(k.out.Bytes())
	k.out.Reset()
	if errors.Is(err, os.ErrDeadlineExceeded) {
		return k.fail(newError(codes.DeadlineExceeded, context.DeadlineExceeded, "could not send before the deadline"))
	}
	if err != nil {
		// A write cut short did not deliver the request's last byte,
		// which ends its buffer: the peer cannot have acted on it.
		return k.fail(hangupError("sending: %v", err))
	}
	if k.last {
		k.sent, k.last = true, false
	}
	return nil
}

func (k *call) readError(err error) error {
	var e *callError
	switch {
	case k.byHandshake && errors.Is(err, os.ErrDeadlineExceeded) && k.ctx.Err() == nil:
		// Open's handshake deadline, before the call's.
		e = newError(codes.DeadlineExceeded, context.DeadlineExceeded, "the peer sent no SETTINGS by the handshake's deadline")
	case errors.Is(err, os.ErrDeadlineExceeded):
		// The socket's deadline is ctx's, which may not have fired yet.
		e = newError(codes.DeadlineExceeded, context.DeadlineExceeded, "no answer before the deadline")
	case !k.c.settled:
		e = firstFrameError(err)
	default:
		e = frameError("reading the answer", err)
	}
	if g := k.c.goAway; g != nil {
		// The GOAWAY said why the connection is ending: keep it.
		kinds := slices.Clip(e.kinds)
		for _, kind := range g.kinds {
			if !slices.Contains(kinds, kind) {
				kinds = append(kinds, kind)
			}
		}
		e = &callError{st: status.Newf(e.st.Code(), "%s, after %s", e.st.Message(), g.st.Message()), kinds: kinds}
	}
	return k.fail(e)
}

// frameError classifies an error of Framer.ReadFrame: the peer breaking
// HTTP/2, or the connection failing under it.
func frameError(doing string, err error) *callError {
	var se http2.StreamError
	var ce http2.ConnectionError
	switch {
	case errors.As(err, &se), errors.As(err, &ce):
		return protocolError("%s: malformed: %v", doing, err)
	case errors.Is(err, http2.ErrFrameTooLarge):
		return protocolError("%s: the peer sent a frame larger than %d bytes", doing, maxFrameSize)
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return hangupError("%s: the peer closed the connection", doing)
	}
	return hangupError("%s: %v", doing, err)
}

// handle takes one frame. It reports done when this call's stream has ended;
// a non-nil error with done false has broken the connection.
func (k *call) handle(f http2.Frame) (done bool, err error) {
	c := k.c
	switch f := f.(type) {
	case *http2.SettingsFrame:
		if f.IsAck() {
			return false, nil
		}
		delta, err := c.settings(f)
		if err != nil {
			return false, k.fail(err.(*callError))
		}
		k.window += delta
		c.oweSettingsAck()
	case *http2.PingFrame:
		if !f.IsAck() {
			c.owePingAck(f.Data)
		}
	case *http2.WindowUpdateFrame:
		switch f.StreamID {
		case 0:
			c.sendConn += int64(f.Increment)
		case k.stream:
			k.window += int64(f.Increment)
		}
	case *http2.GoAwayFrame:
		c.goAway = goAwayError(f)
		c.broken = c.goAway
		if k.stream > f.LastStreamID {
			e := goAwayError(f)
			e.unprocessed = true
			return true, e
		}
	case *http2.RSTStreamFrame:
		if f.StreamID == k.stream {
			return true, resetError(f.ErrCode)
		}
	case *http2.DataFrame:
		c.credit += f.Length
		if c.credit > connWindow {
			return false, k.fail(protocolError("the peer sent more than the flow-control window allows"))
		}
		if f.StreamID != k.stream {
			// Every call that ends before its stream does breaks the
			// connection, so no earlier stream has anything left to say.
			return false, k.fail(protocolError("the peer sent DATA on stream %d, which is not the call's", f.StreamID))
		}
		if !k.headers {
			return false, k.fail(protocolError("DATA before the answer's headers"))
		}
		if len(k.data)+len(f.Data()) > 5+k.maxRecv {
			return false, k.fail(newError(codes.ResourceExhausted, nil, "the answer is larger than the %d bytes allowed", k.maxRecv))
		}
		k.data = append(k.data, f.Data()...)
		if f.StreamEnded() {
			return true, protocolError("the peer ended the stream without trailers")
		}
	case *http2.MetaHeadersFrame:
		if f.StreamID != k.stream {
			return false, nil
		}
		if f.Truncated {
			return true, k.fail(protocolError("the answer's headers are larger than %d bytes", maxHeaderListSize))
		}
		if !k.headers {
			if st := f.PseudoValue("status"); len(st) == 3 && st[0] == '1' {
				// An interim answer (103 Early Hints, say): the real one
				// follows (RFC 9113 §8.1). grpc-go skips them too.
				if f.StreamEnded() {
					return true, protocolError("an informational answer (HTTP %s) ended the stream", st)
				}
				return false, nil
			}
			k.headers = true
			enc, err := responseHeaders(f)
			k.encoding = enc
			if err != nil {
				if !f.StreamEnded() {
					c.broken = err // the rest of the stream would follow
				}
				return true, err
			}
			if !f.StreamEnded() {
				return false, nil
			}
			// Trailers-only: the status is in these headers.
		} else if !f.StreamEnded() {
			return true, k.fail(protocolError("trailers without END_STREAM"))
		}
		return true, trailerStatus(f)
	case *http2.PushPromiseFrame:
		return false, k.fail(protocolError("the peer sent PUSH_PROMISE, which we disabled"))
	}
	return false, nil
}

// answer is the message of a call that ended with status err.
func (k *call) answer(err error) ([]byte, error) {
	if err != nil {
		return nil, err
	}
	if len(k.data) < 5 {
		return nil, protocolError("the peer ended the call without an answer")
	}
	n := binary.BigEndian.Uint32(k.data[1:5])
	if int64(n) != int64(len(k.data)-5) {
		return nil, protocolError("the answer is not one message (prefix says %d bytes, %d came)", n, len(k.data)-5)
	}
	switch {
	case k.data[0] == 0:
		return k.data[5:], nil
	case k.data[0] != 1:
		return nil, protocolError("the answer's message has flags %#x, which gRPC does not define", k.data[0])
	case k.encoding == "gzip":
		return gunzip(k.data[5:], k.maxRecv)
	case k.encoding == "" || k.encoding == "identity":
		return nil, protocolError("the answer is compressed, but its grpc-encoding is %q", k.encoding)
	}
	return nil, protocolError("the answer is compressed with %q, which was not offered (grpc-accept-encoding: %s)", k.encoding, acceptEncoding)
}

// acceptEncoding is what we offer as grpc-accept-encoding: a server may
// compress its answers with gzip, as it may to grpc-go's client, which
// offers what is registered (gzip, where grpc/encoding/gzip is imported).
// Some servers compress whatever the client offers.
const acceptEncoding = "gzip"

// gunzip decompresses an answer, of at most max bytes.
func gunzip(b []byte, max int) ([]byte, error) {
	zr, err := gzip.NewReader(bytes.NewReader(b))
	if err != nil {
		return nil, protocolError("the answer's gzip is malformed: %v", err)
	}
	out, err := io.ReadAll(io.LimitReader(zr, int64(max)+1))
	if err != nil {
		return nil, protocolError("the answer's gzip is malformed: %v", err)
	}
	if len(out) > max {
		return nil, newError(codes.ResourceExhausted, nil, "the answer, decompressed, is larger than the %d bytes allowed", max)
	}
	return out, nil
}

// writeRequestHeaders queues a call's HEADERS on stream. Every field is
// sent "never indexed", which leaves the peer's decoding table as it is: the
// encoder needs no state kept between calls. sizeUpdate begins the block with
// a dynamic table size update to 0: our encoder uses no table.
func writeRequestHeaders(fr *http2.Framer, stream uint32, method, timeout string, sizeUpdate bool) {
	h := headerEncoders.Get().(*headerEncoder)
	defer headerEncoders.Put(h)
	h.buf.Reset()
	enc := h.enc
	if sizeUpdate {
		// One of its own: a pooled encoder's limit is never changed.
		enc = hpack.NewEncoder(&h.buf)
		enc.SetMaxDynamicTableSizeLimit(0) // written with the first field
	}
	field := func(name, value string) {
		enc.WriteField(hpack.HeaderField{Name: name, Value: value, Sensitive: true})
	}
	field(":method", "POST")
	field(":scheme", "http")
	field(":path", method)
	field(":authority", "localhost")
	field("content-type", "application/grpc")
	field("te", "trailers")
	field("grpc-accept-encoding", acceptEncoding)
	if timeout != "" {
		field("grpc-timeout", timeout)
	}
	fr.WriteHeaders(http2.HeadersFrameParam{
		StreamID:      stream,
		BlockFragment: h.buf.Bytes(), // copied
		EndHeaders:    true,
	})
}

// headerEncoder is an HPACK encoder and what it writes into. They are reused
// between calls (headerEncoders): what it encodes is never indexed, so its
// dynamic table stays empty, and its table size limit is never changed.
type headerEncoder struct {
	buf bytes.Buffer
	enc *hpack.Encoder
}

var headerEncoders = sync.Pool{New: func() any {
	h := new(headerEncoder)
	h.enc = hpack.NewEncoder(&h.buf)
	return h
}}

// encodeTimeout writes d as gRPC's grpc-timeout: at most 8 digits and a unit.
func encodeTimeout(d time.Duration) string {
	if d <= 0 {
		return "1n"
	}
	for _, u := range []struct {
		d    time.Duration
		unit string
	}{{time.Nanosecond, "n"}, {time.Microsecond, "u"}, {time.Millisecond, "m"}, {time.Second, "S"}, {time.Minute, "M"}, {time.Hour, "H"}} {
		// Rounded up, but not as (d+u.d-1)/u.d: that overflows for a
		// duration near the largest, which time.Until gives a far deadline.
		v := d / u.d
		if d%u.d != 0 {
			v++
		}
		if v < 1e8 {
			return strconv.FormatInt(int64(v), 10) + u.unit
		}
	}
	return "99999999H"
}

// responseHeaders checks an answer's first headers: HTTP 200 and gRPC's
// content type, or an error with the code gRPC gives for what came instead.
// It returns the answer's grpc-encoding.
func responseHeaders(f *http2.MetaHeadersFrame) (encoding string, err error) {
	st := f.PseudoValue("status")
	if st != "200" {
		code, err := strconv.Atoi(st)
		if err != nil {
			return "", protocolError("malformed HTTP status %q", st)
		}
		return "", status.Errorf(httpCode(code), "unexpected HTTP status %d", code)
	}
	var ct string
	for _, hf := range f.RegularFields() {
		switch hf.Name {
		case "content-type":
			ct = hf.Value
		case "grpc-encoding":
			encoding = hf.Value
		}
	}
	if ct != "application/grpc" && !strings.HasPrefix(ct, "application/grpc+") && !strings.HasPrefix(ct, "application/grpc;") {
		return "", protocolError("the answer's content-type %q is not gRPC's", ct)
	}
	return encoding, nil
}

// trailerStatus is the status the trailers carry.
func trailerStatus(f *http2.MetaHeadersFrame) error {
	var code, msg string
	seen := false
	for _, hf := range f.RegularFields() {
		switch hf.Name {
		case "grpc-status":
			code, seen = hf.Value, true
		case "grpc-message":
			msg = decodeMessage(hf.Value)
		}
	}
	if !seen {
		return protocolError("the answer's trailers have no grpc-status")
	}
	n, err := strconv.ParseUint(code, 10, 32)
	if err != nil {
		return protocolError("malformed grpc-status %q", code)
	}
	if n == 0 {
		return nil
	}
	return status.Error(codes.Code(n), msg)
}

// decodeMessage undoes the percent-encoding of grpc-message; a malformed
// escape is kept as it came.
func decodeMessage(s string) string {
	if strings.IndexByte(s, '%') < 0 {
		return s
	}
	b := make([]byte, 0, len(s))
	for i := 0; i < len(s); i++ {
		if s[i] == '%' && i+2 < len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+3], 16, 8); err == nil {
				b = append(b, byte(v))
				i += 2
				continue
			}
		}
		b = append(b, s[i])
	}
	return string(b)
}

// resetError is the failure of a call whose stream the peer reset.
func resetError(e http2.ErrCode) *callError {
	err := newError(resetCode(e), nil, "the peer reset the stream: %v", e)
	switch {
	case e == http2.ErrCodeRefusedStream:
		// RFC 9113 §8.7: the stream was not processed; a retry is safe.
		err.unprocessed = true
	case blamesUs(e):
		err.kinds = []error{ErrProtocol}
	}
	return err
}

// goAwayError is the peer's GOAWAY, with its code and debug data.
func goAwayError(f *http2.GoAwayFrame) *callError {
	err := hangupError("the peer sent GOAWAY (%v, last stream %d): %q", f.ErrCode, f.LastStreamID, f.DebugData())
	if blamesUs(f.ErrCode) {
		err.kinds = append(err.kinds, ErrProtocol)
	}
	return err
}

// blamesUs reports whether an RST_STREAM or GOAWAY error code says that our
// side broke HTTP/2 (or that the peer failed to understand it).
func blamesUs(e http2.ErrCode) bool {
	switch e {
	case http2.ErrCodeProtocol, http2.ErrCodeInternal, http2.ErrCodeFlowControl,
		http2.ErrCodeStreamClosed, http2.ErrCodeFrameSize, http2.ErrCodeCompression:
		return true
	}
	return false
}

// resetCode is the gRPC code for a stream the peer reset, as grpc-go maps it.
func resetCode(e http2.ErrCode) codes.Code {
	switch e {
	case http2.ErrCodeRefusedStream:
		return codes.Unavailable
	case http2.ErrCodeCancel:
		return codes.Canceled
	case http2.ErrCodeFlowControl, http2.ErrCodeEnhanceYourCalm:
		return codes.ResourceExhausted
	case http2.ErrCodeInadequateSecurity:
		return codes.PermissionDenied
	}
	return codes.Internal
}

// httpCode is the gRPC code for an HTTP status other than 200, as the gRPC
// specification maps it.
func httpCode(s int) codes.Code {
	switch s {
	case 400:
		return codes.Internal
	case 401:
		return codes.Unauthenticated
	case 403:
		return codes.PermissionDenied
	case 404:
		return codes.Unimplemented
	case 429, 502, 503, 504:
		return codes.Unavailable
	}
	return codes.Unknown
}
