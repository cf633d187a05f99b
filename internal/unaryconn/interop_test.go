package unaryconn

// Peers that grpc-go's client talks to and unaryconn once did not (issue
// 12): each test here failed before the fix it is named after.

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/binary"
	"errors"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"

	"github.com/plugd/plugd/internal/testenv"
)

// TestHeaderTableSizeZero: a peer that sets SETTINGS_HEADER_TABLE_SIZE to 0,
// as nghttp2-based servers may, requires a dynamic table size update at the
// start of the first header block after our SETTINGS ACK (RFC 7541 §4.2:
// "in HTTP/2, this follows a settings acknowledgment") and refuses the block
// with COMPRESSION_ERROR without one, as nghttp2 does. With Open, the first
// block goes before the peer's SETTINGS were read, the second is the one.
func TestHeaderTableSizeZero(t *testing.T) {
	for _, pipelined := range []bool{false, true} {
		path := rawPeer(t, func(p *peer) {
			p.hello(http2.Setting{ID: http2.SettingHeaderTableSize, Val: 0})
			dec := p.fr.ReadMetaHeaders
			p.fr.ReadMetaHeaders = nil // to see the block as it was encoded
			checked := false
			for range 3 {
				var h *http2.HeadersFrame
				if !p.started {
					p.readPreface()
				}
				p.readUntil(func(f http2.Frame) bool { h, _ = f.(*http2.HeadersFrame); return h != nil })
				block := h.HeaderBlockFragment()
				if p.acks > 0 && !checked {
					checked = true
					if len(block) == 0 || block[0] != 0x20 { // 001xxxxx: a size update, to 0
						p.t.Errorf("the first header block after the SETTINGS ACK begins with %#x, not a table size update to 0", block[:min(len(block), 1)])
						p.check(p.fr.WriteGoAway(0, http2.ErrCodeCompression, []byte("expected a dynamic table size update")))
						return
					}
				}
				if _, err := dec.DecodeFull(block); err != nil {
					p.fatalf("decoding the request's headers: %v", err)
				}
				p.readData(h.StreamID)
				p.answer(h.StreamID, peerInfo)
			}
			if !checked {
				p.t.Error("no SETTINGS ACK came before the third request")
			}
			p.drain()
		})
		var c *Conn
		if pipelined {
			c = open(t, path, testenv.Timeout)
		} else {
			c = dial(t, path)
		}
		for i := range 3 {
			if _, err := info(c, testenv.Timeout, 1<<16); err != nil {
				t.Fatalf("pipelined %v, call %d: %v", pipelined, i, err)
			}
		}
	}
}

// TestHeaderTableSizeFirstBlock (issue 25, item 6): a peer that lowered
// its table's size may insist on the size update at the start of the
// connection's first header block, even one sent with the preface before
// its SETTINGS could be read (stricter than RFC 7541): every connection's
// first block begins with one, to 0, which is always allowed.
func TestHeaderTableSizeFirstBlock(t *testing.T) {
	for _, pipelined := range []bool{false, true} {
		path := rawPeer(t, func(p *peer) {
			p.hello(http2.Setting{ID: http2.SettingHeaderTableSize, Val: 0})
			dec := p.fr.ReadMetaHeaders
			p.fr.ReadMetaHeaders = nil // to see the block as it was encoded
			for i := range 2 {
				var h *http2.HeadersFrame
				if !p.started {
					p.readPreface()
				}
				p.readUntil(func(f http2.Frame) bool { h, _ = f.(*http2.HeadersFrame); return h != nil })
				block := h.HeaderBlockFragment()
				if i == 0 && (len(block) == 0 || block[0] != 0x20) { // 001xxxxx: a size update, to 0
					p.t.Errorf("pipelined %v: the connection's first header block begins with %#x, not a table size update to 0", pipelined, block[:min(len(block), 1)])
					p.check(p.fr.WriteGoAway(0, http2.ErrCodeCompression, []byte("expected a dynamic table size update")))
					return
				}
				if _, err := dec.DecodeFull(block); err != nil {
					p.fatalf("decoding the request's headers: %v", err)
				}
				p.readData(h.StreamID)
				p.answer(h.StreamID, peerInfo)
			}
			p.drain()
		})
		var c *Conn
		if pipelined {
			c = open(t, path, testenv.Timeout)
		} else {
			c = dial(t, path)
		}
		for i := range 2 {
			if _, err := info(c, testenv.Timeout, 1<<16); err != nil {
				t.Fatalf("pipelined %v, call %d: %v", pipelined, i, err)
			}
		}
	}
}

