package pluginmanager

import (
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/sys/unix"
)

// hangups tells, at once, when the process behind a registered plugin's
// socket goes away, which a periodic probe would only notice up to an
// interval later. It holds one idle connection to each registered socket, and
// a single epoll set (one goroutine for all of them, whatever their number)
// reports when any is hung up. The plugin is then probed at once: one that
// still answers (its server merely closed an idle connection) is watched
// again; one that does not is Unhealthy.
type hangups struct {
	epfd, wake int // the epoll set, and an eventfd in it that ends run
	onHangup   func(*hangup)

	mu     sync.Mutex
	next   int32
	byID   map[int32]*hangup
	closed bool
}

// hangup is one watched connection.
type hangup struct {
	id   int32
	path string
	file *os.File // our end of the connection
}

func newHangups(onHangup func(*hangup)) (*hangups, error) {
	epfd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return nil, err
	}
	wake, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		unix.Close(epfd)
		return nil, err
	}
	if err := unix.EpollCtl(epfd, unix.EPOLL_CTL_ADD, wake, &unix.EpollEvent{Events: unix.EPOLLIN, Pad: -1}); err != nil {
		unix.Close(wake)
		unix.Close(epfd)
		return nil, err
	}
	return &hangups{epfd: epfd, wake: wake, onHangup: onHangup, byID: make(map[int32]*hangup)}, nil
}

// watch connects to the socket at path and watches the connection.
func (h *hangups) watch(ctx context.Context, path string, timeout time.Duration) (*hangup, error) {
	d := net.Dialer{Timeout: timeout}
	c, err := d.DialContext(ctx, "unix", path)
	if err != nil {
		return nil, err
	}
	// Open an HTTP/2 connection, as a gRPC client does, and go quiet. A
	// connection that never sent the preface would sit in the plugin's gRPC
	// handshake, which its server's Stop waits for; this one is an ordinary
	// idle connection that the server closes whenever it likes.
	c.SetWriteDeadline(time.Now().Add(timeout))
	if _, err := io.WriteString(c, http2.ClientPreface); err != nil {
		c.Close()
		return nil, err
	}
	if err := http2.NewFramer(c, nil).WriteSettings(); err != nil {
		c.Close()
		return nil, err
	}
	f, err := c.(*net.UnixConn).File() // a duplicate, ours to poll
	c.Close()
	if err != nil {
		return nil, err
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		f.Close()
		return nil, errors.New("manager stopping")
	}
	h.next++
	w := &hangup{id: h.next, path: path, file: f}
	ev := unix.EpollEvent{Events: unix.EPOLLRDHUP | unix.EPOLLHUP | unix.EPOLLERR | unix.EPOLLONESHOT, Pad: w.id}
	if err := unix.EpollCtl(h.epfd, unix.EPOLL_CTL_ADD, int(f.Fd()), &ev); err != nil {
		f.Close()
		return nil, err
	}
	h.byID[w.id] = w
	return w, nil
}

// unwatch stops watching w and closes its connection. w may be nil, and may
// have been unwatched already.
func (h *hangups) unwatch(w *hangup) {
	if w == nil {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.dropLocked(w)
}

func (h *hangups) dropLocked(w *hangup) {
	if h.byID[w.id] != w {
		return
	}
	delete(h.byID, w.id)
	unix.EpollCtl(h.epfd, unix.EPOLL_CTL_DEL, int(w.file.Fd()), nil)
	w.file.Close()
}

// run reports hang-ups until close is called.
func (h *hangups) run() {
	events := make([]unix.EpollEvent, 64)
	for {
		n, err := unix.EpollWait(h.epfd, events, -1)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return
		}
		var hung []*hangup
		h.mu.Lock()
		for _, ev := range events[:n] {
			if ev.Pad == -1 {
				h.mu.Unlock()
				return // close
			}
			if w := h.byID[ev.Pad]; w != nil {
				h.dropLocked(w)
				hung = append(hung, w)
			}
		}
		h.mu.Unlock()
		for _, w := range hung {
			h.onHangup(w)
		}
	}
}

// close ends run and closes every watched connection. run must have been
// started, and close is called once, after which watch fails.
func (h *hangups) close() {
	h.mu.Lock()
	h.closed = true
	for _, w := range h.byID {
		h.dropLocked(w)
	}
	h.mu.Unlock()
	var one [8]byte
	binary.NativeEndian.PutUint64(one[:], 1)
	unix.Write(h.wake, one[:])
}

// release frees the epoll set and the eventfd, once run has returned.
func (h *hangups) release() {
	unix.Close(h.wake)
	unix.Close(h.epfd)
}
