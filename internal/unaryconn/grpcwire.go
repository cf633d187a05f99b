package unaryconn

import (
	"bytes"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// writeRequestHeaders queues a call's HEADERS on stream. Every field is
// sent "never indexed", which leaves the peer's decoding table as it is: the
// encoder needs no state kept between calls. sizeUpdate begins the block with
// a dynamic table size update to 0: our encoder uses no table.
func writeRequestHeaders(fr *http2.Framer, stream uint32, method, timeout string, sizeUpdate bool) {
	h := headerEncoders.Get().(*headerEncoder)
	defer headerEncoders.Put(h)
	h.buf.Reset()
	if sizeUpdate {
		// RFC 7541 §6.3: 001, then the size, 0, as a 5-bit prefix
		// integer. Written by hand: a pooled encoder's limit is never
		// changed, and one made for it costs six allocations.
		h.buf.WriteByte(0x20)
	}
	enc := h.enc
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