// TestLargeTrailers: trailers of 20 KiB come in a HEADERS frame and a
// CONTINUATION (our frames are at most 16 KiB), and are taken.
func TestLargeTrailers(t *testing.T) {
	msg := strings.Repeat("{}", 10<<10) // which Huffman coding would not shorten: 20 KiB on the wire
	path := rawPeer(t, func(p *peer) {
		p.hello()
		s := p.readRequest(getInfo, true)
		p.headers(s, false, okHeaders...)
		p.message(s, peerInfo)
		p.buf.Reset()
		p.enc.WriteField(hpack.HeaderField{Name: "grpc-status", Value: "9"})
		p.enc.WriteField(hpack.HeaderField{Name: "grpc-message", Value: msg})
		block := p.buf.Bytes()
		p.check(p.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: s, BlockFragment: block[:16<<10], EndStream: true}))
		p.check(p.fr.WriteContinuation(s, true, block[16<<10:]))
		p.drain()
	})
	c := dial(t, path)
	_, err := info(c, testenv.Timeout, 1<<16)
	wantCode(t, err, codes.FailedPrecondition)
	if got := status.Convert(err).Message(); got != msg {
		t.Errorf("got a message of %d bytes, want %d", len(got), len(msg))
	}
	if !c.Usable() {
		t.Error("unusable after large trailers")
	}
}

// TestLargeMetadataGRPCGo: grpc-go's server refuses (RST_STREAM
// INTERNAL_ERROR) to send headers larger than the client's
// SETTINGS_MAX_HEADER_LIST_SIZE; 20 KiB of trailers and headers must fit.
func TestLargeMetadataGRPCGo(t *testing.T) {
	big := strings.Repeat("v", 20<<10)
	c := dial(t, serve(t, registration{getInfo: func(ctx context.Context) (*registerapi.PluginInfo, error) {
		grpc.SetHeader(ctx, metadata.Pairs("x-big-header", big))
		grpc.SetTrailer(ctx, metadata.Pairs("x-big-trailer", big))
		return peerInfo, nil
	}}))
	resp, err := info(c, testenv.Timeout, 1<<16)
	if err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(resp, peerInfo) {
		t.Errorf("got %v", resp)
	}
}

// TestHeaderListBound: headers are bounded, at grpc-go's client default
// (16 MiB decoded). An HPACK "bomb", one 4 KiB entry of the dynamic table
// referred to thousands of times, costs the peer a few bytes each.
func TestHeaderListBound(t *testing.T) {
	path := rawPeer(t, func(p *peer) {
		p.hello()
		s := p.readRequest(getInfo, true)
		p.headers(s, false, okHeaders...)
		p.message(s, peerInfo)
		var b bytes.Buffer
		enc := hpack.NewEncoder(&b)
		enc.WriteField(hpack.HeaderField{Name: "x-bomb", Value: strings.Repeat("b", 4000)})
		// The entry just indexed is dynamic index 1: HPACK index 62.
		refs := bytes.Repeat([]byte{0x80 | 62}, (maxHeaderListSize/4000)+100)
		block := append(b.Bytes(), refs...)
		p.check(p.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: s, BlockFragment: block[:min(len(block), 16<<10)], EndHeaders: len(block) <= 16<<10, EndStream: true}))
		p.drain()
	})
	c := dial(t, path)
	_, err := info(c, testenv.Timeout, 1<<16)
	wantCode(t, err, codes.Internal)
	if !errors.Is(err, ErrProtocol) {
		t.Errorf("%v is not ErrProtocol", err)
	}
}

// gzipped is m as a gRPC message compressed with gzip.
func gzipped(t *testing.T, m []byte) []byte {
	var b bytes.Buffer
	zw := gzip.NewWriter(&b)
	zw.Write(m)
	zw.Close()
	return append(binary.BigEndian.AppendUint32([]byte{1}, uint32(b.Len())), b.Bytes()...)
}

// TestForcedGzip: a server that compresses its answers whatever it is told.
func TestForcedGzip(t *testing.T) {
	c := dial(t, serve(t, registration{}, grpc.RPCCompressor(grpc.NewGZIPCompressor())))
	resp, err := info(c, testenv.Timeout, 1<<16)
	if err != nil {
		t.Fatal(err)
	}
	if resp.Name != "p" {
		t.Errorf("got %v", resp)
	}
}

