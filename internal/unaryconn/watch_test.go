package unaryconn

import (
	"bytes"
	"encoding/binary"
	"errors"
	"net"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"google.golang.org/grpc/codes"

	"github.com/plugd/plugd/internal/testenv"
)

// watched starts watching c with p and returns where its hang-up will be
// reported.
func watched(t *testing.T, p *Poller, c *Conn) <-chan error {
	t.Helper()
	hung := make(chan error, 1)
	if err := c.Watch(p, func(err error) { hung <- err }); err != nil {
		t.Fatal(err)
	}
	return hung
}

// eachWatch runs test with each way a connection may be watched, with a
// Poller of its own: in the epoll set (Linux) and by a goroutine of its own
// (everywhere else; on Linux only when told to).
func eachWatch(t *testing.T, test func(*testing.T, *Poller)) {
	for _, goroutines := range []bool{false, true} {
		name := "poll"
		if goroutines {
			name = "goroutine"
		}
		t.Run(name, func(t *testing.T) { test(t, newPoller(t, goroutines)) })
	}
}

// newPoller returns a Poller that watches with goroutines, or not, and is
// closed when the test ends, after the connections the test made after it.
// It checks then that Close left none of its goroutines running.
func newPoller(t *testing.T, goroutines bool) *Poller {
	t.Helper()
	p := NewPoller(PollerOptions{Goroutines: goroutines})
	t.Cleanup(func() {
		p.Close()
		buf := make([]byte, 1<<20)
		stacks := string(buf[:runtime.Stack(buf, true)])
		for _, f := range []string{"unaryconn.(*Conn).watch(", "unaryconn.(*Conn).pollStep(", "unaryconn.(*Poller).run("} {
			if strings.Contains(stacks, f) {
				t.Errorf("a goroutine in %s after the Poller's Close (or another test's, running in parallel)", f)
			}
		}
	})
	return p
}

// noHangup fails the test if the watch has reported a hang-up.
func noHangup(t *testing.T, hung <-chan error) {
	t.Helper()
	select {
	case err := <-hung:
		t.Fatalf("hang-up: %v", err)
	default:
	}
}

// TestWatchPing: a watched idle connection answers PINGs, whole or arriving
// in pieces, and takes a GOAWAY for a hang-up, closing the connection.
func TestWatchPing(t *testing.T) { eachWatch(t, testWatchPing) }

func testWatchPing(t *testing.T, pl *Poller) {
	step := make(chan string)
	next := make(chan struct{})
	path := rawPeer(t, func(p *peer) {
		p.hello()
		p.answer(p.readRequest(getInfo, true), peerInfo)
		<-next
		p.check(p.fr.WritePing(false, [8]byte{'w', 'h', 'o', 'l', 'e'}))
		step <- p.readPing()

		var b bytes.Buffer
		http2.NewFramer(&b, nil).WritePing(false, [8]byte{'s', 'p', 'l', 'i', 't'})
		for _, part := range [][]byte{b.Bytes()[:4], b.Bytes()[4:12], b.Bytes()[12:]} {
			_, err := p.nc.Write(part)
			p.check(err)
			<-next
		}
		step <- p.readPing()

		<-next
		p.check(p.fr.WriteGoAway(1, http2.ErrCodeNo, []byte("bye")))
		p.drain() // until the client closes the connection
		step <- "closed"
	})
	c := dial(t, path)
	if _, err := info(c, testenv.Timeout, 1<<16); err != nil {
		t.Fatal(err)
	}
	hung := watched(t, pl, c)
	next <- struct{}{}
	if got := recv(t, step); got != "ack true whole" {
		t.Errorf("the peer got %q, want a PING ACK with its data", got)
	}
	next <- struct{}{}
	next <- struct{}{}
	next <- struct{}{}
	if got := recv(t, step); got != "ack true split" {
		t.Errorf("the peer got %q, want a PING ACK with its data", got)
	}
	noHangup(t, hung)
	next <- struct{}{}
	err := recv(t, hung)
	if !errors.Is(err, ErrHangup) || !strings.Contains(err.Error(), "bye") {
		t.Errorf("hang-up %v, want ErrHangup with the GOAWAY's debug data", err)
	}
	if got := recv(t, step); got != "closed" {
		t.Error(got)
	}
	if c.Usable() {
		t.Error("usable after GOAWAY")
	}
	_, err = info(c, testenv.Timeout, 1<<16)
	wantCode(t, err, codes.Unavailable)
}

