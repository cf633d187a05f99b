package kubeconfig

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	"k8s.io/client-go/rest"
	"k8s.io/utils/clock"
)

// The API server's answers are input too: a server (or a proxy in its
// place, or an endpoint a kubeconfig names by mistake) can send a body that
// never ends, or send one byte a minute. client-go reads a whole answer
// into memory before it decodes it, and waits as long as the request's
// context lets it, which is for ever for a context without a deadline.

// MaxBody bounds one answer: its body is read up to MaxBody bytes, and an
// answer with more is an error (ErrTooLarge). The largest answers plugd's
// programs ask for are the pages of 500 Nodes that plugctl cluster reads:
// a page of Nodes as a kubelet of today reports them (50 images, labels,
// conditions, managedFields; test/kube/cmd/fleetbench's) is 11 MB as
// protobuf and 12.4 MB as JSON, so 64 MiB holds a page of Nodes five times
// as large. A watch is one answer too: one that has carried MaxBody bytes
// ends with the error, and its reader (an informer, kubectl plugd node
// --watch) opens another where it was.
const MaxBody = 64 << 20

// Timeout bounds a request other than a watch, from its start to the last
// byte of its answer, and a watch until its answer starts (its headers).
// The API server gives up on a request itself after a minute (its
// --request-timeout); an answer not done in twice that is from a server
// that is stuck, or hostile. A watch, once it answers, lasts as long as
// the server keeps it: the server ends it within minutes (its
// timeoutSeconds), and client-go's HTTP/2 pings find a dead connection.
const Timeout = 2 * time.Minute

// ErrTooLarge is in the error of an answer longer than MaxBody (errors.Is).
var ErrTooLarge = errors.New("kubeconfig.MaxBody")

// ErrTimeout is in the error of a request that took longer than Timeout
// (errors.Is).
var ErrTimeout = errors.New("kubeconfig.Timeout")

// Bound makes every client built from rc read at most MaxBody bytes of an
// answer and wait at most Timeout for it (a watch: for its start). It
// changes rc; a second call changes nothing more. RESTConfig bounds the
// configurations it returns; a program that makes one otherwise (the
// pod's in-cluster configuration) calls Bound itself.
func Bound(rc *rest.Config) {
	bound(rc, limits{maxBody: MaxBody, timeout: Timeout, clock: clock.RealClock{}})
}

// limits are Bound's bounds, and the clock that times them; tests set
// smaller ones.
type limits struct {
	maxBody int64
	timeout time.Duration
	clock   clock.WithDelayedExecution
}

func bound(rc *rest.Config, l limits) {
	rc.Wrap(func(rt http.RoundTripper) http.RoundTripper {
		if _, ok := rt.(*boundedTransport); ok {
			return rt
		}
		return &boundedTransport{next: rt, limits: l}
	})
}

// boundedTransport is the round tripper of Bound.
type boundedTransport struct {
	next http.RoundTripper
	limits
}

func (t *boundedTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	what := req.Method + " " + req.URL.Redacted()
	ctx, cancel := context.WithCancelCause(req.Context())
	timer := t.clock.AfterFunc(t.timeout, func() {
		cancel(fmt.Errorf("%s: the API server's answer did not come within %s (%w): is the server, or the network to it, stuck?", what, t.timeout, ErrTimeout))
	})
	resp, err := t.next.RoundTrip(req.WithContext(ctx))
	if err != nil {
		timer.Stop()
		if cause := context.Cause(ctx); errors.Is(cause, ErrTimeout) {
			err = cause
		}
		cancel(nil)
		return nil, err
	}
	if watch(req) {
		timer.Stop()
	}
	resp.Body = &boundedBody{body: resp.Body, left: t.maxBody, ctx: ctx, what: what, max: t.maxBody,
		done: func() { timer.Stop(); cancel(nil) }}
	return resp, nil
}

// CancelRequest is there for client-go's round trippers, which pass it on
// (and log a warning where they cannot). It does nothing: a request is
// cancelled through its context, which RoundTrip passes on, and which
// http.Client cancels at its Timeout.
func (t *boundedTransport) CancelRequest(*http.Request) {}

// watch says whether req asks for a watch (client-go asks with watch=true).
func watch(req *http.Request) bool {
	switch req.URL.Query().Get("watch") {
	case "true", "1":
		return true
	}
	return false
}

// boundedBody is an answer's body, read up to max bytes, and its request's
// deadline: done ends both when the body is closed.
type boundedBody struct {
	body      io.ReadCloser
	left, max int64
	ctx       context.Context
	what      string
	done      func()
}

func (b *boundedBody) Read(p []byte) (int, error) {
	if b.left < 0 {
		return 0, b.tooLarge()
	}
	if int64(len(p)) > b.left+1 {
		p = p[:b.left+1] // one byte more than allowed says there is more
	}
	n, err := b.body.Read(p)
	if int64(n) > b.left {
		n, b.left = int(b.left), -1
		return n, b.tooLarge()
	}
	b.left -= int64(n)
	if err != nil && err != io.EOF {
		if cause := context.Cause(b.ctx); errors.Is(cause, ErrTimeout) {
			err = cause
		}
	}
	return n, err
}

func (b *boundedBody) tooLarge() error {
	return fmt.Errorf("%s: the answer is larger than %d MiB, more than any answer plugd asks for (%w): is this the API server?", b.what, b.max>>20, ErrTooLarge)
}

func (b *boundedBody) Close() error {
	err := b.body.Close()
	b.done()
	return err
}