// TestGzip: what a gzip answer may be, sent by a scripted peer, which also
// checks that the request advertises gzip as grpc-go's does.
func TestGzip(t *testing.T) {
	plain, _ := proto.Marshal(peerInfo)
	bomb := bytes.Repeat([]byte{0}, 10<<20)
	for _, tc := range []struct {
		name     string
		encoding string
		message  []byte // with its prefix
		want     codes.Code
		protocol bool
	}{
		{"gzip", "gzip", gzipped(t, plain), codes.OK, false},
		{"gzip, uncompressed message", "gzip", append(binary.BigEndian.AppendUint32([]byte{0}, uint32(len(plain))), plain...), codes.OK, false},
		{"bomb", "gzip", gzipped(t, bomb), codes.ResourceExhausted, false},
		{"corrupt", "gzip", append(binary.BigEndian.AppendUint32([]byte{1}, 4), "oops"...), codes.Internal, true},
		{"unknown encoding", "snappy", gzipped(t, plain), codes.Internal, true},
		{"compressed, no encoding", "", gzipped(t, plain), codes.Internal, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := rawPeer(t, func(p *peer) {
				p.hello()
				s := p.readRequest(getInfo, true)
				if got := p.lastRequest["grpc-accept-encoding"]; got != "gzip" {
					p.t.Errorf("grpc-accept-encoding is %q, want gzip", got)
				}
				h := okHeaders
				if tc.encoding != "" {
					h = append(h[:len(h):len(h)], "grpc-encoding", tc.encoding)
				}
				p.headers(s, false, h...)
				for m := tc.message; len(m) > 0; {
					n := min(len(m), 16<<10)
					p.check(p.fr.WriteData(s, false, m[:n]))
					m = m[n:]
				}
				p.headers(s, true, "grpc-status", "0")
				p.drain()
			})
			c := dial(t, path)
			resp, err := info(c, testenv.Timeout, 1<<16)
			if tc.want == codes.OK {
				if err != nil {
					t.Fatal(err)
				}
				if !proto.Equal(resp, peerInfo) {
					t.Errorf("got %v", resp)
				}
				return
			}
			wantCode(t, err, tc.want)
			if errors.Is(err, ErrProtocol) != tc.protocol {
				t.Errorf("errors.Is(%v, ErrProtocol) = %v", err, !tc.protocol)
			}
		})
	}
}

// TestMaxConcurrentStreamsZero: a peer that allows no stream until it says
// otherwise. The call waits for the raise, reading what the peer sends
// meanwhile (a PING here, whose ACK must come before any HEADERS), and opens
// its stream only then.
func TestMaxConcurrentStreamsZero(t *testing.T) {
	path := rawPeer(t, func(p *peer) {
		p.hello(http2.Setting{ID: http2.SettingMaxConcurrentStreams, Val: 0})
		p.readPreface()
		p.check(p.fr.WritePing(false, [8]byte{'w', 'a', 'i', 't'}))
		f := p.readUntil(func(f http2.Frame) bool {
			switch f.(type) {
			case *http2.PingFrame, *http2.MetaHeadersFrame:
				return true
			}
			return false
		})
		if h, ok := f.(*http2.MetaHeadersFrame); ok {
			p.t.Errorf("the client opened stream %d, beyond SETTINGS_MAX_CONCURRENT_STREAMS 0", h.StreamID)
			p.check(p.fr.WriteRSTStream(h.StreamID, http2.ErrCodeRefusedStream))
			p.drain()
			return
		}
		p.hello(http2.Setting{ID: http2.SettingMaxConcurrentStreams, Val: 1})
		s := p.readRequest(getInfo, true)
		p.answer(s, peerInfo)
		p.drain()
	})
	c := dial(t, path)
	if _, err := info(c, testenv.Timeout, 1<<16); err != nil {
		t.Fatal(err)
	}

	// Never raised: the deadline, and nothing was sent.
	c = dial(t, rawPeer(t, func(p *peer) {
		p.hello(http2.Setting{ID: http2.SettingMaxConcurrentStreams, Val: 0})
		p.drain()
	}))
	_, err := info(c, 200*time.Millisecond, 1<<16)
	wantCode(t, err, codes.DeadlineExceeded)
	wantKinds(t, err, "DeadlineExceeded")
}

