//go:build unix

package unaryconn

// Idle, pluginmanager's way (until it moves to Watch) to handle what the
// peer sent a connection its epoll set found readable.

import (
	"bytes"
	"context"
	"errors"
	"io"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
)

// TestServerGracefulStop makes a call after the server sent GOAWAY to an idle
// connection. grpc-go's first GOAWAY is a warning that still lets streams
// begin (the last stream ID is the largest), so the call may be answered;
// either way the connection is then unusable and nothing hangs.
func TestServerGracefulStop(t *testing.T) {
	srv, path := newServer(t, registration{})
	t.Cleanup(srv.Stop)
	c := dial(t, path)
	if _, err := info(c, wait, 1<<16); err != nil {
		t.Fatal(err)
	}
	stopped := make(chan struct{})
	go func() {
		srv.GracefulStop()
		close(stopped)
	}()
	waitReadable(t, c)

	_, err := info(c, wait, 1<<16)
	t.Logf("the call after GOAWAY: %v", err)
	if err != nil {
		wantCode(t, err, codes.Unavailable) // not DeadlineExceeded: it did not wait
	}
	if c.Usable() {
		t.Error("the connection is usable after GOAWAY")
	}
	_, err = info(c, wait, 1<<16)
	wantCode(t, err, codes.Unavailable)

	c.Close()
	recv(t, stopped)
}

// waitReadable waits until the peer has sent c something: GOAWAY, here.
func waitReadable(t *testing.T, c *Conn) {
	t.Helper()
	rc, err := c.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var n int
	err = rc.Control(func(fd uintptr) {
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		for {
			n, err = unix.Poll(fds, int(wait/time.Millisecond))
			if !errors.Is(err, unix.EINTR) {
				return
			}
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	if n == 0 {
		t.Fatal("timed out waiting for the server's GOAWAY")
	}
}

// TestIdleGracefulStop: a server stopping gracefully sends an idle
// connection GOAWAY (and a PING) and waits; Idle finds the connection
// unusable, and closing it lets GracefulStop end at once.
func TestIdleGracefulStop(t *testing.T) {
	srv, path := newServer(t, registration{})
	t.Cleanup(srv.Stop)
	c := dial(t, path)
	if _, err := info(c, wait, 1<<16); err != nil {
		t.Fatal(err)
	}
	if !c.Idle() {
		t.Fatal("Idle on a quiet connection: not usable")
	}
	stopped := make(chan struct{})
	go func() {
		srv.GracefulStop()
		close(stopped)
	}()
	waitReadable(t, c)
	if c.Idle() {
		t.Error("Idle after GOAWAY: still usable")
	}
	c.Close()
	recv(t, stopped)
}

// TestIdlePing: PINGs sent to an idle connection are answered, even when a
// frame arrives in pieces; an answer when no call is in flight breaks the
// connection.
func TestIdlePing(t *testing.T) {
	step := make(chan string)
	next := make(chan struct{})
	path := rawPeer(t, func(p *peer) {
		p.hello()
		p.answer(p.readRequest(getInfo, true), peerInfo)
		<-next // not in the same read as the answer: see TestPingAfterAnswer

		p.check(p.fr.WritePing(false, [8]byte{'w', 'h', 'o', 'l', 'e'}))
		step <- p.readPing()

		var b bytes.Buffer
		http2.NewFramer(&b, nil).WritePing(false, [8]byte{'s', 'p', 'l', 'i', 't'})
		_, err := p.nc.Write(b.Bytes()[:10])
		p.check(err)
		step <- "half"
		<-next
		_, err = p.nc.Write(b.Bytes()[10:])
		p.check(err)
		step <- p.readPing()

		p.headers(99, true, okHeaders...)
		step <- "headers"
		p.drain()
	})
	c := dial(t, path)
	if _, err := info(c, wait, 1<<16); err != nil {
		t.Fatal(err)
	}
	idle := func(want bool) {
		t.Helper()
		waitReadable(t, c)
		if got := c.Idle(); got != want {
			t.Fatalf("Idle() = %v, want %v (%v)", got, want, c.broken)
		}
	}
	next <- struct{}{}
	idle(true)
	if got := recv(t, step); got != "ack true whole" {
		t.Errorf("the peer got %q, want a PING ACK with its data", got)
	}
	if got := recv(t, step); got != "half" {
		t.Fatal(got)
	}
	idle(true) // half a frame: kept for later
	next <- struct{}{}
	idle(true)
	if got := recv(t, step); got != "ack true split" {
		t.Errorf("the peer got %q, want a PING ACK with its data", got)
	}
	if got := recv(t, step); got != "headers" {
		t.Fatal(got)
	}
	idle(false)
	if c.Usable() {
		t.Error("usable after an answer to no call")
	}
}

// TestIdleRSTAfterAnswer: a server may reset a stream it has answered in
// full; on an idle connection that is no reason to drop it. A reset of a
// stream never opened is.
func TestIdleRSTAfterAnswer(t *testing.T) {
	next := make(chan struct{})
	path := rawPeer(t, func(p *peer) {
		p.hello()
		s := p.readRequest(getInfo, true)
		p.answer(s, peerInfo)
		<-next
		p.check(p.fr.WriteRSTStream(s, http2.ErrCodeNo))
		<-next
		p.check(p.fr.WriteRSTStream(s+2, http2.ErrCodeNo))
		p.drain()
	})
	c := dial(t, path)
	if _, err := info(c, wait, 1<<16); err != nil {
		t.Fatal(err)
	}
	next <- struct{}{}
	waitReadable(t, c)
	if !c.Idle() {
		t.Errorf("unusable after RST_STREAM(NO_ERROR) of an answered stream: %v", c.broken)
	}
	next <- struct{}{}
	waitReadable(t, c)
	if c.Idle() {
		t.Error("usable after RST_STREAM of a stream never opened")
	}
}

// TestIdleDoesNotWaitForACall: Idle is for a goroutine that watches many
// connections; a call in flight on this one must not hold it up.
func TestIdleDoesNotWaitForACall(t *testing.T) {
	started, release := make(chan struct{}), make(chan struct{})
	c := dial(t, serve(t, registration{getInfo: func(context.Context) (*registerapi.PluginInfo, error) {
		close(started)
		<-release
		return peerInfo, nil
	}}))
	done := make(chan error, 1)
	go func() {
		_, err := info(c, wait, 1<<16)
		done <- err
	}()
	<-started
	returned := make(chan bool)
	go func() { returned <- c.Idle() }()
	select {
	case usable := <-returned:
		if !usable {
			t.Error("Idle during a call: unusable")
		}
	case <-time.After(wait):
		t.Error("Idle waited for the call in flight")
	}
	close(release)
	if err := <-done; err != nil {
		t.Error(err)
	}
}

// TestIdleAcknowledgesSettings: a connection dialed and left idle, with no
// call, still acknowledges the peer's SETTINGS when Idle runs.
func TestIdleAcknowledgesSettings(t *testing.T) {
	acked := make(chan bool)
	path := rawPeer(t, func(p *peer) {
		p.hello()
		preface := make([]byte, len(http2.ClientPreface))
		_, err := io.ReadFull(p.nc, preface)
		p.check(err)
		p.started = true
		f := p.readUntil(func(f http2.Frame) bool { sf, ok := f.(*http2.SettingsFrame); return ok && sf.IsAck() })
		acked <- f != nil
		p.drain()
	})
	c := dial(t, path)
	if !c.Idle() {
		t.Fatal(c.broken)
	}
	if !recv(t, acked) {
		t.Error("no SETTINGS ACK")
	}
}
