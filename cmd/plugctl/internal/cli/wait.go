package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/plugd/plugd/api"
	"github.com/plugd/plugd/cmd/internal/printer"
)

// waitConditions are what wait can wait for. The first three are states.
var waitConditions = []string{"registered", "rejected", "failed", "stale", "unhealthy", "answering", "not-answering", "gone", "present"}

// waitStates maps the conditions that are states to the API's spelling.
var waitStates = map[string]string{
	"registered": "Registered", "rejected": "Rejected", "failed": "Failed", "stale": "Stale", "unhealthy": "Unhealthy",
	"answering": "Answering", "not-answering": "NotAnswering", // what a plugd in observe mode reports
}

// maxDescribed bounds how many plugins a message lists.
const maxDescribed = 10

func (a *app) waitCommand() *cobra.Command {
	var w waitSpec
	cmd := &cobra.Command{
		Use:   "wait (--type T | --name N | --id ID)... --for CONDITION",
		Short: "Wait until a plugin is in a state, or until it appears or is gone",
		Long: `Block until some plugin that matches all the selectors given (--type, --name,
--id; at least one is required) is in the state --for names:

  registered  a matching plugin is Registered
  rejected    a matching plugin is Rejected (refused until its socket changes)
  failed      a matching plugin is Failed (plugd retries it)
  present     at least one plugin matches, in any state
  gone        no plugin matches

wait reacts to plugd's events as they happen; it does not poll, unless plugd
has no event stream free for it (they are limited per client), and then it
asks for the list every 250ms. (Only "gone" first lets a plugd that has just
started finish scanning its directory, as a plugin it has not found yet is
not gone.) Progress goes to standard error, the
plugins that met the condition to standard output.

Exit codes:
  0  the condition is met
  1  error: plugd unreachable (reported at once, without waiting), plugd
     stopped while waiting, an answer plugctl cannot use, or interrupted
  2  usage error: no selector, bad --for, bad flag
  3  timed out: the message says what was still not true, with the
     matching plugins' states and last errors`,
		Example: `  plugctl wait --type CSIPlugin --name csi.example.com --for registered --timeout 1m
  plugctl wait --id vendor/gpu.sock --for gone
  # readiness probe of a plugin's pod
  plugctl wait --name gpu.example.com --for registered --timeout 5s`,
		Args: noArgs,
		RunE: runE(func(cmd *cobra.Command, _ []string) error {
			if err := w.check(); err != nil {
				return err
			}
			return a.wait(cmd.Context(), w)
		}),
	}
	f := cmd.Flags()
	f.StringVar(&w.sel.Type, "type", "", "wait for plugins of this type")
	f.StringVar(&w.sel.Name, "name", "", "wait for plugins of this name")
	f.StringVar(&w.sel.ID, "id", "", "wait for the plugin with this ID (its socket's path inside the registry directory)")
	f.StringVar(&w.cond, "for", "", "the condition: "+strings.Join(waitConditions, ", "))
	// This --timeout bounds the whole wait, and so every request in it; it
	// takes the place of the global --timeout.
	f.DurationVar(&w.timeout, "timeout", 30*time.Second, "give up (exit code 3) after this long; 0 waits for ever")
	completeFlag(cmd, "type", a.completePlugins(func(p api.Plugin) string { return p.Type }))
	completeFlag(cmd, "name", a.completePlugins(func(p api.Plugin) string { return p.Name }))
	completeFlag(cmd, "id", a.completePlugins(func(p api.Plugin) string { return p.ID }))
	completeFlag(cmd, "for", fixedCompletions(waitConditions...))
	return cmd
}

// selector picks plugins: a plugin matches if it matches every field set.
type selector struct {
	Type, Name, ID string
}

func (s selector) empty() bool { return s == selector{} }

func (s selector) matches(p api.Plugin) bool {
	return (s.Type == "" || p.Type == s.Type) && (s.Name == "" || p.Name == s.Name) && (s.ID == "" || p.ID == s.ID)
}

