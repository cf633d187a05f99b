// Command rawh2-server is a plugin's registration server written directly on
// golang.org/x/net/http2's Framer, for the interop tests (package interop
// starts it). It serves GetInfo and NotifyRegistrationStatus as a correct
// gRPC server would, except where its -scenario says to behave as some real
// servers do that grpc-go's servers do not (interop.Scenarios lists them).
// It reports on standard output, one JSON line each, every call and what
// its scenario saw. SIGTERM sends GOAWAY on every connection and exits.
package main

import (
	"bytes"
	"compress/gzip"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/protobuf/proto"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"

	"github.com/plugd/plugd/test/interop/internal/server"
)

var (
	scenario = flag.String("scenario", "", "how to misbehave (see package interop)")
	config   server.Config
)

func main() {
	flags := server.Flags()
	flag.Parse()
	config = flags()
	if *scenario == "trailers-20k" {
		config.TrailerBytes = 20 << 10
	}
	if *scenario == "gzip" {
		config.Gzip = true
	}
	l, err := net.Listen("unix", config.Socket)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	var mu sync.Mutex
	conns := map[*conn]bool{}
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM)
	go func() {
		<-sigs
		l.Close()
		mu.Lock()
		for c := range conns {
			c.write(func(fr *http2.Framer) error { return fr.WriteGoAway(c.last.Load(), http2.ErrCodeNo, nil) })
			c.nc.Close()
		}
		mu.Unlock()
		server.Emit("stopped", nil)
		os.Exit(0)
	}()
	server.Emit("listening", nil)
	for i := 0; ; i++ {
		nc, err := l.Accept()
		if err != nil {
			select {} // stopping: the signal handler exits
		}
		server.Emit("accepted", nil)
		c := newConn(nc, i)
		mu.Lock()
		conns[c] = true
		mu.Unlock()
		go func() {
			defer func() {
				mu.Lock()
				delete(conns, c)
				mu.Unlock()
				nc.Close()
			}()
			if err := c.serve(); err != nil && !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) {
				fmt.Fprintf(os.Stderr, "connection %d: %v\n", i, err)
			}
		}()
	}
}

// conn is one client connection.
type conn struct {
	nc    net.Conn
	index int // the how-manieth connection

	wmu sync.Mutex // one frame written at a time (the answers; pings and floods come from goroutines of their own)
	fr  *http2.Framer
	enc *hpack.Encoder
	buf bytes.Buffer

	dec      *hpack.Decoder
	last     atomic.Uint32 // the last stream the client opened
	answered bool          // an answer has been sent on this connection
	told     atomic.Bool   // NotifyRegistrationStatus has been answered on this connection
	calmed   bool          // goaway-calm: the connection's first call was answered with GOAWAY
	raised   bool          // max-streams-0: the limit has been raised
	refused  uint32        // max-streams-0: the stream last refused
	acked    bool          // the client has acknowledged our SETTINGS
	checked  bool          // table-size-0: the first header block after that was checked
}

func newConn(nc net.Conn, i int) *conn {
	c := &conn{nc: nc, index: i, fr: http2.NewFramer(nc, nc)}
	c.enc = hpack.NewEncoder(&c.buf)
	c.dec = hpack.NewDecoder(4096, nil)
	return c
}

func (c *conn) write(f func(fr *http2.Framer) error) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	return f(c.fr)
}

// headers writes a header block, in HEADERS and as many CONTINUATION frames
// as 16 KiB frames need.
func (c *conn) headers(stream uint32, end bool, kv ...string) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	c.buf.Reset()
	for i := 0; i < len(kv); i += 2 {
		c.enc.WriteField(hpack.HeaderField{Name: kv[i], Value: kv[i+1]})
	}
	block := c.buf.Bytes()
	const max = 16 << 10
	first := block[:min(len(block), max)]
	if err := c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: stream, BlockFragment: first, EndHeaders: len(block) <= max, EndStream: end}); err != nil {
		return err
	}
	for rest := block[len(first):]; len(rest) > 0; {
		n := min(len(rest), max)
		if err := c.fr.WriteContinuation(stream, n == len(rest), rest[:n]); err != nil {
			return err
		}
		rest = rest[n:]
	}
	return nil
}

