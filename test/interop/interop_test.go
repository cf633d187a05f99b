package interop_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"

	"github.com/plugd/plugd/internal/testenv"
	"github.com/plugd/plugd/internal/unaryconn"
	"github.com/plugd/plugd/test/interop"
)

func TestMain(m *testing.M) {
	code := interop.Run(m)
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			code = 1
		}
	}
	os.Exit(code)
}

// wait bounds every wait that is not about a deadline: a failure bound.
// It is twice the other suites' testenv.Timeout because what the tests
// wait on here is a process of another runtime (Python, Node, an old
// grpc-go) starting and answering through a pipe, on a machine that -race
// keeps busy.
const wait = 2 * testenv.Timeout

const (
	getInfo = "/pluginregistration.Registration/GetInfo"
	notify  = "/pluginregistration.Registration/NotifyRegistrationStatus"
)

var plugin = interop.Options{
	Type:     "CSIPlugin",
	Name:     "interop.csi.example.com",
	Endpoint: "/var/lib/kubelet/plugins/interop.csi.example.com/csi.sock",
	Versions: []string{"1.0.0", "1.2.0"},
}

func dial(t *testing.T, srv *interop.Server) *unaryconn.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	c, err := unaryconn.Dial(ctx, srv.Socket)
	if err != nil {
		t.Fatalf("dialing the %v: %v", srv, err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func info(c *unaryconn.Conn) (*registerapi.PluginInfo, error) {
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	resp := new(registerapi.PluginInfo)
	return resp, c.Invoke(ctx, getInfo, &registerapi.InfoRequest{}, resp, 1<<16)
}

func tell(c *unaryconn.Conn, registered bool, reason string) error {
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	req := &registerapi.RegistrationStatus{PluginRegistered: registered, Error: reason}
	return c.Invoke(ctx, notify, req, &registerapi.RegistrationStatusResponse{}, 1<<16)
}

func wantInfo(t *testing.T, got *registerapi.PluginInfo, opts interop.Options) {
	t.Helper()
	want := &registerapi.PluginInfo{Type: opts.Type, Name: opts.Name, Endpoint: opts.Endpoint, SupportedVersions: opts.Versions}
	if !proto.Equal(got, want) {
		t.Errorf("GetInfo answered %v, want %v", got, want)
	}
}

// watch watches c, with a Poller of its own closed when the test ends, and
// returns where its hang-up is reported.
func watch(t *testing.T, c *unaryconn.Conn) <-chan error {
	t.Helper()
	p := unaryconn.NewPoller(unaryconn.PollerOptions{})
	t.Cleanup(p.Close)
	hung := make(chan error, 1)
	if err := c.Watch(p, func(err error) { hung <- err }); err != nil {
		t.Fatal(err)
	}
	return hung
}

func recv[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(wait):
		t.Fatalf("timed out waiting for %s", what)
		var zero T
		return zero
	}
}

func noHangup(t *testing.T, hung <-chan error) {
	t.Helper()
	select {
	case err := <-hung:
		t.Fatalf("hang-up: %v", err)
	default:
	}
}

// TestRegistration: against every stack, what registering and watching a
// plugin takes: GetInfo, NotifyRegistrationStatus (each told exactly once),
// calls on the connection while it is watched, and the server's graceful
// stop seen as a hang-up with no call made.
func TestRegistration(t *testing.T) {
	for _, stack := range append(interop.Stacks, interop.Raw) {
		t.Run(string(stack), func(t *testing.T) {
			srv := interop.Start(t, stack, plugin)
			c := dial(t, srv)
			got, err := info(c)
			if err != nil {
				t.Fatal(err)
			}
			wantInfo(t, got, plugin)

			const reason = "version 2.0 not supported: 100% ✓\nsecond line\t%41"
			if err := tell(c, true, ""); err != nil {
				t.Fatal(err)
			}
			if err := tell(c, false, reason); err != nil {
				t.Fatal(err)
			}
			told := told(t, srv, 2)
			if len(told) != 2 || !told[0].Registered || told[0].Error != "" || told[1].Registered || told[1].Error != reason {
				t.Errorf("the server was told %+v, want true once and then false with %q once", told, reason)
			}

			hung := watch(t, c)
			for i := range 20 {
				if _, err := info(c); err != nil {
					t.Fatalf("GetInfo %d on the watched connection: %v", i, err)
				}
			}
			noHangup(t, hung)
			srv.WaitFor(t, "GetInfo", 21)
			if n := len(srv.Of("GetInfo")); n != 21 {
				t.Errorf("the server answered %d GetInfo, want 21", n)
			}

			srv.Stop(t) // which, if graceful, waits for the watch to let go
			if err := recv(t, hung, "the hang-up"); !errors.Is(err, unaryconn.ErrHangup) {
				t.Errorf("hang-up %v, not ErrHangup", err)
			}
			if c.Usable() {
				t.Error("usable after the server stopped")
			}
		})
	}
}

// TestKilled: a plugin's process that dies is a hang-up at once.
func TestKilled(t *testing.T) {
	for _, stack := range interop.Stacks {
		t.Run(string(stack), func(t *testing.T) {
			srv := interop.Start(t, stack, plugin)
			c := dial(t, srv)
			if _, err := info(c); err != nil {
				t.Fatal(err)
			}
			hung := watch(t, c)
			srv.Kill(t)
			if err := recv(t, hung, "the hang-up"); !errors.Is(err, unaryconn.ErrHangup) {
				t.Errorf("hang-up %v, not ErrHangup", err)
			}
		})
	}
}

// TestGzipAndBigTrailers: every stack compressing its answers (those that
// compress only what is offered: unaryconn offers gzip) and adding 20 KiB of
// trailers, more than one HTTP/2 frame.
func TestGzipAndBigTrailers(t *testing.T) {
	for _, stack := range interop.Stacks {
		t.Run(string(stack), func(t *testing.T) {
			opts := plugin
			opts.Gzip, opts.TrailerBytes = true, 20<<10
			srv := interop.Start(t, stack, opts)
			c := dial(t, srv)
			got, err := info(c)
			if err != nil {
				t.Fatal(err)
			}
			wantInfo(t, got, opts)
			if err := tell(c, true, ""); err != nil {
				t.Fatal(err)
			}
			if !c.Usable() {
				t.Error("unusable")
			}
		})
	}
}

// TestNotifyError: a plugin that answers the notification with an error (as
// the DRA helper does on plugin_registered=false) was told: the error is its
// status, not a failure to tell it.
func TestNotifyError(t *testing.T) {
	for _, stack := range interop.Stacks {
		t.Run(string(stack), func(t *testing.T) {
			opts := plugin
			opts.NotifyError = "registration failed: told so"
			srv := interop.Start(t, stack, opts)
			c := dial(t, srv)
			err := tell(c, false, "no handler")
			if status.Code(err) != codes.FailedPrecondition || status.Convert(err).Message() != opts.NotifyError {
				t.Fatalf("got %v, want FAILED_PRECONDITION %q", err, opts.NotifyError)
			}
			for _, kind := range []error{unaryconn.ErrMaybeDelivered, unaryconn.ErrProtocol, unaryconn.ErrHangup} {
				if errors.Is(err, kind) {
					t.Errorf("%v matches %v: it is the plugin's own answer", err, kind)
				}
			}
			if n := len(told(t, srv, 1)); n != 1 {
				t.Errorf("told %d times", n)
			}
		})
	}
}

// TestRawScenarios: the servers' behaviours that grpc-go's client copes with
// and the gRPC stacks above do not show (issue 12).
func TestRawScenarios(t *testing.T) {
	for _, tc := range []struct {
		scenario string
		check    func(t *testing.T, srv *interop.Server, c *unaryconn.Conn)
	}{{
		scenario: interop.TableSizeZero,
		check: func(t *testing.T, srv *interop.Server, c *unaryconn.Conn) {
			registers(t, srv, c)
			if n := len(srv.Of("compression-error")); n != 0 {
				t.Errorf("the server saw %d header blocks without the table size update", n)
			}
		},
	}, {
		// Issue 25, item 6: the table size update even in the block sent
		// with the preface, before the server's SETTINGS were read.
		scenario: interop.TableSizeStrict,
		check: func(t *testing.T, srv *interop.Server, c *unaryconn.Conn) {
			registers(t, srv, c)
			if n := len(srv.Of("compression-error")); n != 0 {
				t.Errorf("the server saw %d header blocks without the table size update", n)
			}
		},
	}, {
		scenario: interop.BigTrailers,
		check:    registers,
	}, {
		scenario: interop.ForcedGzip,
		check: func(t *testing.T, srv *interop.Server, c *unaryconn.Conn) {
			registers(t, srv, c)
			srv.WaitFor(t, "GetInfo", 1)
			if ev := srv.Of("GetInfo"); len(ev) == 0 || ev[0].Encoding != "gzip" {
				t.Errorf("the request offered grpc-accept-encoding %+v, want gzip", ev)
			}
		},
	}, {
		scenario: interop.MaxStreamsZero,
		check: func(t *testing.T, srv *interop.Server, c *unaryconn.Conn) {
			registers(t, srv, c)
			if n := len(srv.Of("refused")); n != 0 {
				t.Errorf("%d streams opened before the server allowed any", n)
			}
		},
	}, {
		scenario: interop.Interim103,
		check:    registers,
	}, {
		scenario: interop.GoAwayError,
		check: func(t *testing.T, srv *interop.Server, c *unaryconn.Conn) {
			_, err := info(c)
			if status.Code(err) != codes.Unavailable || !errors.Is(err, unaryconn.ErrHangup) || errors.Is(err, unaryconn.ErrMaybeDelivered) {
				t.Fatalf("GetInfo: %v, want a retryable Unavailable hang-up (not DeadlineExceeded: at once)", err)
			}
			for _, want := range []string{"ENHANCE_YOUR_CALM", "too_many_pings"} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("%v does not say %s", err, want)
				}
			}
			registers(t, srv, dial(t, srv)) // the retry, on a new connection
		},
	}, {
		// Issue 25, item 5: a GOAWAY with an error covering the call, the
		// socket kept open: the call ends at once (not at its deadline),
		// saying the code and the debug data, maybe delivered.
		scenario: interop.GoAwayCalm,
		check: func(t *testing.T, srv *interop.Server, c *unaryconn.Conn) {
			_, err := info(c)
			if status.Code(err) != codes.Unavailable || !errors.Is(err, unaryconn.ErrHangup) || !errors.Is(err, unaryconn.ErrMaybeDelivered) {
				t.Fatalf("GetInfo: %v, want an Unavailable hang-up, maybe delivered (not DeadlineExceeded: at once)", err)
			}
			for _, want := range []string{"ENHANCE_YOUR_CALM", "calm down"} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("%v does not say %s", err, want)
				}
			}
		},
	}, {
		scenario: interop.DropAfterNotify,
		check: func(t *testing.T, srv *interop.Server, c *unaryconn.Conn) {
			if _, err := info(c); err != nil {
				t.Fatal(err)
			}
			err := tell(c, true, "")
			if !errors.Is(err, unaryconn.ErrMaybeDelivered) || !errors.Is(err, unaryconn.ErrHangup) {
				t.Fatalf("Notify: %v, want ErrMaybeDelivered: the plugin was told", err)
			}
			if told := told(t, srv, 1); len(told) != 1 || !told[0].Registered {
				t.Errorf("told %+v, want true once", told)
			}
		},
	}, {
		scenario: interop.Ping,
		check: func(t *testing.T, srv *interop.Server, c *unaryconn.Conn) {
			if _, err := info(c); err != nil {
				t.Fatal(err)
			}
			hung := watch(t, c)
			srv.WaitFor(t, "ping-ack", 5)
			if _, err := info(c); err != nil { // and between PINGs, calls
				t.Fatal(err)
			}
			srv.WaitFor(t, "ping-ack", 10)
			noHangup(t, hung)
		},
	}, {
		scenario: interop.ResetFirstConn,
		check: func(t *testing.T, srv *interop.Server, c *unaryconn.Conn) {
			_, err := info(c)
			if !errors.Is(err, unaryconn.ErrProtocol) {
				t.Fatalf("GetInfo: %v, want ErrProtocol: the server says we broke the protocol", err)
			}
			registers(t, srv, dial(t, srv)) // asked again on a new connection
		},
	}} {
		t.Run(tc.scenario, func(t *testing.T) {
			opts := plugin
			opts.Scenario = tc.scenario
			srv := interop.Start(t, interop.Raw, opts)
			tc.check(t, srv, dial(t, srv))
		})
	}
}

// registers makes the calls of a registration on c and checks them.
func registers(t *testing.T, srv *interop.Server, c *unaryconn.Conn) {
	t.Helper()
	got, err := info(c)
	if err != nil {
		t.Fatal(err)
	}
	wantInfo(t, got, plugin)
	if err := tell(c, true, ""); err != nil {
		t.Fatal(err)
	}
	if err := tell(c, false, "again"); err != nil {
		t.Fatal(err)
	}
	if told := told(t, srv, 2); len(told) != 2 {
		t.Errorf("told %+v, want 2 notifications", told)
	}
}

// told returns what the server was told, once it has reported at least n
// notifications. Each server reports a call before it answers it, so once
// the calls have returned, what it reports is all it was told.
func told(t *testing.T, srv *interop.Server, n int) []interop.Event {
	t.Helper()
	srv.WaitFor(t, "NotifyRegistrationStatus", n)
	return srv.Told()
}
