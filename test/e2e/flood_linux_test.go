package e2e

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/plugd/plugd/api"
	"github.com/plugd/plugd/internal/testenv"
	"github.com/plugd/plugd/plugin"
)

// procStats is what the kernel says of a process: resident memory and open
// file descriptors.
type procStats struct {
	rss uint64 // bytes
	fds int
}

func statsOf(pid int) (procStats, error) {
	var st procStats
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return st, err
	}
	for line := range strings.Lines(string(b)) {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, err := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			if err != nil {
				return st, fmt.Errorf("VmRSS %q: %w", v, err)
			}
			st.rss = kb << 10
		}
	}
	fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	st.fds = len(fds)
	return st, err
}

// sampler watches a process until stopped, keeping the highest figures, and
// closes over when its memory grows past baseline+limit.
type sampler struct {
	pid      int
	baseline procStats
	limit    uint64
	over     chan struct{}
	stop     chan struct{}
	done     chan struct{}

	mu   sync.Mutex
	peak procStats
	err  error
}

func startSampler(t *testing.T, pid int, limit uint64) *sampler {
	t.Helper()
	base, err := statsOf(pid)
	if err != nil {
		t.Fatal(err)
	}
	s := &sampler{pid: pid, baseline: base, peak: base, limit: limit,
		over: make(chan struct{}), stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(s.done)
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-s.stop:
				return
			case <-tick.C:
			}
			st, err := statsOf(pid)
			s.mu.Lock()
			if err != nil {
				s.err = err
				s.mu.Unlock()
				return
			}
			s.peak.rss, s.peak.fds = max(s.peak.rss, st.rss), max(s.peak.fds, st.fds)
			s.mu.Unlock()
			if st.rss > base.rss+limit {
				close(s.over)
				return
			}
		}
	}()
	t.Cleanup(s.finish)
	return s
}

// finish stops the sampler and returns the peak.
func (s *sampler) finish() {
	select {
	case <-s.stop:
	default:
		close(s.stop)
	}
	<-s.done
}

func (s *sampler) figures() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return fmt.Sprintf("RSS %.1f MiB at rest, %.1f MiB at most (+%.1f MiB); open files %d at rest, %d at most",
		mib(s.baseline.rss), mib(s.peak.rss), mib(s.peak.rss-s.baseline.rss), s.baseline.fds, s.peak.fds)
}

func (s *sampler) growth() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.peak.rss - s.baseline.rss
}

func mib(b uint64) float64 { return float64(b) / (1 << 20) }

