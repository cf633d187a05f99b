package unaryconn

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"

	"golang.org/x/net/http2"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// What went wrong, for a caller to branch on with errors.Is. Every error of
// a call is also a gRPC status error (status.Code works on it), with the
// code grpc-go would give; these say what the code alone cannot.
//
// A plugin's own failure, the status in its answer's trailers (or an HTTP
// status other than 200), matches none of them: the plugin answered. A
// refused or missing socket is Dial's error, matching syscall.ECONNREFUSED
// or syscall.ENOENT. The end of the call's context matches
// context.DeadlineExceeded or context.Canceled.
var (
	// ErrProtocol: the peer sent something unaryconn does not speak, or
	// said (RST_STREAM or GOAWAY with PROTOCOL_ERROR, COMPRESSION_ERROR,
	// INTERNAL_ERROR and the like) that unaryconn broke the protocol. The
	// connection is unusable; a call that may be repeated may be made
	// again on a new one (check ErrMaybeDelivered first), which is what a
	// server that took a connection for broken expects.
	ErrProtocol = errors.New("beyond what unaryconn speaks")

	// ErrHangup: the peer closed or reset the connection, or sent GOAWAY.
	// The connection is unusable; a new one may work.
	ErrHangup = errors.New("the peer hung up")

	// ErrMaybeDelivered: the whole request was sent and then the call
	// failed without the peer's answer (a hang-up, the deadline, a reset,
	// a malformed answer). The peer may have acted on it: a call that must
	// not be made twice for one decision, like NotifyRegistrationStatus,
	// must not be sent again. An error without it was certainly not acted
	// on, or is the peer's own answer.
	ErrMaybeDelivered = errors.New("the request may have been delivered")

	// ErrHandshake: the peer did not open HTTP/2 (it sent no SETTINGS:
	// it said nothing, hung up, or said something else) before the call
	// or NewConn failed; the error says which. An HTTP/2 server sends its
	// SETTINGS before anything else, so the peer acted on nothing
	// (ErrMaybeDelivered never goes with it): for a caller, it failed to
	// connect. The first call on a connection from Open can fail so.
	ErrHandshake = errors.New("the HTTP/2 handshake failed")

	// ErrFlood: the peer sent an idle, watched connection more than an
	// idle connection needs (see Watch). The connection is closed. Log it
	// once and back off before dialing again.
	ErrFlood = errors.New("the peer flooded an idle connection")
)

// callError is a failure that unaryconn itself found (not the peer's
// status): a gRPC status, and the sentinels above it matches.
type callError struct {
	st    *status.Status
	kinds []error
	// unprocessed: the peer said it did not act on the request
	// (REFUSED_STREAM, or a GOAWAY that does not cover the stream), so
	// ErrMaybeDelivered does not apply even though it was sent.
	unprocessed bool
}

func (e *callError) Error() string {
	return fmt.Sprintf("rpc error: code = %s desc = %s", e.st.Code(), e.st.Message())
}

// GRPCStatus makes status.FromError and status.Code see the status.
func (e *callError) GRPCStatus() *status.Status { return e.st }

// Unwrap gives the sentinels, for errors.Is.
func (e *callError) Unwrap() []error { return e.kinds }

// newError is a failure with code, matching kind (which may be nil).
func newError(code codes.Code, kind error, format string, args ...any) *callError {
	e := &callError{st: status.Newf(code, format, args...)}
	if kind != nil {
		e.kinds = []error{kind}
	}
	return e
}

// protocolError is a failure to understand the peer.
func protocolError(format string, args ...any) *callError {
	return newError(codes.Internal, ErrProtocol, format, args...)
}

// hangupError is the peer going away.
func hangupError(format string, args ...any) *callError {
	return newError(codes.Unavailable, ErrHangup, format, args...)
}

// contextError is the end of a call's context, as grpc-go reports it.
func contextError(err error) *callError {
	code := codes.Canceled
	if errors.Is(err, context.DeadlineExceeded) {
		code = codes.DeadlineExceeded
	}
	return newError(code, err, "%v", err)
}

// also adds kind to what err matches, if err is one of ours.
func also(err error, kind error) error {
	var ce *callError
	if !errors.As(err, &ce) || slices.Contains(ce.kinds, kind) {
		return err
	}
	c := *ce
	c.kinds = append(slices.Clip(ce.kinds), kind)
	return &c
}

// unusable is the error of a call made on a connection that an earlier
// failure (why) left unusable: nothing was sent, so it matches what why
// matches except ErrMaybeDelivered.
func unusable(why error) *callError {
	e := hangupError("connection unusable: %v", why)
	e.kinds = nil
	var ce *callError
	if errors.As(why, &ce) {
		for _, k := range ce.kinds {
			if k != ErrMaybeDelivered && !slices.Contains(e.kinds, k) {
				e.kinds = append(e.kinds, k)
			}
		}
	}
	if len(e.kinds) == 0 {
		e.kinds = []error{ErrHangup}
	}
	return e
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

// firstFrameError is the error of reading the peer's first frame, but for
// the deadline, which each caller says in its own way.
func firstFrameError(err error) *callError {
	if errors.Is(err, io.EOF) {
		return hangupError("the peer closed the connection without a word")
	}
	return frameError("the peer is not an HTTP/2 server", err)
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
	debug := f.DebugData()
	if len(debug) > maxDebugData {
		debug = debug[:maxDebugData]
	}
	err := hangupError("the peer sent GOAWAY (%v, last stream %d): %q", f.ErrCode, f.LastStreamID, debug)
	if blamesUs(f.ErrCode) {
		err.kinds = append(err.kinds, ErrProtocol)
	}
	return err
}

// maxDebugData bounds what a GOAWAY's debug data adds to an error.
const maxDebugData = 256

// goAwayCallError is the failure of the call on stream, which the peer's
// GOAWAY ended: one whose last stream is below it says that the peer did
// not process the call, which may be made again (on a new connection);
// one that covers it, with an error code, ends the connection with the
// call unanswered: whether the peer acted on it cannot be told
// (ErrMaybeDelivered, once the request was sent).
func goAwayCallError(f *http2.GoAwayFrame, stream uint32) *callError {
	e := goAwayError(f)
	if stream > f.LastStreamID {
		e.st = status.Newf(e.st.Code(), "%s; it did not process the call (stream %d), which is safe to make again", e.st.Message(), stream)
		e.unprocessed = true
		return e
	}
	e.st = status.Newf(e.st.Code(), "%s; it ends the connection with the call (stream %d) unanswered", e.st.Message(), stream)
	return e
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
