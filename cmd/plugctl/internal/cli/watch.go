package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/plugd/plugd/api"
	"github.com/plugd/plugd/cmd/internal/printer"
	"github.com/plugd/plugd/internal/textsafe"
)

var watchOutputs = []string{"text", "json"}

func (a *app) watchCommand() *cobra.Command {
	var (
		replay int
		output string
	)
	cmd := &cobra.Command{
		Use:   "watch",
		Short: "Print plugd's events as they happen",
		Long: `Print each event plugd publishes, one line each, until Ctrl-C (exit code 0) or
until plugd stops (exit code 1).

A text line has the time, the event (Discovered, Registered, Failed, Rejected,
Deregistered, Removed), the plugin's type, name and ID ("-" while unknown), the
state the event left it in, and the error the event reports, if any. "Lost" means plugctl fell
behind and plugd dropped events for it; 'plugctl list' shows the current state.
-o json prints each event as the API's Event object on one line.

--replay N starts with up to N recent events, so that what just happened is
not missed.

When plugd has no event stream free for plugctl (they are limited per
client), watch says so on standard error and asks for the list every
second instead, printing what changed between two looks as the events it
makes of them (seq 0 in -o json): a change undone within a second is not
seen, and --replay has nothing to replay.`,
		Example: `  plugctl watch --replay 20
  plugctl watch -o json | jq -c 'select(.type == "Failed")'`,
		Args: noArgs,
		RunE: runE(func(cmd *cobra.Command, _ []string) error {
			var err error
			if output, err = oneOf("--output", output, watchOutputs...); err != nil {
				return err
			}
			if replay < 0 {
				return usageErrorf("--replay %d must be 0 or more", replay)
			}
			return a.watch(cmd.Context(), replay, output)
		}),
	}
	cmd.Flags().IntVar(&replay, "replay", 0, "start with up to this many recent events")
	cmd.Flags().StringVarP(&output, "output", "o", "text", "output format: "+strings.Join(watchOutputs, ", "))
	completeFlag(cmd, "output", fixedCompletions(watchOutputs...))
	return cmd
}

func (a *app) watch(ctx context.Context, replay int, output string) error {
	c := a.client()
	write := printEvent
	if output == "json" {
		write = func(w io.Writer, ev api.Event) error { return printer.JSONLine(w, ev) }
	}
	stream, err := a.openEvents(ctx, c, replay)
	switch {
	case err == nil:
		defer stream.Close()
	case ctx.Err() != nil:
		return nil // Ctrl-C before plugd answered
	case errors.Is(err, api.ErrBusy):
		// As wait does: a watch must not depend on a stream.
		fmt.Fprintf(a.stderr, "plugd has no event stream free (%v); asking for the list every %s instead, and printing what changed between two looks\n", err, watchPollEvery)
		return a.pollEvents(ctx, c, write)
	default:
		return err
	}
	for {
		ev, err := stream.Next()
		switch {
		case ctx.Err() != nil:
			return nil // Ctrl-C: the user is done watching
		case errors.Is(err, io.EOF):
			return fmt.Errorf("plugd at %s closed the event stream; did it stop?", where(c))
		case err != nil:
			return fmt.Errorf("reading events from plugd at %s: %w", where(c), err)
		}
		if err := write(a.stdout, ev); err != nil {
			return err
		}
	}
}

// watchPollEvery is how often watch asks for the list when plugd has no
// event stream for it: the whole list, so not as often as wait asks for
// its few plugins.
const watchPollEvery = time.Second

// pollEvents is watch without an event stream: it asks for the list every
// watchPollEvery and writes the events that turn one list into the next
// (listEvents), until ctx is done (nil) or plugd cannot be asked.
func (a *app) pollEvents(ctx context.Context, c *api.Client, write func(io.Writer, api.Event) error) error {
	tick := time.NewTicker(watchPollEvery)
	defer tick.Stop()
	var last map[string]api.Plugin // nil until the first look
	for {
		plugins, err := a.listOnce(ctx, c)
		switch {
		case ctx.Err() != nil:
			return nil
		case errors.Is(err, api.ErrBusy):
			// Too busy to answer this once: ask again at the next tick.
		case err != nil:
			return fmt.Errorf("asking plugd at %s for the list: %w", where(c), err)
		default:
			now := make(map[string]api.Plugin, len(plugins))
			for _, p := range plugins {
				now[p.ID] = p
			}
			if last == nil {
				fmt.Fprintf(a.stderr, "plugd lists %d plugins now; their changes follow\n", len(now))
			} else {
				for _, ev := range listEvents(last, now, time.Now()) {
					if err := write(a.stdout, ev); err != nil {
						return err
					}
				}
			}
			last = now
		}
		select {
		case <-tick.C:
		case <-ctx.Done():
			return nil
		}
	}
}

// listOnce asks for the list, giving plugd --timeout to answer.
func (a *app) listOnce(ctx context.Context, c *api.Client) ([]api.Plugin, error) {
	ctx, cancel := a.requestContext(ctx)
	defer cancel()
	return c.Plugins(ctx, api.Filter{})
}

