package unaryconn

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"

	"github.com/plugd/plugd/internal/testenv"
)

const notify = "/pluginregistration.Registration/NotifyRegistrationStatus"

// Every wait in these tests that is not itself about a deadline is bounded
// by testenv.Timeout, only a failure bound: a test that checks that
// something fails "at once" gives it testenv.Timeout as its deadline and
// checks that the error is not the deadline's.

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// dial connects to path and closes the connection when the test ends.
func dial(tb testing.TB, path string) *Conn {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testenv.Timeout)
	defer cancel()
	c, err := Dial(ctx, path)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { c.Close() })
	return c
}

// info makes one GetInfo call that gives up after timeout.
func info(c *Conn, timeout time.Duration, maxRecv int) (*registerapi.PluginInfo, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var resp registerapi.PluginInfo
	err := c.Invoke(ctx, getInfo, &registerapi.InfoRequest{}, &resp, maxRecv)
	return &resp, err
}

// wantCode fails the test unless err is a status error with code.
func wantCode(tb testing.TB, err error, code codes.Code) {
	tb.Helper()
	st, ok := status.FromError(err)
	if !ok || st.Code() != code {
		tb.Fatalf("got error %v, want code %v", err, code)
	}
}

// recv waits for a value from ch.
func recv[T any](tb testing.TB, ch <-chan T) T {
	tb.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(testenv.Timeout):
	}
	tb.Fatal("timed out waiting")
	var zero T
	return zero
}

func TestGetInfoAndNotify(t *testing.T) {
	want := &registerapi.PluginInfo{
		Type:              "DRAPlugin",
		Name:              "gpu.example.com",
		Endpoint:          "/var/lib/kubelet/plugins/gpu.example.com/dra.sock",
		SupportedVersions: []string{"v1.DRAPlugin", "v1beta1.DRAPlugin"},
	}
	got := make(chan *registerapi.RegistrationStatus, 2)
	c := dial(t, serve(t, registration{
		getInfo: func(context.Context) (*registerapi.PluginInfo, error) { return want, nil },
		notify: func(_ context.Context, st *registerapi.RegistrationStatus) error {
			got <- st
			return nil
		},
	}))

	resp, err := info(c, testenv.Timeout, 1<<16)
	if err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(resp, want) {
		t.Errorf("GetInfo answered %v, want %v", resp, want)
	}

	for _, sent := range []*registerapi.RegistrationStatus{
		{PluginRegistered: true},
		{PluginRegistered: false, Error: "version 2.0 not supported: 100% ✓\nsecond line\t%41"},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), testenv.Timeout)
		err := c.Invoke(ctx, notify, sent, &registerapi.RegistrationStatusResponse{}, 1<<16)
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		if st := recv(t, got); st.PluginRegistered != sent.PluginRegistered || st.Error != sent.Error {
			t.Errorf("the server got %v, want %v", st, sent)
		}
	}
}

// TestManyCalls sends and receives well past HTTP/2's initial windows (64 KiB
// each way, and our 1 MiB connection window): without flow-control credit
// given back both ways the connection would stall.
func TestManyCalls(t *testing.T) {
	var infos, notes atomic.Int64
	name := strings.Repeat("n", 4<<10)
	c := dial(t, serve(t, registration{
		getInfo: func(context.Context) (*registerapi.PluginInfo, error) {
			n := infos.Add(1)
			return &registerapi.PluginInfo{Name: name, Endpoint: strconv.FormatInt(n, 10)}, nil
		},
		notify: func(_ context.Context, st *registerapi.RegistrationStatus) error {
			n := notes.Add(1)
			if want := reason(int(n)); st.Error != want {
				return status.Errorf(codes.InvalidArgument, "call %d: got reason %.20q..., want %.20q...", n, st.Error, want)
			}
			return nil
		},
	}))

	// 600 GetInfo, 2.4 MB of answers, and after every other one a Notify
	// with a 1,000-byte reason, 300 KB of requests. Each call has a
	// deadline of its own: one for all 600 was a race with the machine's load.
	j := 1
	for i := 1; i <= 600; i++ {
		resp, err := info(c, testenv.Timeout, 1<<16)
		if err != nil {
			t.Fatalf("GetInfo %d: %v", i, err)
		}
		// Each answer is this call's, not a late one of an earlier call.
		if resp.Endpoint != strconv.Itoa(i) || resp.Name != name {
			t.Fatalf("GetInfo %d answered endpoint %q", i, resp.Endpoint)
		}
		if i%2 == 0 {
			req := &registerapi.RegistrationStatus{Error: reason(j)}
			ctx, cancel := context.WithTimeout(context.Background(), testenv.Timeout)
			err := c.Invoke(ctx, notify, req, &registerapi.RegistrationStatusResponse{}, 1<<16)
			cancel()
			if err != nil {
				t.Fatalf("Notify %d: %v", j, err)
			}
			j++
		}
	}
	if !c.Usable() {
		t.Error("the connection is not usable after the calls")
	}
}

