package kubeconfig

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"mime"
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
// as large. A watch carries events for as long as it lasts (the
// caretaker's, of every Node, its initial list too): each event of it is
// bounded, as the API server frames them (a protobuf frame, a line of
// JSON), and one larger ends the watch with the error.
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
	b := &boundedBody{body: resp.Body, left: t.maxBody, ctx: ctx, what: what, max: t.maxBody,
		done: func() { timer.Stop(); cancel(nil) }}
	if watch(req) {
		timer.Stop()
		b.events = eventsOf(resp.Header.Get("Content-Type"), t.maxBody)
	}
	resp.Body = b
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

// boundedBody is an answer's body, read up to max bytes (a watch's: each
// event, if events can tell them), and its request's deadline: done ends
// both when the body is closed.
type boundedBody struct {
	body      io.ReadCloser
	left, max int64
	events    events
	ctx       context.Context
	what      string
	done      func()
}

func (b *boundedBody) Read(p []byte) (int, error) {
	if b.left < 0 {
		return 0, b.tooLarge()
	}
	if b.events != nil {
		n, err := b.body.Read(p)
		if !b.events.take(p[:n]) {
			b.left = -1
			return 0, b.tooLarge() // none of the event over the bound
		}
		return n, b.cause(err)
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
	return n, b.cause(err)
}

// cause is err, or the bound's error if the request ended at the bound.
func (b *boundedBody) cause(err error) error {
	if err != nil && err != io.EOF {
		if cause := context.Cause(b.ctx); errors.Is(cause, ErrTimeout) {
			return cause
		}
	}
	return err
}

// events tells the events of a watch in the bytes of its body, as they
// are read, and says whether each so far is within the bound.
type events interface {
	take(b []byte) bool
}

// eventsOf is the events of a watch answered with contentType, or nil
// (the body is bounded whole) for one whose framing it does not know.
func eventsOf(contentType string, max int64) events {
	mt, _, _ := mime.ParseMediaType(contentType)
	switch mt {
	case "application/vnd.kubernetes.protobuf":
		return &frames{max: max}
	case "application/json":
		return &lines{left: max, max: max}
	}
	return nil
}

// frames are the events of a protobuf watch: each a 4-byte big-endian
// length, then that many bytes.
type frames struct {
	max, left int64
	head      [4]byte
	headN     int
}

func (f *frames) take(b []byte) bool {
	for len(b) > 0 {
		if f.left > 0 {
			k := min(f.left, int64(len(b)))
			f.left -= k
			b = b[k:]
			continue
		}
		k := copy(f.head[f.headN:], b)
		f.headN += k
		b = b[k:]
		if f.headN == len(f.head) {
			f.headN = 0
			if f.left = int64(binary.BigEndian.Uint32(f.head[:])); f.left > f.max {
				return false
			}
		}
	}
	return true
}

// lines are the events of a JSON watch: the API server writes each on a
// line of its own.
type lines struct {
	max, left int64
}

func (l *lines) take(b []byte) bool {
	for {
		i := bytes.IndexByte(b, '\n')
		if i < 0 {
			l.left -= int64(len(b))
			return l.left >= 0
		}
		if int64(i) > l.left {
			return false
		}
		l.left = l.max
		b = b[i+1:]
	}
}

func (b *boundedBody) tooLarge() error {
	return fmt.Errorf("%s: the answer is larger than %d MiB, more than any answer plugd asks for (%w): is this the API server?", b.what, b.max>>20, ErrTooLarge)
}

func (b *boundedBody) Close() error {
	err := b.body.Close()
	b.done()
	return err
}