// TestWatchServerStop: a server's end is seen at once, with no call.
func TestWatchServerStop(t *testing.T) { eachWatch(t, testWatchServerStop) }

func testWatchServerStop(t *testing.T, pl *Poller) {
	for _, graceful := range []bool{false, true} {
		srv, path := newServer(t, registration{})
		t.Cleanup(srv.Stop)
		c := dial(t, path)
		if _, err := info(c, testenv.Timeout, 1<<16); err != nil {
			t.Fatal(err)
		}
		hung := watched(t, pl, c)
		stopped := make(chan struct{})
		go func() {
			if graceful {
				srv.GracefulStop() // ends because the watch closes the connection
			} else {
				srv.Stop()
			}
			close(stopped)
		}()
		if err := recv(t, hung); !errors.Is(err, ErrHangup) {
			t.Errorf("graceful %v: hang-up %v, not ErrHangup", graceful, err)
		}
		recv(t, stopped)
	}
}

// TestWatchCalls: calls on a watched connection take it from the watch and
// give it back, with the server's PINGs and window updates coming between
// (grpc-go's server sends them as it answers).
func TestWatchCalls(t *testing.T) { eachWatch(t, testWatchCalls) }

func testWatchCalls(t *testing.T, pl *Poller) {
	c := dial(t, serve(t, registration{}))
	hung := watched(t, pl, c)
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for i := range 100 {
				if _, err := info(c, testenv.Timeout, 1<<16); err != nil {
					t.Errorf("call %d: %v", i, err)
					return
				}
			}
		})
	}
	wg.Wait()
	noHangup(t, hung)
	if !c.Usable() {
		t.Fatal("unusable")
	}
	c.Close()
	c.mu.Lock()
	if c.w != nil {
		t.Error("the watch goroutine runs after Close")
	}
	c.mu.Unlock()
	noHangup(t, hung)
}

// TestWatchHandover: a call that begins while the watch has read part of a
// frame finishes reading the frame itself, and answers it.
func TestWatchHandover(t *testing.T) { eachWatch(t, testWatchHandover) }

func testWatchHandover(t *testing.T, pl *Poller) {
	reads := make(chan int, 16)
	setReadHook(pl, reads)
	acked := make(chan string, 1)
	wrote, next := make(chan struct{}), make(chan struct{})
	path := rawPeer(t, func(p *peer) {
		p.hello()
		p.answer(p.readRequest(getInfo, true), peerInfo)
		<-next // not read ahead by the call
		var b bytes.Buffer
		http2.NewFramer(&b, nil).WritePing(false, [8]byte{'h', 'a', 'l', 'f'})
		_, err := p.nc.Write(b.Bytes()[:5])
		p.check(err)
		close(wrote)
		s := p.readRequest(getInfo, true) // the call has the socket
		_, err = p.nc.Write(b.Bytes()[5:])
		p.check(err)
		acked <- p.readPing()
		p.answer(s, peerInfo)
		p.drain()
	})
	c := dial(t, path)
	if _, err := info(c, testenv.Timeout, 1<<16); err != nil {
		t.Fatal(err)
	}
	hung := watched(t, pl, c)
	next <- struct{}{}
	<-wrote
	if n := recv(t, reads); n != 5 {
		t.Fatalf("the watch read %d bytes, want the 5 sent", n)
	}
	if _, err := info(c, testenv.Timeout, 1<<16); err != nil {
		t.Fatal(err)
	}
	if got := recv(t, acked); got != "ack true half" {
		t.Errorf("the peer got %q, want the PING acknowledged", got)
	}
	noHangup(t, hung)
}

// setReadHook has pl's watches tell reads how much each read returned; a
// report nobody waits for is dropped. It is set before pl's first watch.
func setReadHook(pl *Poller, reads chan<- int) {
	pl.hookRead = func(n int) {
		select {
		case reads <- n:
		default:
		}
	}
}

// TestWatchAnswerWhenIdle: what may only come in answer to a call breaks a
// watched idle connection.
func TestWatchAnswerWhenIdle(t *testing.T) { eachWatch(t, testWatchAnswerWhenIdle) }