// reason is the 1,000-byte reason of the nth Notify.
func reason(n int) string {
	return fmt.Sprintf("%06d", n) + strings.Repeat("r", 994)
}

// TestLargeRequest sends a request larger than one HTTP/2 frame.
func TestLargeRequest(t *testing.T) {
	got := make(chan string, 1)
	c := dial(t, serve(t, registration{
		notify: func(_ context.Context, st *registerapi.RegistrationStatus) error {
			got <- st.Error
			return nil
		},
	}))
	long := strings.Repeat("0123456789", 10<<10) // 100 KiB: frames and the server's stream window
	ctx, cancel := context.WithTimeout(context.Background(), testenv.Timeout)
	defer cancel()
	req := &registerapi.RegistrationStatus{Error: long}
	if err := c.Invoke(ctx, notify, req, &registerapi.RegistrationStatusResponse{}, 1<<16); err != nil {
		t.Fatal(err)
	}
	if s := recv(t, got); s != long {
		t.Errorf("the server got %d bytes, want %d", len(s), len(long))
	}
}

func TestLargeAnswer(t *testing.T) {
	name := strings.Repeat("x", 200<<10)
	c := dial(t, serve(t, registration{
		getInfo: func(context.Context) (*registerapi.PluginInfo, error) {
			return &registerapi.PluginInfo{Name: name}, nil
		},
	}, grpc.MaxSendMsgSize(1<<20)))

	// More than MaxRecvSize is asked for: MaxRecvSize is what is allowed.
	resp, err := info(c, testenv.Timeout, 300<<10)
	if err != nil {
		t.Fatal(err)
	}
	if resp.Name != name {
		t.Fatalf("got a name of %d bytes, want %d", len(resp.Name), len(name))
	}
	if !c.Usable() {
		t.Fatal("the connection is not usable after a large answer")
	}

	_, err = info(c, testenv.Timeout, 64<<10)
	wantCode(t, err, codes.ResourceExhausted)
	if c.Usable() {
		t.Error("the connection is usable after an answer was cut short")
	}
	_, err = info(c, testenv.Timeout, 64<<10)
	wantCode(t, err, codes.Unavailable)
}

func TestStatusError(t *testing.T) {
	const msg = "100% not ready ✓\nsecond line\r\n\t%41 %zz"
	var fail atomic.Bool
	fail.Store(true)
	c := dial(t, serve(t, registration{
		getInfo: func(context.Context) (*registerapi.PluginInfo, error) {
			if fail.Load() {
				return nil, status.Error(codes.FailedPrecondition, msg)
			}
			return &registerapi.PluginInfo{Name: "ok"}, nil
		},
	}))

	_, err := info(c, testenv.Timeout, 1<<16)
	wantCode(t, err, codes.FailedPrecondition)
	if got := status.Convert(err).Message(); got != msg {
		t.Errorf("got message %q, want %q", got, msg)
	}
	if !c.Usable() {
		t.Fatal("a status error left the connection unusable")
	}
	fail.Store(false)
	if resp, err := info(c, testenv.Timeout, 1<<16); err != nil || resp.Name != "ok" {
		t.Fatalf("the next call got %v, %v", resp, err)
	}
}

func TestUnimplemented(t *testing.T) {
	c := dial(t, serve(t, registration{}))
	for _, method := range []string{
		"/pluginregistration.Registration/NoSuchMethod",
		"/no.such.Service/GetInfo",
	} {
		ctx, cancel := context.WithTimeout(context.Background(), testenv.Timeout)
		err := c.Invoke(ctx, method, &registerapi.InfoRequest{}, &registerapi.PluginInfo{}, 1<<16)
		cancel()
		wantCode(t, err, codes.Unimplemented)
	}
	if _, err := info(c, testenv.Timeout, 1<<16); err != nil {
		t.Fatalf("a call after Unimplemented: %v", err)
	}
}

// block is a handler that waits until its call is given up on, and tells
// started when it has begun and what deadline it was given.
func block(started chan<- deadline) func(context.Context) (*registerapi.PluginInfo, error) {
	return func(ctx context.Context) (*registerapi.PluginInfo, error) {
		now := time.Now()
		dl, ok := ctx.Deadline()
		started <- deadline{dl, now, ok}
		<-ctx.Done()
		return nil, ctx.Err()
	}
}

type deadline struct {
	t, began time.Time // the handler's deadline, and when it began
	ok       bool
}