// String is s as people read it: "type=CSIPlugin name=csi.example.com".
func (s selector) String() string {
	var parts []string
	for _, kv := range [][2]string{{"type", s.Type}, {"name", s.Name}, {"id", s.ID}} {
		if kv[1] != "" {
			parts = append(parts, kv[0]+"="+kv[1])
		}
	}
	return strings.Join(parts, " ")
}

// waitSpec is what wait was asked to wait for.
type waitSpec struct {
	sel     selector
	cond    string
	timeout time.Duration
}

func (w *waitSpec) check() error {
	if w.sel.empty() {
		return usageErrorf("wait needs at least one of --type, --name and --id to say which plugins to wait for")
	}
	if w.cond == "" {
		return usageErrorf("wait needs --for: one of %s", strings.Join(waitConditions, ", "))
	}
	var err error
	if w.cond, err = oneOf("--for", w.cond, waitConditions...); err != nil {
		return err
	}
	if w.timeout < 0 {
		return usageErrorf("--timeout %s must be 0 (wait for ever) or more", w.timeout)
	}
	return nil
}

// met reports whether the matching plugins satisfy the condition, and which
// of them do.
func (w waitSpec) met(matching []api.Plugin) ([]api.Plugin, bool) {
	switch w.cond {
	case "gone":
		return nil, len(matching) == 0
	case "present":
		return matching, len(matching) > 0
	}
	var hits []api.Plugin
	for _, p := range matching {
		if p.State == waitStates[w.cond] {
			hits = append(hits, p)
		}
	}
	return hits, len(hits) > 0
}

// goal is the condition in words: "a plugin with type=X to be Registered".
func (w waitSpec) goal() string {
	switch w.cond {
	case "gone":
		return fmt.Sprintf("no plugin with %s to be left", w.sel)
	case "present":
		return fmt.Sprintf("a plugin with %s to be present", w.sel)
	}
	return fmt.Sprintf("a plugin with %s to be %s", w.sel, waitStates[w.cond])
}

// wait blocks until w is met. It subscribes to events first and looks at the
// plugins second, and looks again after every event: a change after a look is
// then sure to arrive as an event, so none falls in between. Events are only
// hints; the list is the truth, which also covers events plugd dropped.
func (a *app) wait(ctx context.Context, w waitSpec) error {
	if w.timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, w.timeout)
		defer cancel()
	}
	c := a.client()
	// Without an event stream (plugd has none free for this client), wait
	// asks for the list every pollEvery instead: readiness probes must not
	// depend on a stream.
	var next func() error
	stream, err := c.Events(ctx, 0)
	switch {
	case errors.Is(err, api.ErrBusy):
		fmt.Fprintf(a.stderr, "plugd has no event stream free (%v); asking every %s instead\n", err, pollEvery)
		tick := time.NewTicker(pollEvery)
		defer tick.Stop()
		next = func() error {
			select {
			case <-tick.C:
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		}
	case err != nil:
		return w.failed(ctx, c, err, nil, false)
	default:
		defer stream.Close()
		next = func() error {
			_, err := stream.Next()
			return err
		}
	}
	if w.cond == "gone" {
		if err := w.untilScanned(ctx, c); err != nil {
			return err
		}
	}
	var (
		last []api.Plugin // what the latest look found
		seen bool         // whether there was a look
	)
	for {
		matching, err := lookup(ctx, c, w.sel)
		switch {
		case stream == nil && errors.Is(err, api.ErrBusy) && ctx.Err() == nil:
			// Polling, and plugd is too busy to answer this once: ask again.
		case err != nil:
			return w.failed(ctx, c, err, last, seen)
		default:
			if hits, ok := w.met(matching); ok {
				return a.reportMet(w, hits)
			}
			if !seen {
				fmt.Fprintf(a.stderr, "waiting %s for %s; now %s\n", forHowLong(w.timeout), w.goal(), describe(matching))
			}
			last, seen = matching, true
		}
		if err := next(); err != nil {
			return w.failed(ctx, c, err, last, seen)
		}
	}
}