// request is a call being read.
type request struct {
	stream  uint32
	path    string
	accepts string // grpc-accept-encoding
	body    []byte
}

// hello reads the client's preface and sends the server's SETTINGS, as the
// scenario has them.
func (c *conn) hello() error {
	preface := make([]byte, len(http2.ClientPreface))
	if _, err := io.ReadFull(c.nc, preface); err != nil {
		return err
	}
	if string(preface) != http2.ClientPreface {
		return fmt.Errorf("preface %q", preface)
	}
	var settings []http2.Setting
	switch *scenario {
	case "table-size-0", "table-size-strict":
		settings = append(settings, http2.Setting{ID: http2.SettingHeaderTableSize, Val: 0})
	case "max-streams-0":
		settings = append(settings, http2.Setting{ID: http2.SettingMaxConcurrentStreams, Val: 0})
	}
	if err := c.write(func(fr *http2.Framer) error { return fr.WriteSettings(settings...) }); err != nil {
		return err
	}
	if *scenario == "max-streams-0" {
		// Raised once a PING round trip shows the client reads what it
		// is sent; a stream opened before is refused.
		if err := c.write(func(fr *http2.Framer) error { return fr.WritePing(false, [8]byte{'r', 'a', 'i', 's', 'e'}) }); err != nil {
			return err
		}
	}
	return nil
}

func (c *conn) serve() error {
	if err := c.hello(); err != nil {
		return err
	}
	var req *request
	for {
		f, err := c.fr.ReadFrame()
		if err != nil {
			return err
		}
		switch f := f.(type) {
		case *http2.SettingsFrame:
			c.acked = c.acked || f.IsAck()
			if !f.IsAck() {
				if err := c.write(func(fr *http2.Framer) error { return fr.WriteSettingsAck() }); err != nil {
					return err
				}
			}
		case *http2.PingFrame:
			switch {
			case !f.IsAck():
				if err := c.write(func(fr *http2.Framer) error { return fr.WritePing(true, f.Data) }); err != nil {
					return err
				}
			case *scenario == "max-streams-0" && string(bytes.TrimRight(f.Data[:], "\x00")) == "raise":
				c.raised = true
				if err := c.write(func(fr *http2.Framer) error {
					return fr.WriteSettings(http2.Setting{ID: http2.SettingMaxConcurrentStreams, Val: 100})
				}); err != nil {
					return err
				}
			case *scenario == "ping":
				server.Emit("ping-ack", map[string]any{"message": string(bytes.TrimRight(f.Data[:], "\x00"))})
			}
		case *http2.HeadersFrame:
			r, err := c.readHeaders(f)
			if err != nil {
				return err
			}
			if r == nil {
				continue // refused
			}
			req = r
		case *http2.DataFrame:
			if f.StreamID == c.refused && (req == nil || req.stream != f.StreamID) {
				// Sent before the client read our RST_STREAM: dropped
				// (RFC 9113 §5.1), and the connection's window given back.
				if len(f.Data()) > 0 {
					c.write(func(fr *http2.Framer) error { return fr.WriteWindowUpdate(0, uint32(len(f.Data()))) })
				}
				continue
			}
			if req == nil || f.StreamID != req.stream {
				return fmt.Errorf("DATA on stream %d, which is not a request's", f.StreamID)
			}
			req.body = append(req.body, f.Data()...)
			if len(f.Data()) > 0 {
				c.write(func(fr *http2.Framer) error {
					fr.WriteWindowUpdate(0, uint32(len(f.Data())))
					return fr.WriteWindowUpdate(f.StreamID, uint32(len(f.Data())))
				})
			}
			if f.StreamEnded() {
				if err := c.handle(req); err != nil {
					return err
				}
				req = nil
			}
		}
	}
}