func TestDeadline(t *testing.T) {
	started := make(chan deadline, 1)
	c := dial(t, serve(t, registration{getInfo: block(started)}))

	const timeout = 200 * time.Millisecond
	start := time.Now()
	_, err := info(c, timeout, 1<<16)
	elapsed := time.Since(start)
	wantCode(t, err, codes.DeadlineExceeded)
	if elapsed < timeout {
		t.Errorf("the call returned after %v, before its deadline of %v", elapsed, timeout)
	}
	dl := recv(t, started)
	if !dl.ok {
		t.Fatal("the server's handler had no deadline: grpc-timeout was not sent")
	}
	// The server's deadline is when it read the request plus what it was
	// sent; what was sent is at most the time left on ours. So it is at
	// least ours (the server read the request after we sent it), and at
	// most timeout after its handler began. Neither bound depends on how
	// loaded the machine is.
	if d := dl.t.Sub(start); d < timeout-time.Millisecond {
		t.Errorf("the server's deadline was %v after the call began, before ours (%v)", d, timeout)
	}
	if late := dl.t.Sub(dl.began); late > timeout {
		t.Errorf("the server's deadline was %v after its handler began, more than the %v the call had", late, timeout)
	}
}

func TestCancel(t *testing.T) {
	started := make(chan deadline, 1)
	c := dial(t, serve(t, registration{getInfo: block(started)}))

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	errc := make(chan error, 1)
	go func() { errc <- c.Invoke(ctx, getInfo, &registerapi.InfoRequest{}, &registerapi.PluginInfo{}, 1<<16) }()
	if dl := recv(t, started); dl.ok {
		t.Error("the server's handler has a deadline, though the call had none")
	}
	cancel()
	wantCode(t, recv(t, errc), codes.Canceled)
}

// TestCancelRace cancels calls, and dials, as they end. A cancellation that
// came too late to cut its own call short must not cut the next one short.
func TestCancelRace(t *testing.T) {
	path := serve(t, registration{})
	c := dial(t, path)
	for i := range 500 {
		if !c.Usable() {
			c.Close()
			c = dial(t, path)
		}
		ctx, cancel := context.WithCancel(context.Background())
		// Spread the cancellations over a call's length.
		time.AfterFunc(time.Duration(i%100)*time.Microsecond, cancel)
		err := c.Invoke(ctx, getInfo, &registerapi.InfoRequest{}, &registerapi.PluginInfo{}, 1<<16)
		if err != nil {
			wantCode(t, err, codes.Canceled)
			continue
		}
		if _, err := info(c, testenv.Timeout, 1<<16); err != nil {
			t.Fatalf("call %d after a call that outran its cancellation: %v", i, err)
		}
	}
	c.Close()

	for i := range 400 {
		ctx, cancel := context.WithCancel(context.Background())
		time.AfterFunc(time.Duration(i%200)*time.Microsecond, cancel)
		c, err := Dial(ctx, path)
		if err != nil {
			if !errors.Is(err, context.Canceled) {
				t.Fatalf("Dial: %v", err)
			}
			continue
		}
		_, err = info(c, testenv.Timeout, 1<<16)
		c.Close()
		if err != nil {
			t.Fatalf("call after dial %d, which outran its cancellation: %v", i, err)
		}
	}
}

func TestServerStop(t *testing.T) {
	srv, path := newServer(t, registration{})
	t.Cleanup(srv.Stop)
	c := dial(t, path)
	if _, err := info(c, testenv.Timeout, 1<<16); err != nil {
		t.Fatal(err)
	}
	srv.Stop()
	_, err := info(c, testenv.Timeout, 1<<16)
	wantCode(t, err, codes.Unavailable) // at once: waiting would be DeadlineExceeded
	if c.Usable() {
		t.Error("the connection is usable after the server stopped")
	}
}