func testWatchAnswerWhenIdle(t *testing.T, pl *Poller) {
	next := make(chan struct{})
	path := rawPeer(t, func(p *peer) {
		p.hello()
		s := p.readRequest(getInfo, true)
		p.answer(s, peerInfo)
		<-next // not read ahead by the call
		p.headers(s+2, true, okHeaders...)
		p.drain()
	})
	c := dial(t, path)
	if _, err := info(c, testenv.Timeout, 1<<16); err != nil {
		t.Fatal(err)
	}
	hung := watched(t, pl, c)
	next <- struct{}{}
	if err := recv(t, hung); !errors.Is(err, ErrProtocol) {
		t.Errorf("hang-up %v, not ErrProtocol", err)
	}
}

// TestWatchEndedByACall: a call that leaves the connection unusable (the
// server answers, and sends GOAWAY) ends the watch without a hang-up: its
// caller can tell.
func TestWatchEndedByACall(t *testing.T) { eachWatch(t, testWatchEndedByACall) }

func testWatchEndedByACall(t *testing.T, pl *Poller) {
	path := rawPeer(t, func(p *peer) {
		p.hello()
		s := p.readRequest(getInfo, true)
		p.check(p.fr.WriteGoAway(s, http2.ErrCodeNo, nil))
		p.answer(s, peerInfo)
		p.drain()
	})
	c := dial(t, path)
	hung := watched(t, pl, c)
	if _, err := info(c, testenv.Timeout, 1<<16); err != nil {
		t.Fatal(err)
	}
	if c.Usable() {
		t.Fatal("usable after GOAWAY")
	}
	c.mu.Lock()
	running := c.w != nil || c.onHangup != nil
	c.mu.Unlock()
	if running {
		t.Error("still watched")
	}
	noHangup(t, hung)
	if err := c.Watch(pl, func(error) {}); err == nil {
		t.Error("Watch of an unusable connection succeeded")
	}
}

func TestWatchTwice(t *testing.T) { eachWatch(t, testWatchTwice) }

func testWatchTwice(t *testing.T, pl *Poller) {
	c := dial(t, serve(t, registration{}))
	watched(t, pl, c)
	if err := c.Watch(pl, func(error) {}); err == nil {
		t.Error("a second Watch succeeded")
	}
}

// TestWatchFlood: a peer that floods an idle connection has it closed with
// ErrFlood, after the bucket's burst (the clock stands still here, so that
// nothing refills it); one that sends as much, slowly enough, keeps it.
func TestWatchFlood(t *testing.T) { eachWatch(t, testWatchFlood) }

