package pluginmanager

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"
)

// sandbox runs handler calls (and observers' looks) so that a handler cannot
// hurt the manager: each call has a deadline, a panic is recovered, and a
// call that outlives its deadline is abandoned. The path it was for stays
// busy until the abandoned call does return: the manager calls the handler
// for that path no more meanwhile, and looks at the path again when it
// returns.
type sandbox struct {
	timeout  time.Duration
	returned func(path string) // an abandoned call for path returned
	log      *slog.Logger
	late     map[string]error // the deadline's cause for each handler method, made once

	calls sync.WaitGroup // every call still running, abandoned ones included

	mu   sync.Mutex
	busy map[string]int // abandoned calls still running, by path
}

// sandboxed are the handler and observer methods the manager calls through
// the sandbox.
var sandboxed = []string{"Validate", "Register", "Deregister", "Observe", "Forget"}

func newSandbox(timeout time.Duration, log *slog.Logger, returned func(path string)) *sandbox {
	s := &sandbox{timeout: timeout, returned: returned, log: log, busy: make(map[string]int), late: make(map[string]error)}
	for _, op := range sandboxed {
		s.late[op] = s.lateCause(op)
	}
	return s
}

// lateCause is the cause of the deadline of a call of handler method op.
func (s *sandbox) lateCause(op string) error {
	return fmt.Errorf("handler %s did not return within %s", op, s.timeout)
}

// handlerFault is a handler call that timed out or panicked: the handler's
// trouble, not a verdict on the plugin, so it is retried.
type handlerFault struct{ err error }

func (f *handlerFault) Error() string { return f.err.Error() }
func (f *handlerFault) Unwrap() error { return f.err }

func isFault(err error) bool {
	var f *handlerFault
	return errors.As(err, &f)
}

// call runs call (handler method op, for the socket at path) with the
// sandbox's deadline and returns its error, or a handlerFault if it panicked
// or did not return in time.
func (s *sandbox) call(ctx context.Context, path, op string, call func(context.Context) error) error {
	late := s.late[op] // read only: made by newSandbox
	if late == nil {
		late = s.lateCause(op)
	}
	ctx, cancel := context.WithTimeoutCause(ctx, s.timeout, late)
	defer cancel()
	done := make(chan error, 1)
	var abandoned bool // guarded by s.mu
	s.calls.Add(1)
	go func() {
		defer s.calls.Done()
		err := safeCall(ctx, op, call)
		s.mu.Lock()
		if !abandoned {
			s.mu.Unlock()
			done <- err // buffered
			return
		}
		if s.busy[path]--; s.busy[path] == 0 {
			delete(s.busy, path)
		}
		s.mu.Unlock()
		s.returned(path)
	}()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	select {
	case err := <-done: // returned just in time
		return err
	default:
	}
	abandoned = true
	s.busy[path]++
	return &handlerFault{context.Cause(ctx)}
}

// isBusy reports whether an abandoned call for path is still running.
func (s *sandbox) isBusy(path string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.busy[path] > 0
}

// wait waits for running calls, but not forever: a handler that ignores its
// context must not keep the process from stopping. If one is still running
// after d, it is left behind, with the goroutine waiting for it.
func (s *sandbox) wait(d time.Duration) {
	done := make(chan struct{})
	go func() {
		s.calls.Wait()
		close(done)
	}()
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
		s.log.Error("handler calls still running after shutdown; returning without them", "waited", d)
	}
}

func safeCall(ctx context.Context, op string, call func(context.Context) error) (err error) {
	defer func() {
		if v := recover(); v != nil {
			err = &handlerFault{handlerPanic(op, v)}
		}
	}()
	return call(ctx)
}