func TestConcurrentCalls(t *testing.T) {
	var calls atomic.Int64
	c := dial(t, serve(t, registration{
		getInfo: func(context.Context) (*registerapi.PluginInfo, error) {
			return &registerapi.PluginInfo{Endpoint: strconv.FormatInt(calls.Add(1), 10)}, nil
		},
	}))
	const goroutines, each = 8, 200
	var wg sync.WaitGroup
	errs := make(chan error, goroutines)
	for range goroutines {
		wg.Go(func() {
			for range each {
				if _, err := info(c, testenv.Timeout, 1<<16); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if n := calls.Load(); n != goroutines*each {
		t.Errorf("the server answered %d calls, want %d", n, goroutines*each)
	}
}

func TestDialErrors(t *testing.T) {
	dir := testenv.ShortDir(t, "unaryconn")
	refused := filepath.Join(dir, "refused.sock")
	l, err := net.Listen("unix", refused)
	if err != nil {
		t.Fatal(err)
	}
	l.(*net.UnixListener).SetUnlinkOnClose(false)
	l.Close()

	for path, want := range map[string]error{
		refused:                         syscall.ECONNREFUSED,
		filepath.Join(dir, "none.sock"): syscall.ENOENT,
	} {
		ctx, cancel := context.WithTimeout(context.Background(), testenv.Timeout)
		c, err := Dial(ctx, path)
		cancel()
		if err == nil {
			c.Close()
		}
		if !errors.Is(err, want) {
			t.Errorf("Dial(%s) = %v, want %v", filepath.Base(path), err, want)
		}
	}
}

func TestEncodeTimeout(t *testing.T) {
	for _, tc := range []struct {
		d    time.Duration
		want string
	}{
		{-time.Second, "1n"},
		{0, "1n"},
		{1, "1n"},
		{time.Millisecond, "1000000n"},
		{1e8 - 1, "99999999n"},
		{1e8, "100000u"},
		{1e8 + 1, "100001u"}, // rounded up: the peer must not give up first
		{200 * time.Millisecond, "200000u"},
		{time.Hour, "3600000m"},
		{1e8 * time.Second, "1666667M"},
		{1<<63 - 1, "2562048H"},
	} {
		got := encodeTimeout(tc.d)
		if got != tc.want {
			t.Errorf("encodeTimeout(%v) = %q, want %q", tc.d, got, tc.want)
			continue
		}
		if digits := len(got) - 1; digits < 1 || digits > 8 {
			t.Errorf("encodeTimeout(%v) = %q: %d digits", tc.d, got, digits)
		}
		if back := decodeTimeout(t, got); back < tc.d {
			t.Errorf("encodeTimeout(%v) = %q, which is only %v", tc.d, got, back)
		}
	}
}

// decodeTimeout reads grpc-timeout as a server does, saturating at the
// largest duration.
func decodeTimeout(t *testing.T, s string) time.Duration {
	t.Helper()
	units := map[byte]time.Duration{'n': time.Nanosecond, 'u': time.Microsecond, 'm': time.Millisecond, 'S': time.Second, 'M': time.Minute, 'H': time.Hour}
	u, ok := units[s[len(s)-1]]
	v, err := strconv.ParseInt(s[:len(s)-1], 10, 64)
	if !ok || err != nil || v < 0 {
		t.Fatalf("malformed grpc-timeout %q", s)
	}
	if v > (1<<63-1)/int64(u) {
		return 1<<63 - 1
	}
	return time.Duration(v) * u
}

func TestDecodeMessage(t *testing.T) {
	for in, want := range map[string]string{
		"":                    "",
		"plain":               "plain",
		"%25":                 "%",
		"100%25 done":         "100% done",
		"%E2%9C%93%0Aa%0d%0A": "✓\na\r\n",
		"%":                   "%",
		"a%":                  "a%",
		"%2":                  "%2",
		"%zz%2":               "%zz%2",
		"%+1%-1%_1":           "%+1%-1%_1",
		"%%25":                "%%",
		"%2541":               "%41",
	} {
		if got := decodeMessage(in); got != want {
			t.Errorf("decodeMessage(%q) = %q, want %q", in, got, want)
		}
	}
}

// peer is one connection to a scripted HTTP/2 server.
type peer struct {
	t   *testing.T
	nc  net.Conn
	fr  *http2.Framer
	enc *hpack.Encoder
	buf bytes.Buffer // the encoder's output

	started     bool              // the client's preface has been read
	acks        int               // SETTINGS ACKs read
	lastRequest map[string]string // the last request's headers
}

// rawPeer listens on a new unix socket, runs script on the first connection
// made to it, and returns the socket's path. The test waits for the script to
// end, after closing its own connection, which ends a script's drain.
func rawPeer(t *testing.T, script func(p *peer)) string {
	t.Helper()
	path := filepath.Join(testenv.ShortDir(t, "unaryconn"), "p.sock")
	l, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		nc, err := l.Accept()
		if err != nil {
			return // the test ended before dialing
		}
		defer nc.Close()
		nc.SetDeadline(time.Now().Add(testenv.Timeout))
		p := &peer{t: t, nc: nc, fr: http2.NewFramer(nc, nc)}
		p.fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
		p.enc = hpack.NewEncoder(&p.buf)
		script(p)
	}()
	t.Cleanup(func() {
		l.Close()
		select {
		case <-done:
		case <-time.After(testenv.Timeout):
			t.Error("the scripted peer did not end")
		}
	})
	return path
}

// fatalf fails the test and ends the script.
func (p *peer) fatalf(format string, args ...any) {
	p.t.Errorf("scripted peer: "+format, args...)
	runtime.Goexit()
}

func (p *peer) check(err error) {
	if err != nil {
		p.fatalf("%v", err)
	}
}

// hello sends the server's preface: SETTINGS, which Dial waits for.
func (p *peer) hello(settings ...http2.Setting) {
	p.check(p.fr.WriteSettings(settings...))
}

func (p *peer) readFrame() http2.Frame {
	f, err := p.fr.ReadFrame()
	p.check(err)
	if sf, ok := f.(*http2.SettingsFrame); ok && sf.IsAck() {
		p.acks++
	}
	return f
}

// readUntil reads frames until one that want accepts.
func (p *peer) readUntil(want func(http2.Frame) bool) http2.Frame {
	for {
		if f := p.readFrame(); want(f) {
			return f
		}
	}
}

// readHeaders reads the client's preface, if it has not been read, and
// frames up to a request's HEADERS; it checks them and returns the request's
// stream. deadline says whether the call had one.
func (p *peer) readHeaders(method string, deadline bool) uint32 {
	if !p.started {
		p.readPreface()
	}
	f := p.readUntil(func(f http2.Frame) bool {
		switch f.(type) {
		case *http2.SettingsFrame, *http2.WindowUpdateFrame, *http2.PingFrame:
			return false
		}
		return true
	})
	h, ok := f.(*http2.MetaHeadersFrame)
	if !ok {
		p.fatalf("the request began with %v, not HEADERS", f)
	}
	got := map[string]string{}
	for _, hf := range h.Fields {
		got[hf.Name] = hf.Value
	}
	p.lastRequest = got
	for name, want := range map[string]string{
		":method":      "POST",
		":path":        method,
		"content-type": "application/grpc",
		"te":           "trailers",
	} {
		if got[name] != want {
			p.t.Errorf("request header %s is %q, want %q", name, got[name], want)
		}
	}
	timeout, ok := got["grpc-timeout"]
	if ok != deadline {
		p.t.Errorf("request header grpc-timeout is %q, want one: %v", timeout, deadline)
	}
	if ok && (len(timeout) < 2 || len(timeout) > 9) {
		p.t.Errorf("malformed grpc-timeout %q", timeout)
	}
	return h.StreamID
}

// readPreface reads the client's preface and its SETTINGS.
func (p *peer) readPreface() {
	p.started = true
	preface := make([]byte, len(http2.ClientPreface))
	_, err := io.ReadFull(p.nc, preface)
	p.check(err)
	if string(preface) != http2.ClientPreface {
		p.fatalf("got preface %q", preface)
	}
	if f, ok := p.readFrame().(*http2.SettingsFrame); !ok || f.IsAck() {
		p.fatalf("the client's first frame is %v, not SETTINGS", f)
	}
}

// readRequest reads a request, as readHeaders and then up to its last DATA.
func (p *peer) readRequest(method string, deadline bool) uint32 {
	s := p.readHeaders(method, deadline)
	p.readData(s)
	return s
}

// readData reads up to the last DATA of stream s.
func (p *peer) readData(s uint32) {
	for {
		switch f := p.readFrame().(type) {
		case *http2.DataFrame:
			if f.StreamID != s {
				p.fatalf("DATA on stream %d, not the request's %d", f.StreamID, s)
			}
			if f.StreamEnded() {
				return
			}
		case *http2.MetaHeadersFrame:
			p.fatalf("HEADERS on stream %d while reading the request's DATA", f.StreamID)
		}
	}
}

// readPing reads frames up to a PING and says what it was: "ack true
// DATA" for an acknowledgement of the PING whose data was DATA.
func (p *peer) readPing() string {
	f := p.readUntil(func(f http2.Frame) bool { _, ok := f.(*http2.PingFrame); return ok }).(*http2.PingFrame)
	return fmt.Sprintf("ack %v %s", f.IsAck(), bytes.TrimRight(f.Data[:], "\x00"))
}

// drain reads until the client closes the connection.
func (p *peer) drain() { io.Copy(io.Discard, p.nc) }

// headers sends a header block of name, value pairs.
func (p *peer) headers(stream uint32, end bool, kv ...string) {
	p.buf.Reset()
	for i := 0; i < len(kv); i += 2 {
		p.check(p.enc.WriteField(hpack.HeaderField{Name: kv[i], Value: kv[i+1]}))
	}
	p.check(p.fr.WriteHeaders(http2.HeadersFrameParam{
		StreamID: stream, BlockFragment: p.buf.Bytes(), EndHeaders: true, EndStream: end,
	}))
}

// message sends m with gRPC's prefix.
func (p *peer) message(stream uint32, m proto.Message) {
	b, err := proto.Marshal(m)
	p.check(err)
	msg := binary.BigEndian.AppendUint32([]byte{0}, uint32(len(b)))
	p.check(p.fr.WriteData(stream, false, append(msg, b...)))
}

var okHeaders = []string{":status", "200", "content-type", "application/grpc"}

// answer sends a successful answer of m.
func (p *peer) answer(stream uint32, m proto.Message) {
	p.headers(stream, false, okHeaders...)
	p.message(stream, m)
	p.headers(stream, true, "grpc-status", "0")
}

// answerWithPing sends a successful answer of m whose trailers and a PING
// of data go in one write: the client reads the PING with the answer, and
// no later read of its own may come to see it (no call follows).
func (p *peer) answerWithPing(stream uint32, m proto.Message, data [8]byte) {
	p.headers(stream, false, okHeaders...)
	p.message(stream, m)
	p.buf.Reset()
	p.check(p.enc.WriteField(hpack.HeaderField{Name: "grpc-status", Value: "0"}))
	var b bytes.Buffer
	fr := http2.NewFramer(&b, nil)
	fr.WriteHeaders(http2.HeadersFrameParam{StreamID: stream, BlockFragment: p.buf.Bytes(), EndHeaders: true, EndStream: true})
	fr.WritePing(false, data)
	_, err := p.nc.Write(b.Bytes())
	p.check(err)
}

var peerInfo = &registerapi.PluginInfo{Type: "CSIPlugin", Name: "scripted", SupportedVersions: []string{"1.0.0"}}

// hugeFrame is a frame header claiming the largest length HTTP/2 can
// express, 16 MiB less a byte, of a frame of type t on stream s.
func hugeFrame(t http2.FrameType, s uint32) []byte {
	return binary.BigEndian.AppendUint32([]byte{0xff, 0xff, 0xff, byte(t), 0}, s)
}

// TestHostileDial dials peers that do not answer as an HTTP/2 server.
func TestHostileDial(t *testing.T) {
	for _, tc := range []struct {
		name    string
		timeout time.Duration
		script  func(p *peer)
		want    error // if not nil, what the error must be
	}{{
		name:    "silent",
		timeout: 200 * time.Millisecond,
		script:  func(p *peer) { p.drain() },
		want:    context.DeadlineExceeded,
	}, {
		name: "hangs up",
		script: func(p *peer) {
			p.check(p.nc.(*net.UnixConn).CloseWrite())
			p.drain()
		},
	}, {
		name: "garbage",
		script: func(p *peer) {
			_, err := p.nc.Write([]byte("HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n"))
			p.check(err)
			p.drain()
		},
	}, {
		name: "huge frame",
		script: func(p *peer) {
			_, err := p.nc.Write(hugeFrame(http2.FrameSettings, 0))
			p.check(err)
			p.drain()
		},
	}, {
		name: "PING first",
		script: func(p *peer) {
			p.check(p.fr.WritePing(false, [8]byte{}))
			p.drain()
		},
	}, {
		name: "invalid SETTINGS",
		script: func(p *peer) {
			p.hello(http2.Setting{ID: http2.SettingMaxFrameSize, Val: 0})
			p.drain()
		},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			path := rawPeer(t, tc.script)
			start := time.Now() // before the deadline is set, which is measured from it
			ctx, cancel := context.WithTimeout(context.Background(), testenv.Timeout)
			if tc.timeout > 0 {
				ctx, cancel = context.WithTimeout(context.Background(), tc.timeout)
			}
			defer cancel()
			c, err := Dial(ctx, path)
			elapsed := time.Since(start)
			if err == nil {
				c.Close()
				t.Fatal("Dial succeeded")
			}
			if tc.want != nil && !errors.Is(err, tc.want) {
				t.Errorf("Dial: %v, want %v", err, tc.want)
			}
			// Failing at once is failing before the deadline: a dial that
			// waited for it would fail with it.
			if tc.timeout == 0 && errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("Dial waited for its deadline: %v", err)
			}
			if elapsed < tc.timeout {
				t.Errorf("Dial failed after %v, before its deadline of %v: %v", elapsed, tc.timeout, err)
			}
		})
	}
}

// TestHostilePeer makes calls to peers that answer badly, or well in ways
// grpc-go's server does not exercise.
func TestHostilePeer(t *testing.T) {
	for _, tc := range []struct {
		name string
		// timeout is the call's; 0 is none, with the call still bounded.
		timeout time.Duration
		script  func(p *peer)
		want    codes.Code
		// usable is whether the connection is usable after the call.
		usable bool
	}{{
		name:    "silent",
		timeout: 200 * time.Millisecond,
		script: func(p *peer) {
			p.hello()
			p.readRequest(getInfo, true)
			p.drain()
		},
		want: codes.DeadlineExceeded,
	}, {
		name: "garbage",
		script: func(p *peer) {
			p.hello()
			p.readRequest(getInfo, false)
			_, err := p.nc.Write([]byte("HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n"))
			p.check(err)
			p.drain()
		},
		want: codes.Internal, // "HTT" is the length of a frame too large
	}, {
		name: "hangs up",
		script: func(p *peer) {
			p.hello()
			p.readRequest(getInfo, false)
		},
		want: codes.Unavailable,
	}, {
		name:    "HTTP 404",
		timeout: testenv.Timeout,
		script: func(p *peer) {
			p.hello()
			s := p.readRequest(getInfo, true)
			p.headers(s, true, ":status", "404", "content-type", "text/plain")
			p.drain()
		},
		want:   codes.Unimplemented,
		usable: true, // the stream ended with the headers
	}, {
		name: "text/html",
		script: func(p *peer) {
			p.hello()
			s := p.readRequest(getInfo, false)
			p.headers(s, false, ":status", "200", "content-type", "text/html")
			// Not checked: the client may have hung up on seeing the headers.
			p.fr.WriteData(s, true, []byte("<html></html>"))
			p.drain()
		},
		want: codes.Internal,
	}, {
		name: "huge frame",
		script: func(p *peer) {
			p.hello()
			s := p.readRequest(getInfo, false)
			_, err := p.nc.Write(hugeFrame(http2.FrameData, s))
			p.check(err)
			p.drain()
		},
		want: codes.Internal,
	}, {
		name: "DATA before HEADERS",
		script: func(p *peer) {
			p.hello()
			s := p.readRequest(getInfo, false)
			p.message(s, peerInfo)
			// No trailers after it: the client gives up on the DATA and
			// closes the connection, so a write after it may meet a broken
			// pipe, and failing the script for that made the test flaky
			// under load.
			p.drain()
		},
		want: codes.Internal,
	}, {
		name: "no grpc-status",
		script: func(p *peer) {
			p.hello()
			s := p.readRequest(getInfo, false)
			p.headers(s, false, okHeaders...)
			p.message(s, peerInfo)
			p.headers(s, true, "grpc-message", "forgot the status")
			p.drain()
		},
		want:   codes.Internal,
		usable: true, // the stream ended as it should
	}, {
		name: "RST_STREAM REFUSED_STREAM",
		script: func(p *peer) {
			p.hello()
			s := p.readRequest(getInfo, false)
			p.check(p.fr.WriteRSTStream(s, http2.ErrCodeRefusedStream))
			p.drain()
		},
		want:   codes.Unavailable,
		usable: true, // only the stream was refused
	}, {
		name: "GOAWAY before the call",
		script: func(p *peer) {
			p.hello()
			p.readRequest(getInfo, false)
			p.check(p.fr.WriteGoAway(0, http2.ErrCodeNo, nil))
			p.drain()
		},
		want: codes.Unavailable,
	}, {
		name: "GOAWAY after the call",
		script: func(p *peer) {
			p.hello()
			s := p.readRequest(getInfo, false)
			p.check(p.fr.WriteGoAway(s, http2.ErrCodeNo, nil))
			p.answer(s, peerInfo)
			p.drain()
		},
		want:   codes.OK,
		usable: false, // the call was taken, but no other will be
	}, {
		name: "invalid SETTINGS during a call",
		script: func(p *peer) {
			p.hello()
			p.readRequest(getInfo, false)
			p.hello(http2.Setting{ID: http2.SettingMaxFrameSize, Val: 0})
			p.drain()
		},
		want: codes.Internal,
	}, {
		name: "PING",
		script: func(p *peer) {
			p.hello()
			s := p.readRequest(getInfo, false)
			data := [8]byte{1, 2, 3, 4, 5, 6, 7, 8}
			p.check(p.fr.WritePing(false, data))
			f := p.readUntil(func(f http2.Frame) bool { _, ok := f.(*http2.PingFrame); return ok }).(*http2.PingFrame)
			if !f.IsAck() || f.Data != data {
				p.t.Errorf("got PING ack %v with %v, want an ack with %v", f.IsAck(), f.Data, data)
			}
			p.answer(s, peerInfo)
			p.drain()
		},
		want:   codes.OK,
		usable: true,
	}, {
		name: "SETTINGS",
		script: func(p *peer) {
			p.hello(
				http2.Setting{ID: http2.SettingMaxFrameSize, Val: 1 << 20},
				http2.Setting{ID: http2.SettingMaxConcurrentStreams, Val: 100},
			)
			s := p.readRequest(getInfo, false)
			// The ACK of the SETTINGS Dial read goes out with the first call.
			if p.acks != 1 {
				p.t.Errorf("got %d SETTINGS ACKs with the request, want 1", p.acks)
			}
			p.hello(http2.Setting{ID: http2.SettingMaxConcurrentStreams, Val: 10})
			p.readUntil(func(f http2.Frame) bool { sf, ok := f.(*http2.SettingsFrame); return ok && sf.IsAck() })
			p.answer(s, peerInfo)
			p.drain()
		},
		want:   codes.OK,
		usable: true,
	}, {
		// The request's DATA waits for the stream window that the peer's
		// SETTINGS closed. The ack of a PING sent after the HEADERS comes
		// before any DATA if the client held it back.
		name: "stream window",
		script: func(p *peer) {
			p.hello(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 0})
			s := p.readHeaders(getInfo, false)
			p.check(p.fr.WritePing(false, [8]byte{}))
			if f, ok := p.readFrame().(*http2.PingFrame); !ok || !f.IsAck() {
				p.fatalf("got %v before the PING's ack: the client sent beyond its window", f)
			}
			p.check(p.fr.WriteWindowUpdate(s, 1<<10))
			p.readData(s)
			p.answer(s, peerInfo)
			p.drain()
		},
		want:   codes.OK,
		usable: true,
	}} {
		t.Run(tc.name, func(t *testing.T) {
			c := dial(t, rawPeer(t, tc.script))
			ctx, cancel := context.WithCancel(context.Background())
			if tc.timeout > 0 {
				ctx, cancel = context.WithTimeout(context.Background(), tc.timeout)
			}
			defer cancel()
			// A call with no deadline of its own is still bounded: one
			// that waited for that bound would fail Canceled, which no case
			// wants.
			stop := time.AfterFunc(testenv.Timeout, cancel)
			defer stop.Stop()
			var resp registerapi.PluginInfo
			err := c.Invoke(ctx, getInfo, &registerapi.InfoRequest{}, &resp, 1<<16)
			if tc.want == codes.OK {
				if err != nil {
					t.Fatal(err)
				}
				if !proto.Equal(&resp, peerInfo) {
					t.Errorf("got %v, want %v", &resp, peerInfo)
				}
			} else {
				wantCode(t, err, tc.want)
			}
			if c.Usable() != tc.usable {
				t.Errorf("Usable() = %v after the call, want %v", c.Usable(), tc.usable)
			}
			c.Close() // which ends the script's drain
		})
	}
}

