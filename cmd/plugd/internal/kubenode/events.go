package kubenode

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/tools/events"

	"github.com/plugd/plugd/internal/textsafe"
)

// event is one Kubernetes event about the Node: of plugin, for cause (the
// condition's reason, or the kind of disagreement).
type event struct {
	typ, reason string
	plugin      key
	cause       string
	note        string
	action      string // what plugd did; empty: "Check" the plugin
}

// The API server's bounds of an event's action and note.
const (
	maxEventAction = 128
	maxEventNote   = 1024
)

// record sends e, about node.
//
// client-go folds events into a series by (type, reason, action,
// reporting controller and instance, regarding object), not by note: a
// second event with the same key within 6 minutes of the last is written
// as a series of count 2 that keeps the first one's note, and later ones
// only count up in memory until the series ends (6 minutes after the last)
// or every 30 minutes. So the action names the plugin and the cause: two
// plugins, or two causes of one plugin, never fold into one event, and a
// series only ever counts repeats of the occurrence its note describes.
func (l *loop) record(node *corev1.Node, e event) {
	if node == nil {
		return
	}
	action := "Check " + e.plugin.String()
	if e.cause != "" {
		action += ": " + e.cause
	}
	if e.action != "" {
		action = e.action
	}
	// The API's bounds (128 and 1 KiB), cut at a character boundary: a
	// cut inside one would be sent as U+FFFD.
	action = textsafe.Shorten(action, maxEventAction)
	note := textsafe.Shorten(e.note, maxEventNote)
	// A reference without the Node's resourceVersion, which changes with
	// every status update: with it no two events would be alike, and none
	// would fold into a series.
	ref := &corev1.ObjectReference{APIVersion: "v1", Kind: "Node", Name: node.Name, UID: node.UID}
	l.rec.Eventf(ref, nil, e.typ, e.reason, action, "%s", note)
}

// eventSink is where client-go's event machinery writes plugd's events:
// each write has a deadline, and its outcome is kept as that of plugd's
// other writes, so that a refused event names the permission.
type eventSink struct {
	n    *Node
	sink events.EventSink
}

func (s eventSink) Create(ctx context.Context, e *eventsv1.Event) (*eventsv1.Event, error) {
	return s.write(ctx, false, func(ctx context.Context) (*eventsv1.Event, error) { return s.sink.Create(ctx, e) })
}

func (s eventSink) Update(ctx context.Context, e *eventsv1.Event) (*eventsv1.Event, error) {
	return s.write(ctx, false, func(ctx context.Context) (*eventsv1.Event, error) { return s.sink.Update(ctx, e) })
}

// Patch updates a series; when its event is gone the machinery creates it
// anew, so that a patch that finds none is no trouble.
func (s eventSink) Patch(ctx context.Context, old *eventsv1.Event, data []byte) (*eventsv1.Event, error) {
	return s.write(ctx, true, func(ctx context.Context) (*eventsv1.Event, error) { return s.sink.Patch(ctx, old, data) })
}

// write makes one write; it returns the error as it came, which the
// machinery tells retries by.
func (s eventSink) write(ctx context.Context, patch bool, do func(context.Context) (*eventsv1.Event, error)) (*eventsv1.Event, error) {
	wctx, cancel := context.WithTimeoutCause(ctx, writeTimeout, fmt.Errorf("the API server did not answer within %s", writeTimeout))
	defer cancel()
	e, err := do(wctx)
	switch {
	case ctx.Err() != nil: // plugd is stopping
	case patch && apierrors.IsNotFound(err):
		s.n.m.writes.WithLabelValues(s.n.eventWrite.metric).Inc()
	case err != nil && wctx.Err() != nil:
		s.n.noteWrite(s.n.eventWrite, fmt.Errorf("%w (%w)", err, context.Cause(wctx)), s.n.clock.Now())
	default:
		s.n.noteWrite(s.n.eventWrite, err, s.n.clock.Now())
	}
	return e, err
}
