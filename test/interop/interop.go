// Package interop runs plugins' registration servers written with other
// gRPC stacks than plugd's, as real processes on unix sockets, for tests
// that register and probe them: Python grpcio (Debian's python3-grpcio),
// Node @grpc/grpc-js, grpc-go as plugd links it, grpc-go v1.27 (the
// vintage of many deployed node-driver-registrars), and a scripted HTTP/2
// server that does what those do not (Raw, with a Scenario).
//
// Every server serves pluginregistration.Registration (GetInfo and
// NotifyRegistrationStatus) and reports on its standard output, one JSON
// object a line, what it was asked and told, which a test reads back as
// Events: "told exactly once" is len(s.Told()) == 1.
//
// A test package that starts servers runs its tests through Run, which
// builds the servers written in Go (once, on first use) and removes them at
// the end:
//
//	func TestMain(m *testing.M) { os.Exit(interop.Run(m)) }
//
//	func TestSomething(t *testing.T) {
//		srv := interop.Start(t, interop.Python, interop.Options{Type: "CSIPlugin", Name: "csi.example.com"})
//		// register srv.Socket, then:
//		if told := srv.Told(); len(told) != 1 || !told[0].Registered { ... }
//	}
//
// The Go servers need only the Go module proxy or cache. Python grpcio and
// Node grpc-js are installed by setup.sh in this directory (apt-get as root;
// npm ci as anyone). Where one is missing, a test that asks for it is
// skipped with what to run; with PLUGD_INTEROP=require, as .ci/run sets
// after running setup.sh, it fails instead.
package interop

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/plugd/plugd/api"
	"github.com/plugd/plugd/internal/testenv"
)

// Stack is a gRPC implementation a server is written with.
type Stack string

const (
	GRPCGo    Stack = "grpc-go"       // google.golang.org/grpc as plugd links it (v1.85)
	GRPCGo127 Stack = "grpc-go-v1.27" // google.golang.org/grpc v1.27.1 (early 2020), its own module: grpc127/
	Python    Stack = "python-grpcio" // Debian's python3-grpcio (1.51 on bookworm): python/server.py
	Node      Stack = "node-grpc-js"  // @grpc/grpc-js from npm: node/server.js
	Raw       Stack = "raw-http2"     // golang.org/x/net/http2's Framer, scripted: cmd/rawh2-server
)

// Stacks are the real gRPC implementations (Raw is not one).
var Stacks = []Stack{GRPCGo, GRPCGo127, Python, Node}

// The scenarios of the Raw server: each is the behaviour of some real
// server that grpc-go's client copes with. "" is a plain, correct server.
const (
	TableSizeZero   = "table-size-0"      // SETTINGS_HEADER_TABLE_SIZE 0, and nghttp2's insistence on the HPACK size update after it
	TableSizeStrict = "table-size-strict" // the same, insisting on the update in a connection's first header block, even one sent with the preface
	BigTrailers     = "trailers-20k"      // 20 KiB of trailers, in HEADERS and CONTINUATION
	ForcedGzip      = "gzip"              // every answer gzip-compressed, whatever the client offers
	MaxStreamsZero  = "max-streams-0"     // SETTINGS_MAX_CONCURRENT_STREAMS 0, raised after a PING round trip; a stream opened before is refused
	Interim103      = "interim-103"       // a 103 Early Hints before every answer
	GoAwayError     = "goaway-error"      // the first connection's first call: GOAWAY(ENHANCE_YOUR_CALM, "too_many_pings") not covering it
	GoAwayCalm      = "goaway-calm"       // every connection's first call: GOAWAY(ENHANCE_YOUR_CALM, "calm down") covering it, the socket kept open
	DropAfterNotify = "drop-after-notify" // NotifyRegistrationStatus is read whole, recorded, and the connection closed unanswered
	Ping            = "ping"              // PINGs on every idle connection, every 50 ms; each ACK is an event
	FloodWindow     = "flood-window"      // 100 ms after the first answer, WINDOW_UPDATE frames as fast as the socket takes them
	FloodReset      = "flood-rst"         // the same with RST_STREAM of the answered stream
	FloodUnknown    = "flood-unknown"     // the same with 16 KiB frames of an unknown type
	FloodSettings   = "flood-settings"    // the same with SETTINGS of 2,730 settings each
	ResetFirstConn  = "reset-first-conn"  // every call on the first connection is reset with PROTOCOL_ERROR, as if the client had broken the protocol; later connections are served
)

// Scenarios are the Raw server's scenarios.
var Scenarios = []string{TableSizeZero, TableSizeStrict, BigTrailers, ForcedGzip, MaxStreamsZero, Interim103, GoAwayError, GoAwayCalm, DropAfterNotify, Ping, FloodWindow, FloodReset, FloodUnknown, FloodSettings, ResetFirstConn}