// lookup lists the plugins the selector picks. plugd filters by type and
// name; the ID is picked here.
func lookup(ctx context.Context, c *api.Client, sel selector) ([]api.Plugin, error) {
	plugins, err := c.Plugins(ctx, api.Filter{Type: sel.Type, Name: sel.Name})
	if err != nil {
		return nil, err
	}
	var out []api.Plugin
	for _, p := range plugins {
		if sel.matches(p) {
			out = append(out, p)
		}
	}
	return out, nil
}

func (a *app) reportMet(w waitSpec, hits []api.Plugin) error {
	if w.cond == "gone" {
		_, err := fmt.Fprintf(a.stdout, "no plugin with %s is left\n", w.sel)
		return err
	}
	for _, p := range hits {
		if _, err := fmt.Fprintf(a.stdout, "%s is %s\n", printer.Cell(p.ID), printer.Cell(p.State)); err != nil {
			return err
		}
	}
	return nil
}

// failed explains why the wait ended unmet. last is what the latest look
// found, if seen says there was one.
func (w waitSpec) failed(ctx context.Context, c *api.Client, err error, last []api.Plugin, seen bool) error {
	switch {
	case errors.Is(ctx.Err(), context.DeadlineExceeded) && !seen:
		return fmt.Errorf("plugd at %s did not answer within %s", where(c), w.timeout)
	case errors.Is(ctx.Err(), context.DeadlineExceeded):
		return &exitError{code: ExitTimeout, err: fmt.Errorf("timed out after %s waiting for %s; last seen: %s", w.timeout, w.goal(), describe(last))}
	case ctx.Err() != nil:
		return fmt.Errorf("interrupted while waiting for %s", w.goal())
	case errors.Is(err, io.EOF):
		return fmt.Errorf("plugd at %s closed the event stream while plugctl waited for %s; did plugd stop?", where(c), w.goal())
	}
	return err
}

// describe says what state the matching plugins are in, with their last
// errors, for people to see why a wait is not over.
func describe(matching []api.Plugin) string {
	if len(matching) == 0 {
		return "no plugin matches"
	}
	var parts []string
	for i, p := range matching {
		if i == maxDescribed {
			parts = append(parts, fmt.Sprintf("and %d more ('plugctl list' shows all)", len(matching)-i))
			break
		}
		s := fmt.Sprintf("%s is %s", printer.Cell(p.ID), printer.Cell(p.State))
		if p.LastError != "" {
			s += ", " + errorText(p)
		}
		parts = append(parts, s)
	}
	return strings.Join(parts, "; ")
}

func forHowLong(d time.Duration) string {
	if d == 0 {
		return "with no timeout"
	}
	return "up to " + d.String()
}

// pollEvery is how often wait asks for the list when plugd has no event
// stream for it.
const pollEvery = 250 * time.Millisecond

// scanPoll is how often untilScanned asks whether plugd has scanned.
const scanPoll = 100 * time.Millisecond

// untilScanned returns once plugd has scanned its registry directory: until
// then, a plugin missing from the list may only not be found yet, and "gone"
// would be a lie. plugd publishes no event for the end of its scan, so this
// asks again on a ticker; it only ever waits while plugd starts.
func (w waitSpec) untilScanned(ctx context.Context, c *api.Client) error {
	tick := time.NewTicker(scanPoll)
	defer tick.Stop()
	for {
		err := c.Ready(ctx)
		if err == nil || !notReady(err) {
			return err
		}
		select {
		case <-tick.C:
		case <-ctx.Done():
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				return &exitError{code: ExitTimeout, err: fmt.Errorf("timed out after %s waiting for %s; plugd at %s has not finished scanning its registry directory, so it cannot tell", w.timeout, w.goal(), where(c))}
			}
			return fmt.Errorf("interrupted while waiting for %s", w.goal())
		}
	}
}

// notReady reports whether err is plugd's answer that it has not scanned its
// directory yet (GET /readyz answers 503 until then), rather than a failure.
func notReady(err error) bool {
	return errors.Is(err, api.ErrNotReady)
}
