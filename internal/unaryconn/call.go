package unaryconn

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"os"
	"slices"
	"sync"
	"time"

	"golang.org/x/net/http2"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

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
		k.stream = 0 // none open until the peer allows one
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
		switch {
		case k.stream == 0:
			// No stream of the call's is open (waitForStream, or an idle
			// connection's frames): none will be.
		case k.stream > f.LastStreamID:
			// RFC 9113 §6.8: the peer did not, and will not, process it.
			return true, goAwayCallError(f, k.stream)
		case f.ErrCode != http2.ErrCodeNo:
			// An error ends the connection (RFC 9113 §5.4.1: its sender
			// closes it next): the answer will not come, whether the peer
			// closes the socket or, as some do, keeps it open. A graceful
			// GOAWAY (NO_ERROR) that covers the stream lets it finish.
			return true, goAwayCallError(f, k.stream)
		}
	case *http2.RSTStreamFrame:
		if f.StreamID == k.stream {
			return true, resetError(f.ErrCode)
		}
	case *http2.DataFrame:
		return k.takeData(f)
	case *http2.MetaHeadersFrame:
		return k.takeHeaders(f)
	case *http2.PushPromiseFrame:
		return false, k.fail(protocolError("the peer sent PUSH_PROMISE, which we disabled"))
	}
	return false, nil
}

// takeData takes a DATA frame: the answer's message, within the
// flow-control window and the size allowed. It reports done as handle does.
func (k *call) takeData(f *http2.DataFrame) (done bool, err error) {
	c := k.c
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
	return false, nil
}

// takeHeaders takes a header block of the call's stream: the answer's
// headers (an interim one skipped), or its trailers, which end it. It
// reports done as handle does.
func (k *call) takeHeaders(f *http2.MetaHeadersFrame) (done bool, err error) {
	c := k.c
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