// TestPingAfterAnswer: a PING that came with the answer, read with it, is
// answered, though the socket will not be readable again for it and no call
// follows (its ACK goes by itself, ackDelay after).
func TestPingAfterAnswer(t *testing.T) {
	acked := make(chan bool)
	path := rawPeer(t, func(p *peer) {
		p.hello()
		p.answerWithPing(p.readRequest(getInfo, true), peerInfo, [8]byte{'a', 'f', 't', 'e', 'r'})
		acked <- p.readPing() == "ack true after"
		p.drain()
	})
	c := dial(t, path)
	if _, err := info(c, testenv.Timeout, 1<<16); err != nil {
		t.Fatal(err)
	}
	if !recv(t, acked) {
		t.Error("the PING that came with the answer was not acknowledged with its data")
	}
}

// TestDataOnAnotherStream: DATA for a stream that is not the call's breaks
// the connection: every earlier stream has ended.
func TestDataOnAnotherStream(t *testing.T) {
	path := rawPeer(t, func(p *peer) {
		p.hello()
		s := p.readRequest(getInfo, true)
		p.headers(s, false, okHeaders...)
		p.fr.WriteData(s+2, false, []byte("stray"))
		p.drain()
	})
	c := dial(t, path)
	_, err := info(c, testenv.Timeout, 1<<16)
	wantCode(t, err, codes.Internal)
	if c.Usable() {
		t.Error("usable after DATA on another stream")
	}
}