func testWatchFlood(t *testing.T, pl *Poller) {
	frame := func(write func(fr *http2.Framer)) []byte {
		var b bytes.Buffer
		write(http2.NewFramer(&b, nil))
		return b.Bytes()
	}
	settings := make([]http2.Setting, 16<<10/6)
	for i := range settings {
		settings[i] = http2.Setting{ID: http2.SettingMaxConcurrentStreams, Val: uint32(i)}
	}
	for _, tc := range []struct {
		name  string
		frame []byte
		// oneByte writes the frames a byte at a time, each once the last is read.
		oneByte bool
	}{
		{"WINDOW_UPDATE", frame(func(fr *http2.Framer) { fr.WriteWindowUpdate(0, 1) }), false},
		{"RST_STREAM", frame(func(fr *http2.Framer) { fr.WriteRSTStream(1, http2.ErrCodeNo) }), false},
		{"unknown", frame(func(fr *http2.Framer) { fr.WriteRawFrame(0xfa, 0, 0, bytes.Repeat([]byte{1}, 16<<10)) }), false},
		{"SETTINGS", frame(func(fr *http2.Framer) { fr.WriteSettings(settings...) }), false},
		{"PING a byte at a time", frame(func(fr *http2.Framer) { fr.WritePing(false, [8]byte{}) }), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var reads chan int
			if tc.oneByte {
				reads = make(chan int, 1)
			}
			var readSome atomic.Int32 // the watch's reads that returned something
			hook := func(n int) {
				if n > 0 {
					readSome.Add(1)
				}
				if reads != nil {
					select {
					case reads <- n:
					default:
					}
				}
			}
			pl := newPoller(t, pl.goroutines)
			pl.hookRead = hook
			flooded, start := make(chan struct{}), make(chan struct{})
			sent := make(chan int, 1)
			path := rawPeer(t, func(p *peer) {
				p.hello()
				p.answer(p.readRequest(getInfo, true), peerInfo)
				<-start      // not read ahead by the call
				go p.drain() // the acks
				n := 0
				defer func() { sent <- n }()
				for ; n < 100*floodBurst; n++ {
					if tc.oneByte {
						for i := range tc.frame {
							if _, err := p.nc.Write(tc.frame[i : i+1]); err != nil {
								return
							}
							select {
							case <-reads:
							case <-flooded:
								return
							}
						}
					} else if _, err := p.nc.Write(tc.frame); err != nil {
						return // closed: flood over
					}
				}
			})
			c := dial(t, path)
			if _, err := info(c, testenv.Timeout, 1<<16); err != nil {
				t.Fatal(err)
			}
			frozen := time.Now()
			c.now = func() time.Time { return frozen }
			hung := watched(t, pl, c)
			close(start)
			err := recv(t, hung)
			close(flooded)
			if !errors.Is(err, ErrFlood) {
				t.Fatalf("hang-up %v, not ErrFlood", err)
			}
			// What the peer wrote beyond what the watch read is what the
			// socket's buffers held when it stopped reading: told, not
			// bounded here (the buffers' size is the kernel's).
			t.Logf("the peer wrote %d frames before it found the connection closed", recv(t, sent))
			if n := readSome.Load(); n > floodBurst+1 {
				t.Errorf("the watch read %d times before it stopped, want at most %d (its burst, and the read found over it)", n, floodBurst+1)
			}
			_, err = info(c, testenv.Timeout, 1<<16)
			wantCode(t, err, codes.Unavailable)
			if !errors.Is(err, ErrFlood) {
				t.Errorf("a call after the flood: %v, want ErrFlood", err)
			}
		})
	}
}

// TestWatchBusyButBounded: 2,000 PINGs at the sustained rate the bucket
// allows (the clock moves a read's worth of refill a read) keep the
// connection, and are all answered.
func TestWatchBusyButBounded(t *testing.T) { eachWatch(t, testWatchBusyButBounded) }

func testWatchBusyButBounded(t *testing.T, pl *Poller) {
	const pings = 2000
	acks := make(chan int, 1)
	path := rawPeer(t, func(p *peer) {
		p.hello()
		p.answer(p.readRequest(getInfo, true), peerInfo)
		n := 0
		for i := range pings {
			p.check(p.fr.WritePing(false, [8]byte(binary.BigEndian.AppendUint64(nil, uint64(i)))))
			if f, ok := p.readUntil(func(f http2.Frame) bool { _, ok := f.(*http2.PingFrame); return ok }).(*http2.PingFrame); ok && f.IsAck() {
				n++
			}
		}
		acks <- n
		p.drain()
	})
	c := dial(t, path)
	if _, err := info(c, testenv.Timeout, 1<<16); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	clock := time.Now()
	c.now = func() time.Time {
		mu.Lock()
		defer mu.Unlock()
		clock = clock.Add(time.Second / floodRate)
		return clock
	}
	hung := watched(t, pl, c)
	if n := recv(t, acks); n != pings {
		t.Errorf("%d PINGs acknowledged, want %d", n, pings)
	}
	noHangup(t, hung)
}

// TestWatchRSTAfterAnswer: a server may reset a stream it has answered in
// full; on a watched idle connection that is no reason to hang up. A reset
// of a stream never opened is.
func TestWatchRSTAfterAnswer(t *testing.T) { eachWatch(t, testWatchRSTAfterAnswer) }

