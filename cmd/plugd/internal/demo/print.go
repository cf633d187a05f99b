package demo

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/plugd/plugd/api"
)

// eventFormat aligns an event line; the widths fit the demo's plugins.
const eventFormat = "%-9s %-12s %-19s %-19s %-12s %s"

// errorWidth is where the table cuts a plugin's error: the event line
// above it had the whole of it.
const errorWidth = 48

// title says what is happening and where, and how to look from outside.
func (d *demo) title() {
	logWhere := d.logPath
	if logWhere == "" {
		logWhere = "standard error (--verbose)"
	}
	fmt.Fprintf(d.out, `plugd runs in this process on a temporary directory, and example plugins come
and go in it. Each line below is an event from plugd's status API
(GET /v1/events), printed as it happens; each table is its list of plugins
(GET /v1/plugins).

  registry directory  %s
  status API          %s
  plugd's log         %s
  All of it is removed when the demo exits.

In another terminal: go run ./cmd/plugctl --socket %s list
(its first run compiles plugctl, silently: go run -v names each package it compiles)
`, d.registry, d.socket, logWhere, d.socket)
}

// printEventHeader names the columns of the event lines that follow.
func (d *demo) printEventHeader() {
	fmt.Fprintln(d.out, strings.TrimRight(fmt.Sprintf(eventFormat, "TIME", "EVENT", "TYPE", "NAME", "ID", "DETAIL"), " "))
}

// printEvent writes one event line.
func (d *demo) printEvent(ev api.Event) {
	typ, name := ev.Plugin.Type, ev.Plugin.Name
	if typ == "" {
		typ, name = "-", "-" // the plugin has not answered GetInfo (yet)
	}
	id := ev.Plugin.ID
	if ev.Type == evLost {
		id = "-"
	}
	offset := fmt.Sprintf("+%.3fs", ev.Time.Sub(d.start).Seconds())
	line := fmt.Sprintf(eventFormat, offset, ev.Type, typ, name, id, d.detail(ev))
	fmt.Fprintln(d.out, strings.TrimRight(line, " "))
}

// detail is the last column of an event line: what the event means for the
// plugin, in a few words.
func (d *demo) detail(ev api.Event) string {
	p := ev.Plugin
	switch ev.Type {
	case evDiscovered:
		return "new socket"
	case evRegistered:
		s := "versions " + strings.Join(p.Versions, ",")
		if p.Attempts > 1 {
			s += fmt.Sprintf(", on attempt %d", p.Attempts)
		}
		return s
	case evFailed:
		return fmt.Sprintf("attempt %d, retry in %s; %s: %s", p.Attempts,
			p.NextRetry.Sub(ev.Time).Round(time.Millisecond), p.Reason, d.short(p.LastError))
	case evRejected:
		return fmt.Sprintf("%s: %s", p.Reason, d.short(p.LastError))
	case evDeregistered:
		if p.LastError != "" {
			return "the handler failed to let it go: " + d.short(p.LastError)
		}
		return "its socket went; the handler let it go"
	case evRemoved:
		// The event carries the socket's last error, which an earlier line showed.
		return "socket gone, forgotten"
	case evLost:
		return fmt.Sprintf("this event stream fell behind and missed %d events; the table is up to date", ev.Missed)
	}
	return d.short(p.LastError)
}

// short drops the registry directory from the paths in a message: it was
// printed once at the top, and the lines stay readable without it.
func (d *demo) short(msg string) string {
	return strings.ReplaceAll(msg, d.registry+string(filepath.Separator), "")
}

// tableText is the table of every plugin plugd knows, from the status API,
// with a blank line before it.
func (d *demo) tableText(ctx context.Context) (string, error) {
	plugins, err := d.client.Plugins(ctx, api.Filter{})
	if err != nil {
		return "", fmt.Errorf("listing plugins: %w", err)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "\n  GET /v1/plugins at +%.3fs: %s\n", time.Since(d.start).Seconds(), summary(plugins))
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	// The empty first column indents the table by tabwriter's padding.
	fmt.Fprintln(tw, "\tID\tTYPE\tNAME\tSTATE\tATTEMPTS\tERROR")
	for _, p := range plugins {
		fmt.Fprintf(tw, "\t%s\t%s\t%s\t%s\t%d\t%s\n", p.ID, orDash(p.Type), orDash(p.Name), p.State, p.Attempts,
			orDash(shortenError(d.short(p.LastError), errorWidth)))
	}
	tw.Flush()
	return b.String(), nil
}

