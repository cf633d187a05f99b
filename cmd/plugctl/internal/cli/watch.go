package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/plugd/plugd/api"
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
not missed.`,
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
	stream, err := a.openEvents(ctx, c, replay)
	if err != nil {
		if ctx.Err() != nil {
			return nil // Ctrl-C before plugd answered
		}
		return err
	}
	defer stream.Close()
	write := printEvent
	if output == "json" {
		enc := json.NewEncoder(a.stdout)
		write = func(_ io.Writer, ev api.Event) error { return enc.Encode(ev) }
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
	line := fmt.Sprintf("%s  %-12s  %s  %s  %s  %s", t, cell(ev.Type), cell(p.Type), cell(p.Name), cell(p.ID), cell(p.State))
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