// Options say what a server answers.
type Options struct {
	// Socket is where the server listens; empty is a new socket in a
	// directory of its own, removed when the test ends.
	Socket string

	// What GetInfo answers.
	Type, Name, Endpoint string
	Versions             []string

	// Gzip compresses answers with gzip (grpc-go's server does so
	// whatever the client offers; grpcio and grpc-js where it is offered).
	Gzip bool
	// TrailerBytes adds a trailer of that many bytes to every answer.
	TrailerBytes int
	// NotifyError makes NotifyRegistrationStatus answer with this error
	// (FAILED_PRECONDITION), after recording it, as the DRA helper does.
	NotifyError string

	// Scenario is the Raw server's behaviour (see Scenarios).
	Scenario string
}

// Event is one line of a server's report.
type Event struct {
	// Event is what happened: "listening", "GetInfo",
	// "NotifyRegistrationStatus", "stopped", and for the Raw server
	// "accepted" (a connection) and, in scenarios, "ping-ack", "refused",
	// "compression-error", "goaway", "flood-end", "reset".
	Event string `json:"event"`

	Registered bool   `json:"registered,omitempty"` // NotifyRegistrationStatus's plugin_registered
	Error      string `json:"error,omitempty"`      // NotifyRegistrationStatus's error
	Encoding   string `json:"accept_encoding,omitempty"`
	Frames     int    `json:"frames,omitempty"` // flood-end: frames written
	// Idle, of flood-end: the flood began after NotifyRegistrationStatus
	// was answered on the connection, which the client then held idle.
	Idle    bool   `json:"idle,omitempty"`
	Message string `json:"message,omitempty"`
}

// Server is a running server process.
type Server struct {
	Stack  Stack
	Socket string

	cmd    *exec.Cmd
	stderr *testenv.Buffer
	exited chan struct{}

	mu      sync.Mutex
	events  []Event
	changed chan struct{} // closed and replaced at each event
}

// wait bounds every wait for a server; only a failure bound.
const wait = 60 * time.Second

// Start starts a server of stack and waits until it listens. It is stopped
// (killed, if it has not exited) when the test ends.
func Start(t testing.TB, stack Stack, opts Options) *Server {
	t.Helper()
	if opts.Socket == "" {
		opts.Socket = filepath.Join(testenv.ShortDir(t, "interop"), "plugin.sock")
	}
	if opts.Type == "" {
		opts.Type = api.CSIPlugin
	}
	if opts.Name == "" {
		opts.Name = "interop.example.com"
	}
	if opts.Scenario != "" && stack != Raw {
		t.Fatalf("interop: a scenario (%q) is for the Raw server, not %s", opts.Scenario, stack)
	}
	args := []string{
		"--socket", opts.Socket, "--type", opts.Type, "--name", opts.Name, "--endpoint", opts.Endpoint,
		"--versions", strings.Join(opts.Versions, ","), "--trailer-bytes", strconv.Itoa(opts.TrailerBytes),
		"--notify-error", opts.NotifyError,
	}
	if opts.Gzip {
		args = append(args, "--gzip")
	}
	var exe string
	switch stack {
	case GRPCGo, GRPCGo127, Raw:
		exe = built(t, stack)
		if stack == Raw {
			args = append(args, "--scenario", opts.Scenario)
		}
	case Python:
		exe = python(t)
		args = append([]string{filepath.Join(dir(), "python", "server.py"), "--descriptor", descriptor(t)}, args...)
	case Node:
		exe = node(t)
		args = append([]string{filepath.Join(dir(), "node", "server.js")}, args...)
	default:
		t.Fatalf("interop: no server for stack %q", stack)
	}

	s := &Server{Stack: stack, Socket: opts.Socket, cmd: exec.Command(exe, args...), stderr: &testenv.Buffer{}, exited: make(chan struct{}), changed: make(chan struct{})}
	s.cmd.Stderr = s.stderr
	out, err := s.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := s.cmd.Start(); err != nil {
		t.Fatalf("interop: starting the %s server: %v", stack, err)
	}
	read := make(chan struct{})
	go func() {
		defer close(read)
		s.read(out)
	}()
	go func() {
		<-read // Wait closes the pipe: read it all first
		s.cmd.Wait()
		close(s.exited)
	}()
	t.Cleanup(func() {
		s.cmd.Process.Kill()
		<-s.exited
	})
	if !s.waitFor("listening", 1) {
		t.Fatalf("interop: the %s server did not listen on %s: %s", stack, opts.Socket, s.stderr.String())
	}
	return s
}