// TestPeerCancelAtTheDeadline: a server enforcing the grpc-timeout it was
// sent resets the stream (CANCEL) when it passes on its clock, which may be
// a moment before ours: that is the deadline, not a cancellation. A reset
// well before the deadline stays Canceled. The peer resets at once; the
// connection's clock says how far the deadline is.
func TestPeerCancelAtTheDeadline(t *testing.T) {
	for _, tc := range []struct {
		name string
		left time.Duration // what the clock says is left of the call's deadline when the reset comes
		want codes.Code
	}{
		{"at the deadline", 20 * time.Millisecond, codes.DeadlineExceeded},
		{"long before", testenv.Timeout, codes.Canceled},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := rawPeer(t, func(p *peer) {
				p.hello()
				s := p.readRequest(getInfo, true)
				p.check(p.fr.WriteRSTStream(s, http2.ErrCodeCancel))
				p.drain()
			})
			c := dial(t, path)
			ctx, cancel := context.WithTimeout(context.Background(), testenv.Timeout)
			defer cancel()
			dl, _ := ctx.Deadline()
			c.now = func() time.Time { return dl.Add(-tc.left) }
			err := c.Invoke(ctx, getInfo, &registerapi.InfoRequest{}, &registerapi.PluginInfo{}, 1<<16)
			wantCode(t, err, tc.want)
		})
	}
}