// readHeaders reads a request's header block. It returns nil for a stream
// it refused.
func (c *conn) readHeaders(f *http2.HeadersFrame) (*request, error) {
	block := bytes.Clone(f.HeaderBlockFragment())
	for end := f.HeadersEnded(); !end; {
		cf, err := c.fr.ReadFrame()
		if err != nil {
			return nil, err
		}
		cont, ok := cf.(*http2.ContinuationFrame)
		if !ok || cont.StreamID != f.StreamID {
			return nil, fmt.Errorf("%v in a header block", cf.Header())
		}
		block = append(block, cont.HeaderBlockFragment()...)
		end = cont.HeadersEnded()
	}
	if *scenario == "table-size-0" && c.acked && !c.checked && (len(block) == 0 || block[0] != 0x20) {
		// nghttp2, having lowered its table to 0, requires the HPACK
		// dynamic table size update (to 0: 0x20) at the start of the
		// first header block after the client acknowledged that (RFC
		// 7541 §4.2; a block sent before, as a client may send one
		// with its preface, is decoded with the table as it was), and
		// fails the connection without one.
		server.Emit("compression-error", nil)
		c.write(func(fr *http2.Framer) error {
			return fr.WriteGoAway(0, http2.ErrCodeCompression, []byte("expected a dynamic table size update"))
		})
		return nil, errors.New("no dynamic table size update")
	}
	if *scenario == "table-size-strict" && !c.checked && (len(block) == 0 || block[0] != 0x20) {
		// Stricter than RFC 7541 asks: the connection's first header
		// block, even one a client sent before it could read our
		// SETTINGS, must begin with the table size update to 0.
		server.Emit("compression-error", nil)
		c.write(func(fr *http2.Framer) error {
			return fr.WriteGoAway(0, http2.ErrCodeCompression, []byte("expected a dynamic table size update in the first header block"))
		})
		return nil, errors.New("no dynamic table size update in the first header block")
	}
	c.checked = c.checked || c.acked || *scenario == "table-size-strict"
	fields, err := c.dec.DecodeFull(block)
	if err != nil {
		return nil, err
	}
	c.last.Store(f.StreamID)
	if *scenario == "max-streams-0" && !c.raised {
		server.Emit("refused", map[string]any{"message": fmt.Sprintf("stream %d", f.StreamID)})
		c.refused = f.StreamID
		return nil, c.write(func(fr *http2.Framer) error { return fr.WriteRSTStream(f.StreamID, http2.ErrCodeRefusedStream) })
	}
	r := &request{stream: f.StreamID}
	for _, hf := range fields {
		switch hf.Name {
		case ":path":
			r.path = hf.Value
		case "grpc-accept-encoding":
			r.accepts = hf.Value
		}
	}
	return r, nil
}

// handle answers a complete request.
func (c *conn) handle(r *request) error {
	if len(r.body) < 5 || int(binary.BigEndian.Uint32(r.body[1:5])) != len(r.body)-5 {
		return fmt.Errorf("stream %d: not one gRPC message", r.stream)
	}
	msg := r.body[5:]
	if *scenario == "reset-first-conn" && c.index == 0 {
		server.Emit("reset", map[string]any{"message": r.path})
		return c.write(func(fr *http2.Framer) error { return fr.WriteRSTStream(r.stream, http2.ErrCodeProtocol) })
	}
	var answer proto.Message
	status, message := "0", ""
	switch r.path {
	case "/pluginregistration.Registration/GetInfo":
		server.Emit("GetInfo", map[string]any{"accept_encoding": r.accepts})
		if *scenario == "goaway-calm" && !c.calmed {
			// Covering the call, with an error, and the socket kept open:
			// what follows is read, and nothing answered.
			server.Emit("goaway", nil)
			c.calmed = true
			return c.write(func(fr *http2.Framer) error {
				return fr.WriteGoAway(r.stream, http2.ErrCodeEnhanceYourCalm, []byte("calm down"))
			})
		}
		if *scenario == "goaway-error" && c.index == 0 && !c.answered {
			server.Emit("goaway", nil)
			c.answered = true // the next call on this connection is answered
			last := uint32(0) // the streams before this one: not this one
			if r.stream > 2 {
				last = r.stream - 2
			}
			return c.write(func(fr *http2.Framer) error {
				return fr.WriteGoAway(last, http2.ErrCodeEnhanceYourCalm, []byte("too_many_pings"))
			})
		}
		answer = config.Info
	case "/pluginregistration.Registration/NotifyRegistrationStatus":
		var st registerapi.RegistrationStatus
		if err := proto.Unmarshal(msg, &st); err != nil {
			return err
		}
		server.Emit("NotifyRegistrationStatus", map[string]any{"registered": st.PluginRegistered, "error": st.Error})
		if *scenario == "drop-after-notify" {
			return c.nc.Close()
		}
		answer = &registerapi.RegistrationStatusResponse{}
		if config.NotifyError != "" {
			status, message = "9", config.NotifyError
		}
	default:
		return c.headers(r.stream, true, ":status", "200", "content-type", "application/grpc", "grpc-status", "12", "grpc-message", "unknown method "+r.path)
	}

	return c.answer(r, answer, status, message)
}