func testWatchRSTAfterAnswer(t *testing.T, pl *Poller) {
	next := make(chan struct{})
	path := rawPeer(t, func(p *peer) {
		p.hello()
		s := p.readRequest(getInfo, true)
		p.answer(s, peerInfo)
		<-next
		p.check(p.fr.WriteRSTStream(s, http2.ErrCodeNo))
		p.check(p.fr.WritePing(false, [8]byte{'a', 'f', 't', 'e', 'r'}))
		p.readPing() // the watch read past the first reset and carried on
		p.check(p.fr.WriteRSTStream(s+2, http2.ErrCodeNo))
		p.drain()
	})
	c := dial(t, path)
	if _, err := info(c, testenv.Timeout, 1<<16); err != nil {
		t.Fatal(err)
	}
	hung := watched(t, pl, c)
	next <- struct{}{}
	err := recv(t, hung)
	if !errors.Is(err, ErrProtocol) || !strings.Contains(err.Error(), "stream 3") {
		t.Errorf("hang-up %v, want ErrProtocol for the reset of stream 3, never opened", err)
	}
}

// TestWatchAcknowledgesSettings: a connection dialed and watched with no
// call made on it still acknowledges the peer's SETTINGS: some servers close
// a connection that leaves them unacknowledged.
func TestWatchAcknowledgesSettings(t *testing.T) { eachWatch(t, testWatchAcknowledgesSettings) }

func testWatchAcknowledgesSettings(t *testing.T, pl *Poller) {
	acked := make(chan bool)
	path := rawPeer(t, func(p *peer) {
		p.hello()
		p.readPreface()
		f := p.readUntil(func(f http2.Frame) bool { sf, ok := f.(*http2.SettingsFrame); return ok && sf.IsAck() })
		acked <- f != nil
		p.drain()
	})
	c := dial(t, path)
	hung := watched(t, pl, c)
	if !recv(t, acked) {
		t.Error("no SETTINGS ACK")
	}
	noHangup(t, hung)
}

// TestPollerClose: closing a Poller ends the watches under way without a
// hang-up: their connections stay open and usable, unwatched, and are not
// watched again after a call; a later Watch fails. (newPoller checks that
// no goroutine of the Poller's is left.)
func TestPollerClose(t *testing.T) { eachWatch(t, testPollerClose) }

func testPollerClose(t *testing.T, pl *Poller) {
	path := serve(t, registration{})
	c := dial(t, path)
	if _, err := info(c, testenv.Timeout, 1<<16); err != nil {
		t.Fatal(err)
	}
	hung := watched(t, pl, c)
	pl.Close()
	pl.Close() // again: nothing more
	if _, err := info(c, testenv.Timeout, 1<<16); err != nil {
		t.Fatalf("a call after the Poller's Close: %v", err)
	}
	c.mu.Lock()
	w, onHangup := c.w, c.onHangup
	c.mu.Unlock()
	if w != nil || onHangup != nil {
		t.Error("the connection is watched again after a call, with its Poller closed")
	}
	if err := c.Watch(pl, func(error) {}); !errors.Is(err, ErrPollerClosed) {
		t.Errorf("Watch with a closed Poller: %v, want ErrPollerClosed", err)
	}
	c.Close()
	noHangup(t, hung)
}

// TestWatchAckFails: acknowledgements owed when a call ended go by
// themselves ackDelay later, from a timer; if that write fails (the peer
// has stopped reading), the watch reports the hang-up, with why, from its
// own goroutine: the timer never calls onHangup, so that Close may wait
// for it.
func TestWatchAckFails(t *testing.T) { eachWatch(t, testWatchAckFails) }

func testWatchAckFails(t *testing.T, pl *Poller) {
	end := make(chan struct{})
	path := rawPeer(t, func(p *peer) {
		p.hello()
		s := p.readRequest(getInfo, true)
		// Writing to a socket whose peer stopped reading fails (EPIPE).
		p.check(p.nc.(*net.UnixConn).CloseRead())
		p.answerWithPing(s, peerInfo, [8]byte{'o', 'w', 'e', 'd'}) // its ACK is owed
		<-end
	})
	t.Cleanup(func() { close(end) })
	c := dial(t, path)
	c.ackDelay = 300 * time.Millisecond // after the watch has started
	if _, err := info(c, testenv.Timeout, 1<<16); err != nil {
		t.Fatal(err)
	}
	hung := watched(t, pl, c)
	err := recv(t, hung)
	if !errors.Is(err, ErrHangup) || !strings.Contains(err.Error(), "acknowledging") {
		t.Errorf("hang-up %v, want ErrHangup from acknowledging the PING", err)
	}
	if c.Usable() {
		t.Error("usable after the hang-up")
	}
}