// TestInterimResponse: 1xx headers (103 Early Hints here) come before the
// answer's and are skipped, as grpc-go does; one that ends the stream is
// malformed.
func TestInterimResponse(t *testing.T) {
	path := rawPeer(t, func(p *peer) {
		p.hello()
		s := p.readRequest(getInfo, true)
		p.headers(s, false, ":status", "103", "link", "</style.css>; rel=preload")
		p.answer(s, peerInfo)
		s = p.readRequest(getInfo, true)
		p.headers(s, true, ":status", "100")
		p.drain()
	})
	c := dial(t, path)
	resp, err := info(c, testenv.Timeout, 1<<16)
	if err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(resp, peerInfo) {
		t.Errorf("got %v", resp)
	}
	_, err = info(c, testenv.Timeout, 1<<16)
	wantCode(t, err, codes.Internal)
}

// TestGoAway: a GOAWAY that does not cover the call fails it at once (a
// call that waited would fail with the deadline), retryable, with the
// GOAWAY's code and debug data; one that covers it lets the answer come,
// and if the connection drops instead, the error says so.
func TestGoAway(t *testing.T) {
	c := dial(t, rawPeer(t, func(p *peer) {
		p.hello()
		p.readRequest(notify, true)
		p.check(p.fr.WriteGoAway(0, http2.ErrCodeEnhanceYourCalm, []byte("too_many_pings")))
		p.drain()
	}))
	ctx, cancel := context.WithTimeout(context.Background(), testenv.Timeout)
	defer cancel()
	err := c.Invoke(ctx, notify, &registerapi.RegistrationStatus{}, &registerapi.RegistrationStatusResponse{}, 1<<16)
	wantCode(t, err, codes.Unavailable)
	wantKinds(t, err, "ErrHangup")
	for _, want := range []string{"ENHANCE_YOUR_CALM", "too_many_pings"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("%v does not say %s", err, want)
		}
	}

	if !strings.Contains(err.Error(), "not process") || !strings.Contains(err.Error(), "safe to make again") {
		t.Errorf("%v does not say that the call was not processed", err)
	}

	c = dial(t, rawPeer(t, func(p *peer) {
		p.hello()
		s := p.readRequest(notify, true)
		p.check(p.fr.WriteGoAway(s, http2.ErrCodeInternal, []byte("shutting down")))
	}))
	err = c.Invoke(ctx, notify, &registerapi.RegistrationStatus{}, &registerapi.RegistrationStatusResponse{}, 1<<16)
	wantCode(t, err, codes.Unavailable)
	wantKinds(t, err, "ErrHangup", "ErrMaybeDelivered", "ErrProtocol")
	if !strings.Contains(err.Error(), "shutting down") {
		t.Errorf("%v does not say what the GOAWAY said", err)
	}
}

// TestGoAwayErrorKeepsSocketOpen (issue 25, item 5): a GOAWAY with an error
// code that covers the call ends it at once (a call that waited would fail
// with the deadline), saying the code and the debug data, even though the
// peer keeps the socket open: an error GOAWAY ends the connection, and no
// answer follows. The peer may have acted on the request. A graceful
// GOAWAY (NO_ERROR) that covers the call lets its answer come.
func TestGoAwayErrorKeepsSocketOpen(t *testing.T) {
	c := dial(t, rawPeer(t, func(p *peer) {
		p.hello()
		s := p.readRequest(getInfo, true)
		p.check(p.fr.WriteGoAway(s, http2.ErrCodeEnhanceYourCalm, []byte("calm down")))
		p.drain() // the socket stays open until the client closes it
	}))
	_, err := info(c, testenv.Timeout, 1<<16)
	wantCode(t, err, codes.Unavailable)
	wantKinds(t, err, "ErrHangup", "ErrMaybeDelivered")
	for _, want := range []string{"ENHANCE_YOUR_CALM", "last stream 1", `"calm down"`, "unanswered"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("%v does not say %s", err, want)
		}
	}
	if c.Usable() {
		t.Error("usable after an error GOAWAY")
	}

	c = dial(t, rawPeer(t, func(p *peer) {
		p.hello()
		s := p.readRequest(getInfo, true)
		p.check(p.fr.WriteGoAway(s, http2.ErrCodeNo, []byte("draining")))
		p.answer(s, peerInfo)
		p.drain()
	}))
	if _, err := info(c, testenv.Timeout, 1<<16); err != nil {
		t.Errorf("a call covered by a graceful GOAWAY: %v, want its answer", err)
	}
}