// answer writes the answer to r: its headers, the message, and the
// trailers with status and message.
func (c *conn) answer(r *request, answer proto.Message, status, message string) error {
	if *scenario == "interim-103" {
		if err := c.headers(r.stream, false, ":status", "103", "link", "</registration>; rel=preload"); err != nil {
			return err
		}
	}
	h := []string{":status", "200", "content-type", "application/grpc"}
	body, err := proto.Marshal(answer)
	if err != nil {
		return err
	}
	flag := byte(0)
	if config.Gzip {
		h = append(h, "grpc-encoding", "gzip")
		var b bytes.Buffer
		zw := gzip.NewWriter(&b)
		zw.Write(body)
		zw.Close()
		body, flag = b.Bytes(), 1
	}
	if err := c.headers(r.stream, false, h...); err != nil {
		return err
	}
	framed := append(binary.BigEndian.AppendUint32([]byte{flag}, uint32(len(body))), body...)
	if err := c.write(func(fr *http2.Framer) error { return fr.WriteData(r.stream, false, framed) }); err != nil {
		return err
	}
	t := []string{"grpc-status", status}
	if message != "" {
		t = append(t, "grpc-message", message)
	}
	if config.TrailerBytes > 0 {
		t = append(t, "x-interop-big", server.BigTrailer(config.TrailerBytes))
	}
	if err := c.headers(r.stream, true, t...); err != nil {
		return err
	}
	if r.path == "/pluginregistration.Registration/NotifyRegistrationStatus" {
		c.told.Store(true)
	}
	if !c.answered {
		c.answered = true
		c.afterFirstAnswer(r.stream)
	}
	return nil
}

// afterFirstAnswer starts what a scenario does on an idle connection.
func (c *conn) afterFirstAnswer(stream uint32) {
	var frame func(fr *http2.Framer) error
	switch *scenario {
	case "ping":
		go func() {
			for i := 0; ; i++ {
				time.Sleep(50 * time.Millisecond)
				var data [8]byte
				copy(data[:], fmt.Sprintf("p%d", i))
				if c.write(func(fr *http2.Framer) error { return fr.WritePing(false, data) }) != nil {
					return
				}
			}
		}()
		return
	case "flood-window":
		frame = func(fr *http2.Framer) error { return fr.WriteWindowUpdate(0, 1) }
	case "flood-rst":
		frame = func(fr *http2.Framer) error { return fr.WriteRSTStream(stream, http2.ErrCodeNo) }
	case "flood-unknown":
		payload := bytes.Repeat([]byte{0xee}, 16<<10)
		frame = func(fr *http2.Framer) error { return fr.WriteRawFrame(0xfa, 0, 0, payload) }
	case "flood-settings":
		settings := make([]http2.Setting, 16<<10/6)
		for i := range settings {
			settings[i] = http2.Setting{ID: http2.SettingMaxHeaderListSize, Val: uint32(1 << 20)}
		}
		frame = func(fr *http2.Framer) error { return fr.WriteSettings(settings...) }
	default:
		return
	}
	go func() {
		// A moment later, so that the client has done what it connected
		// for (a registration's notification) and holds the connection idle.
		time.Sleep(100 * time.Millisecond)
		idle := c.told.Load()
		n := 0
		for c.write(frame) == nil {
			n++
		}
		server.Emit("flood-end", map[string]any{"frames": n, "idle": idle})
	}()
}