// printTable appends the table to the output.
func (d *demo) printTable(ctx context.Context) error {
	t, err := d.tableText(ctx)
	if err != nil {
		return err
	}
	fmt.Fprint(d.out, t)
	return nil
}

// summary counts plugins by state, e.g. "6 plugins: 4 Registered, 2 Rejected".
func summary(plugins []api.Plugin) string {
	counts := make(map[string]int)
	for _, p := range plugins {
		counts[p.State]++
	}
	var parts []string
	for _, s := range api.States() {
		if counts[s] > 0 {
			parts = append(parts, fmt.Sprintf("%d %s", counts[s], s))
			delete(counts, s)
		}
	}
	for s, n := range counts { // a state this demo does not know yet
		parts = append(parts, fmt.Sprintf("%d %s", n, s))
	}
	noun := "plugins"
	if len(plugins) == 1 {
		noun = "plugin"
	}
	if len(parts) == 0 {
		return "no plugins"
	}
	return fmt.Sprintf("%d %s: %s", len(plugins), noun, strings.Join(parts, ", "))
}

// live keeps plugd running after the scenario, and prints each event and
// then the table again, until ctx is done. On a terminal the table is redrawn
// in place, below the events.
func (d *demo) live(ctx context.Context) error {
	fmt.Fprintf(d.out, `
plugd keeps running until Ctrl-C, and the table follows its events. In another
terminal, try:
  go run ./cmd/plugctl --socket %[1]s list
  go run ./examples/plugin -dir %[2]s
  go run ./examples/plugin -dir %[2]s -type example.com/Nope -name nope

`, d.socket, d.registry)
	d.printEventHeader()
	drawn := 0 // lines of the table on the terminal, to move back up over
	draw := func() error {
		t, err := d.tableText(ctx)
		if err != nil {
			return err
		}
		if d.opts.TermWidth != nil {
			t = fit(t, d.opts.TermWidth())
			drawn = strings.Count(t, "\n")
		}
		fmt.Fprint(d.out, t)
		return d.outputErr()
	}
	if err := draw(); err != nil {
		return err
	}
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case ev, ok := <-d.events:
			if !ok {
				return d.streamEnded(ctx, "following plugd's events")
			}
			if drawn > 0 {
				// To the start of the table's first line, and clear from
				// there to the end of the screen.
				fmt.Fprintf(d.out, "\r\x1b[%dA\x1b[J", drawn)
			}
			d.printEvent(ev)
			// Events often come in bursts (a socket is discovered, then
			// registered): print all that are here, then the table once.
			for more := true; more; {
				select {
				case ev, ok := <-d.events:
					if !ok {
						return d.streamEnded(ctx, "following plugd's events")
					}
					d.printEvent(ev)
				default:
					more = false
				}
			}
			if err := draw(); err != nil {
				return err
			}
		}
	}
}

// fit cuts each line of s to less than width columns, so that none wraps
// and the lines on the terminal are the lines counted. The table is ASCII,
// bar what plugins send, so a rune is a column near enough.
func fit(s string, width int) string {
	lines := strings.SplitAfter(s, "\n")
	for i, l := range lines {
		body := strings.TrimSuffix(l, "\n")
		if r := []rune(body); len(r) >= width {
			lines[i] = string(r[:max(width-1, 0)]) + l[len(body):]
		}
	}
	return strings.Join(lines, "")
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// shortenError shortens an error message to at most n runes. A Go error is a
// chain, "what: why: ...: root cause", whose two ends say the most; the
// middle goes first, and only if that is not enough is the end cut.
func shortenError(s string, n int) string {
	if len([]rune(s)) <= n {
		return s
	}
	if parts := strings.Split(s, ": "); len(parts) > 2 {
		if ends := parts[0] + ": ...: " + parts[len(parts)-1]; len([]rune(ends)) <= n {
			return ends
		}
	}
	return truncate(s, n)
}

// truncate shortens s to at most n runes, marking the cut.
func truncate(s string, n int) string {
	r := []rune(s)
	if len(r) <= n {
		return s
	}
	return string(r[:n-3]) + "..."
}