// listEvents are the events that turn the list before into the list now,
// as plugd would have sent them, in the order of the plugins' IDs: a plugin
// that appeared is Discovered (and, past Pending, its state's event
// follows), one whose state changed has its new state's event (Deregistered
// first, if it was registered and is not now), a Failed one that failed
// again is Failed again, and one that went is Removed. Their Seq is 0: they
// are not plugd's.
func listEvents(before, now map[string]api.Plugin, at time.Time) []api.Event {
	var out []api.Event
	add := func(typ string, p api.Plugin) { out = append(out, api.Event{Time: at, Type: typ, Plugin: p}) }
	for _, id := range slices.Sorted(maps.Keys(now)) {
		p := now[id]
		old, seen := before[id]
		if !seen {
			add(api.EventDiscovered, p)
			if typ := stateEvent(api.StatePending, p.State); typ != "" {
				add(typ, p)
			}
			continue
		}
		wasRegistered := old.State == api.StateRegistered || old.State == api.StateUnhealthy
		isRegistered := p.State == api.StateRegistered || p.State == api.StateUnhealthy
		switch {
		case old.State != p.State:
			if wasRegistered && !isRegistered {
				add(api.EventDeregistered, p)
			}
			if typ := stateEvent(old.State, p.State); typ != "" {
				add(typ, p)
			}
		case p.State == api.StateFailed && (p.Attempts != old.Attempts || p.LastError != old.LastError):
			add(api.EventFailed, p)
		}
	}
	for _, id := range slices.Sorted(maps.Keys(before)) {
		if _, ok := now[id]; !ok {
			gone := before[id]
			gone.State, gone.Reason = "", "" // forgotten: no state, as plugd's Removed says
			add(api.EventRemoved, gone)
		}
	}
	return out
}

// stateEvent is the event that says a plugin went from one state to
// another; "" for a state no event ends in (Pending, Registering).
func stateEvent(from, to string) string {
	switch to {
	case api.StateRegistered:
		if from == api.StateUnhealthy {
			return api.EventHealthy
		}
		return api.EventRegistered
	case api.StateFailed, api.StateStale:
		return api.EventFailed
	case api.StateRejected:
		return api.EventRejected
	case api.StateUnhealthy:
		return api.EventUnhealthy
	case api.StateAnswering:
		return api.EventAnswering
	case api.StateNotAnswering:
		return api.EventNotAnswering
	}
	return ""
}

// eventStream is an open event stream with the context that keeps it open.
type eventStream struct {
	*api.EventStream
	cancel context.CancelFunc
}

func (s eventStream) Close() error {
	s.cancel()
	return s.EventStream.Close()
}

// openEvents opens the event stream, giving plugd --timeout to answer. The
// stream itself lasts as long as ctx, so --timeout cannot be its deadline.
func (a *app) openEvents(ctx context.Context, c *api.Client, replay int) (eventStream, error) {
	streamCtx, cancel := context.WithCancel(ctx)
	timer := time.AfterFunc(a.timeout, cancel)
	s, err := c.Events(streamCtx, replay)
	if !timer.Stop() && ctx.Err() == nil {
		if err == nil {
			s.Close()
		}
		cancel()
		return eventStream{}, fmt.Errorf("plugd at %s did not answer within %s; is it overloaded? --timeout waits longer", where(c), a.timeout)
	}
	if err != nil {
		cancel()
		if ctx.Err() != nil {
			return eventStream{}, fmt.Errorf("interrupted: %w", ctx.Err())
		}
		return eventStream{}, err
	}
	return eventStream{EventStream: s, cancel: cancel}, nil
}

// printEvent writes ev as one line for people.
func printEvent(w io.Writer, ev api.Event) error {
	_, err := fmt.Fprintln(w, eventLine(ev))
	return err
}

func eventLine(ev api.Event) string {
	t := ev.Time.Local().Format("15:04:05.000")
	if ev.Type == "Lost" {
		return fmt.Sprintf("%s  %-12s  missed %d events; 'plugctl list' shows the current state", t, ev.Type, ev.Missed)
	}
	p := ev.Plugin
	line := fmt.Sprintf("%s  %-12s  %s  %s  %s  %s", t, printer.Cell(ev.Type), printer.Cell(p.Type), printer.Cell(p.Name), printer.Cell(p.ID), printer.Cell(p.State))
	if p.LastError != "" {
		line += "  " + errorText(p)
	}
	return line
}

// errorText is a plugin's last error with the step it happened at.
func errorText(p api.Plugin) string {
	// Escaped here too: a daemon that did not must not drive the terminal.
	msg := textsafe.Escape(strings.Join(strings.Fields(p.LastError), " "))
	if p.Reason != "" {
		return fmt.Sprintf("error (%s): %s", textsafe.Escape(p.Reason), msg)
	}
	return "error: " + msg
}