// flood opens n connections with dial, in parallel, and runs each through
// use; it stops early when abort is closed. It returns the connections
// open, and how many could not be opened.
func flood(n int, dial func() (net.Conn, error), use func(net.Conn) error, abort <-chan struct{}) (conns []net.Conn, failed int) {
	var (
		mu   sync.Mutex
		wg   sync.WaitGroup
		next atomic.Int64
	)
	for range 64 {
		wg.Go(func() {
			for next.Add(1) <= int64(n) {
				select {
				case <-abort:
					return
				default:
				}
				c, err := dial()
				if err == nil {
					if err = use(c); err != nil {
						c.Close()
					}
				}
				mu.Lock()
				if err != nil {
					failed++
				} else {
					conns = append(conns, c)
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return conns, failed
}

func closeAll(conns []net.Conn) {
	for _, c := range conns {
		c.Close()
	}
}

// freeLoopbackPort is a TCP port on 127.0.0.1 that nobody listened on a
// moment ago.
func freeLoopbackPort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// Issue 13, item 1: clients that ask for the plugin list and never read the
// answer must not pin it. 5,000 of them over TCP, with small receive
// buffers (as an attacker would set them), against a plugd that knows 3,000
// sockets (an answer of about a megabyte): plugd's memory stays flat, its
// connections stay bounded, the writes that never progress are cut, and
// the unix socket's clients are served all along.
func TestStatusAPIUnderNonReadingClients(t *testing.T) {
	const (
		sockets   = 3000
		clients   = 5000
		firstWave = 1000
		// Far above what the bounds allow, far below what the flood
		// costs without them (about a megabyte per client).
		abortAbove = 400 << 20
		// The bounds: two 4 MiB budgets of answers, a build at a time, 128
		// connections; and what Go's collector lets the heap grow to.
		boundedBy  = 64 << 20
		flatWithin = 32 << 20
	)
	addr := freeLoopbackPort(t)
	n, args := newNode(t, "mode: observe\n", func(reg string) {
		if err := os.MkdirAll(reg, 0o750); err != nil {
			t.Fatal(err)
		}
		for i := range sockets {
			testenv.DeadSocket(t, filepath.Join(reg, fmt.Sprintf("dead-%04d.sock", i)))
		}
	})
	n.plugd = start(t, "plugd", append(args, "--status-tcp", addr)...)
	n.waitReady(t, 10*time.Millisecond)
	ctx := context.Background()
	var body int
	for range 3 { // warm up: what one answer costs is part of the rest state
		_, b := n.get(t, "/v1/plugins")
		body = len(b)
	}
	if ps, err := n.client.Plugins(ctx, api.Filter{}); err != nil || len(ps) != sockets {
		t.Fatalf("plugd knows %d plugins (%v), want %d", len(ps), err, sockets)
	}
	s := startSampler(t, n.plugd.cmd.Process.Pid, abortAbove)

	// Each client asks for the list and reads nothing, with a 4 KiB
	// receive buffer, so that almost all of the answer stays with plugd.
	request := []byte("GET /v1/plugins HTTP/1.1\r\nHost: plugd\r\n\r\n")
	d := net.Dialer{Timeout: 500 * time.Millisecond, Control: func(_, _ string, c syscall.RawConn) error {
		return c.Control(func(fd uintptr) { syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096) })
	}}
	dial := func() (net.Conn, error) { return d.Dial("tcp", addr) }
	ask := func(c net.Conn) error { _, err := c.Write(request); return err }

	// While they hold on, the unix socket answers the list, TCP answers
	// /healthz (the kubelet's probe), and plugd's memory is watched.
	probe := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	var slowest, slowestProbe time.Duration
	hold := func(d time.Duration, clients int) {
		t.Helper()
		for until := time.Now().Add(d); time.Now().Before(until); {
			select {
			case <-s.over:
				t.Fatalf("plugd grew by more than %d MiB under %d clients that do not read: %s", abortAbove>>20, clients, s.figures())
			case <-time.After(500 * time.Millisecond):
			}
			asked := time.Now()
			ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			ps, err := n.client.Plugins(ctx, api.Filter{})
			cancel()
			if err != nil || len(ps) != sockets {
				t.Fatalf("during the flood, the list on the unix socket: %d plugins, %v; %s", len(ps), err, s.figures())
			}
			slowest = max(slowest, time.Since(asked))
			asked = time.Now()
			resp, err := probe.Get("http://" + addr + "/healthz")
			if err != nil {
				t.Fatalf("during the flood, /healthz over TCP: %v; %s", err, s.figures())
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("during the flood, /healthz over TCP: %s", resp.Status)
			}
			slowestProbe = max(slowestProbe, time.Since(asked))
		}
	}

	// A first wave, then four times as many: the second must cost next to
	// nothing more. Both are held past plugd's write deadline (10s).
	began := time.Now()
	conns, failed := flood(firstWave, dial, ask, s.over)
	defer func() { closeAll(conns) }()
	hold(4*time.Second, len(conns))
	first := s.growth()
	more, failedMore := flood(clients-firstWave, dial, ask, s.over)
	conns, failed = append(conns, more...), failed+failedMore
	t.Logf("%d clients connected and asked (%d could not connect: the kernel's accept queue was full)", len(conns), failed)
	hold(time.Until(began.Add(13*time.Second)), len(conns))

	// Read what each client got: plugd cut the answers that did not
	// progress (a 200 shorter than its Content-Length, then the end), or
	// turned the client away while its budget was full (503); the rest
	// wait their turn in the accept queue.
	var cut, busy, whole, waiting atomic.Int64
	deadline := time.Now().Add(5 * time.Second)
	var wg sync.WaitGroup
	next := atomic.Int64{}
	for range 256 {
		wg.Go(func() {
			for i := next.Add(1) - 1; i < int64(len(conns)); i = next.Add(1) - 1 {
				c := conns[i]
				c.SetReadDeadline(deadline)
				resp, err := http.ReadResponse(bufio.NewReader(c), nil)
				if err != nil {
					waiting.Add(1)
					continue
				}
				got, err := io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				switch {
				case resp.StatusCode == http.StatusServiceUnavailable:
					busy.Add(1)
				case err != nil && !errors.Is(err, os.ErrDeadlineExceeded) && got < resp.ContentLength:
					cut.Add(1)
				case err == nil:
					whole.Add(1)
				default:
					waiting.Add(1)
				}
			}
		})
	}
	wg.Wait()
	s.finish()
	t.Logf("%d clients that do not read, an answer of %d KiB: %s; the unix socket's slowest list took %s, TCP's slowest /healthz %s; "+
		"afterwards %d answers had been cut at the write deadline, %d clients told busy (503), %d answered whole once read, %d still queued",
		len(conns), body>>10, s.figures(), slowest.Round(time.Millisecond), slowestProbe.Round(time.Millisecond), cut.Load(), busy.Load(), whole.Load(), waiting.Load())
	t.Logf("%d clients cost plugd %.1f MiB; %d clients %.1f MiB", firstWave, mib(first), len(conns), mib(s.growth()))
	closeAll(conns)
	if code := n.plugd.stop(t, syscall.SIGTERM); code != 0 {
		t.Errorf("plugd exit code %d after the flood", code)
	}
	if g := s.growth(); g > boundedBy {
		t.Errorf("plugd grew by %.1f MiB, more than %d MiB", mib(g), boundedBy>>20)
	}
	if g := s.growth() - first; g > flatWithin {
		t.Errorf("%d more clients cost plugd %.1f MiB more, more than %d MiB: its memory is not flat", len(conns)-firstWave, mib(g), flatWithin>>20)
	}
	if cut.Load() == 0 {
		t.Errorf("no answer was cut: writes to clients that do not read have no deadline")
	}
}

// Issue 13, item 8: thousands of keep-alive status clients must not take
// the file descriptors plugins need. plugd runs with a limit of 1024 open
// files; 3,000 clients connect to the status socket, ask once and stay
// connected. A plugin that comes after them is registered, and a new client
// is still answered (it takes an idle one's place).
func TestStatusClientsLeaveFDsForPlugins(t *testing.T) {
	const clients = 3000
	n, args := newNode(t, "", nil)
	n.plugd = startCmd(t, exec.Command("/bin/sh", append([]string{"-c", `ulimit -n 1024 && exec "$@"`, "sh", filepath.Join(bin, "plugd")}, args...)...))
	n.waitReady(t, 10*time.Millisecond)
	s := startSampler(t, n.plugd.cmd.Process.Pid, 1<<30)

	request := []byte("GET /healthz HTTP/1.1\r\nHost: plugd\r\n\r\n")
	var unanswered atomic.Int64
	keepAlive := func(c net.Conn) error {
		if _, err := c.Write(request); err != nil {
			return err
		}
		c.SetReadDeadline(time.Now().Add(500 * time.Millisecond))
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if errors.Is(err, os.ErrDeadlineExceeded) {
			unanswered.Add(1) // stays connected, waiting
			return nil
		}
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		if _, err := io.Copy(io.Discard, resp.Body); err != nil {
			return err
		}
		if resp.StatusCode != http.StatusOK || resp.Close {
			return fmt.Errorf("%s, close %v", resp.Status, resp.Close)
		}
		return nil
	}
	began := time.Now()
	conns, failed := flood(clients, func() (net.Conn, error) { return net.DialTimeout("unix", n.socket, 3*time.Second) }, keepAlive, nil)
	defer closeAll(conns)
	t.Logf("%d keep-alive clients connected in %s, %d of them not answered within 500ms; %d could not connect or were closed",
		len(conns), time.Since(began).Round(time.Millisecond), unanswered.Load(), failed)

	p := testenv.StartPlugin(t, plugin.Config{Dir: n.reg, Socket: "late.sock", Type: "CSIPlugin", Name: "late.example.com", Versions: []string{"1.0.0"}})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := p.WaitRegistered(ctx); err != nil {
		t.Fatalf("a plugin that came after %d status clients: %v; %s\nplugd's log ends:\n%s", len(conns), err, s.figures(), tail(n.plugd.out.String(), 10))
	}
	if _, err := n.client.Plugins(ctx, api.Filter{}); err != nil {
		t.Errorf("a new status client after %d idle ones: %v", len(conns), err)
	}
	s.finish()
	t.Logf("%d keep-alive status clients at a limit of 1024 open files: %s", len(conns), s.figures())
	closeAll(conns)
	if code := n.plugd.stop(t, syscall.SIGTERM); code != 0 {
		t.Errorf("plugd exit code %d after the flood", code)
	}
	if s.peak.fds > 1024-256 {
		t.Errorf("plugd had %d files open; status connections should leave three quarters of 1024 to plugins", s.peak.fds)
	}
}

// tail is the last n lines of s.
func tail(s string, n int) string {
	lines := bytes.Split([]byte(strings.TrimRight(s, "\n")), []byte("\n"))
	return string(bytes.Join(lines[max(len(lines)-n, 0):], []byte("\n")))
}