// read takes the server's report, line by line.
func (s *Server) read(out interface{ Read([]byte) (int, error) }) {
	sc := bufio.NewScanner(out)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var ev Event
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			ev = Event{Event: "garbage", Message: sc.Text()}
		}
		s.mu.Lock()
		s.events = append(s.events, ev)
		close(s.changed)
		s.changed = make(chan struct{})
		s.mu.Unlock()
	}
}

// Events returns everything the server has reported so far.
func (s *Server) Events() []Event {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.events)
}

// Told returns the NotifyRegistrationStatus calls the server has received,
// in order.
func (s *Server) Told() []Event { return s.Of("NotifyRegistrationStatus") }

// Of returns the events of one kind.
func (s *Server) Of(event string) []Event {
	var evs []Event
	for _, ev := range s.Events() {
		if ev.Event == event {
			evs = append(evs, ev)
		}
	}
	return evs
}

// WaitFor waits until the server has reported n events of a kind, and fails
// the test if it does not within a minute or exits first.
func (s *Server) WaitFor(t testing.TB, event string, n int) {
	t.Helper()
	if !s.waitFor(event, n) {
		t.Fatalf("interop: the %s server reported %d %q events, not %d: %v; stderr: %s", s.Stack, len(s.Of(event)), event, n, s.Events(), s.stderr.String())
	}
}

func (s *Server) waitFor(event string, n int) bool {
	deadline := time.After(wait)
	for {
		s.mu.Lock()
		count := 0
		for _, ev := range s.events {
			if ev.Event == event {
				count++
			}
		}
		changed := s.changed
		s.mu.Unlock()
		if count >= n {
			return true
		}
		select {
		case <-changed:
		case <-s.exited:
			return len(s.Of(event)) >= n
		case <-deadline:
			return false
		}
	}
}

// Stop asks the server to stop gracefully (SIGTERM: GracefulStop, stop(grace),
// tryShutdown) and waits for it to exit.
func (s *Server) Stop(t testing.TB) {
	t.Helper()
	s.signal(t, syscall.SIGTERM)
}

// Kill kills the server, as a crash would, and waits for it to exit.
func (s *Server) Kill(t testing.TB) {
	t.Helper()
	s.signal(t, syscall.SIGKILL)
}

func (s *Server) signal(t testing.TB, sig os.Signal) {
	t.Helper()
	if err := s.cmd.Process.Signal(sig); err != nil {
		t.Fatalf("interop: signalling the %s server: %v", s.Stack, err)
	}
	select {
	case <-s.exited:
	case <-time.After(wait):
		t.Fatalf("interop: the %s server did not exit within %v of %v: %s", s.Stack, wait, sig, s.stderr.String())
	}
}

// Stderr is what the server wrote to its standard error so far.
func (s *Server) Stderr() string { return s.stderr.String() }

// dir is this package's source directory, where the servers' sources are.
func dir() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Dir(file)
}

func python(t testing.TB) string {
	t.Helper()
	// Debian's python3-grpcio is installed for the system's python3, which a
	// python3 earlier on PATH (pyenv, a virtualenv) may not see.
	for _, exe := range []string{"/usr/bin/python3", "python3"} {
		if path, err := exec.LookPath(exe); err == nil {
			if exec.Command(path, "-c", "import grpc, google.protobuf").Run() == nil {
				return path
			}
		}
	}
	notInstalled(t, "no python3 with grpcio and protobuf (Debian's python3-grpcio python3-protobuf)")
	return ""
}

func node(t testing.TB) string {
	t.Helper()
	exe, err := exec.LookPath("node")
	if err != nil {
		notInstalled(t, "node is not installed (Debian's nodejs npm)")
	}
	if _, err := os.Stat(filepath.Join(dir(), "node", "node_modules", "@grpc", "grpc-js")); err != nil {
		notInstalled(t, "@grpc/grpc-js is not installed in "+filepath.Join(dir(), "node", "node_modules"))
	}
	return exe
}

// notInstalled skips the test of a server whose stack is missing, saying
// how to install it, or fails it where the stacks are required: a fresh
// machine with only Go runs the rest of the suite, and CI (which sets
// PLUGD_INTEROP=require after setup.sh) never passes without them.
func notInstalled(t testing.TB, what string) {
	t.Helper()
	msg := fmt.Sprintf("interop: %s: %s installs it", what, filepath.Join(dir(), "setup.sh"))
	if os.Getenv("PLUGD_INTEROP") == "require" {
		t.Fatal(msg + " (PLUGD_INTEROP=require: the stacks must be installed)")
	}
	t.Skip(msg)
}

// describe is how a test failure names a server.
func (s *Server) String() string { return fmt.Sprintf("%s server on %s", s.Stack, s.Socket) }
