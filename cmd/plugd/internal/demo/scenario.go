package demo

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/plugd/plugd/api"
	"github.com/plugd/plugd/plugin"
)

// Plugin types: the kubelet's three, and two of the demo's own.
const (
	typeCSI     = api.CSIPlugin
	typeDRA     = api.DRAPlugin
	typeDevice  = api.DevicePlugin
	typeGreeter = "example.com/Greeter" // a custom type, which plugd is configured to accept
	typeUnknown = "example.com/Unknown" // no handler, on purpose
)

// The event types of the status API (api.Event.Type).
const (
	evDiscovered   = "Discovered"
	evRegistered   = "Registered"
	evFailed       = "Failed"
	evRejected     = "Rejected"
	evDeregistered = "Deregistered"
	evRemoved      = "Removed"
	evLost         = "Lost"
)

// scenario plays the steps, each waiting for the events it should cause, and
// prints the table of plugins after each.
func (d *demo) scenario(ctx context.Context) error {
	steps := []struct {
		title string
		play  func(context.Context) error
	}{
		{"1. Four plugins start: a CSI driver, a DRA driver, a device plugin, and one of a\n" +
			"   type of your own. plugd has a handler for each type, so each registers.", d.stepRegister},
		{"2. A CSI driver that announces its endpoint as a relative path: plugd refuses it\n" +
			"   before any handler sees it. Rejected is final, not retried, until the plugin\n" +
			"   replaces its socket.", d.stepInvalid},
		{"3. A plugin of a type plugd has no handler for: rejected too, until plugd has one.\n" +
			"   Add a handler for the type to plugd's configuration file and send plugd SIGHUP,\n" +
			"   and the plugin registers, without a restart of either.", d.stepNoHandler},
		{"4. The Greeter plugin stops and removes its socket: plugd deregisters it and\n" +
			"   forgets the socket.", d.stepStop},
		{"5. A device plugin crashed and left its socket behind, with nobody listening.\n" +
			"   Connections are refused: Stale (nobody listens), retried with a backoff that doubles.", d.stepCrash},
		{"6. The device plugin restarts on the same socket name. A new socket file is a new\n" +
			"   registration: it registers at once, without waiting out the old backoff.", d.stepRestart},
	}
	for i, s := range steps {
		if i > 0 {
			if err := d.pause(ctx); err != nil {
				return err
			}
		}
		fmt.Fprintf(d.out, "\n%s\n\n", s.title)
		d.printEventHeader()
		if err := s.play(ctx); err != nil {
			return err
		}
		if err := d.printTable(ctx); err != nil {
			return err
		}
		if err := d.outputErr(); err != nil {
			return err
		}
	}
	fmt.Fprint(d.out, `
What you saw: a plugin announces itself with a socket in the registry directory;
plugd asks it who it is (GetInfo), lets the handler for its type decide, and
tells the plugin the verdict (NotifyRegistrationStatus). A refused plugin stays
refused until its socket changes; one that does not answer is retried with
backoff; a plugin whose socket goes is deregistered.
`)
	return nil
}

func (d *demo) stepRegister(ctx context.Context) error {
	var want []match
	for _, cfg := range []plugin.Config{
		{Type: typeCSI, Name: "csi.example.com", Socket: "csi.sock", Versions: []string{"1.0.0"}},
		{Type: typeDRA, Name: "dra.example.com", Socket: "dra.sock", Versions: []string{"v1.DRAPlugin"}},
		{Type: typeDevice, Name: "example.com/gpu", Socket: "gpu.sock", Versions: []string{"v1beta1"}},
		{Type: typeGreeter, Name: "greeter.example.com", Socket: "greeter.sock", Versions: []string{"v1"}},
	} {
		if _, err := d.startPlugin(cfg); err != nil {
			return err
		}
		want = append(want, is(evRegistered, cfg.Socket))
	}
	return d.await(ctx, "the four plugins to register", want...)
}

func (d *demo) stepInvalid(ctx context.Context) error {
	p, err := d.startPlugin(plugin.Config{Type: typeCSI, Name: "csi-bad.example.com", Socket: "csi-bad.sock",
		Endpoint: "csi/driver.sock", Versions: []string{"1.0.0"}})
	if err != nil {
		return err
	}
	if err := d.await(ctx, "csi-bad.sock to be rejected", is(evRejected, "csi-bad.sock")); err != nil {
		return err
	}
	d.told(p)
	return nil
}

func (d *demo) stepNoHandler(ctx context.Context) error {
	p, err := d.startPlugin(plugin.Config{Type: typeUnknown, Name: "mystery.example.com", Socket: "mystery.sock", Versions: []string{"v1"}})
	if err != nil {
		return err
	}
	if err := d.await(ctx, "mystery.sock to be rejected", is(evRejected, "mystery.sock")); err != nil {
		return err
	}
	d.told(p)
	return nil
}

func (d *demo) stepStop(ctx context.Context) error {
	i := slices.IndexFunc(d.plugins, func(p *plugin.Server) bool { return filepath.Base(p.Path()) == "greeter.sock" })
	if i < 0 {
		return errors.New("the Greeter plugin of step 1 is missing") // a bug in the scenario
	}
	if err := d.plugins[i].Close(); err != nil {
		return fmt.Errorf("stopping the Greeter plugin: %w", err)
	}
	return d.await(ctx, "greeter.sock to be deregistered and removed",
		is(evDeregistered, "greeter.sock"), is(evRemoved, "greeter.sock"))
}

func (d *demo) stepCrash(ctx context.Context) error {
	if err := leaveStaleSocket(d.registry, "fpga.sock"); err != nil {
		return err
	}
	// plugd looks again 10ms after a first refusal, as a socket can be bound
	// a moment before its plugin listens; the backoff starts after that. The
	// third failure shows it doubling.
	if err := d.await(ctx, "fpga.sock to fail three times", func(ev api.Event) bool {
		return is(evFailed, "fpga.sock")(ev) && ev.Plugin.Attempts >= 3
	}); err != nil {
		return err
	}
	// Asked now, the status API says when the next attempt is due.
	p, err := d.client.Plugin(ctx, "fpga.sock")
	if err != nil {
		return fmt.Errorf("asking plugd about fpga.sock: %w", err)
	}
	next := "a retry is under way"
	if wait := time.Until(p.NextRetry); wait > 0 {
		next = "the next retry is in " + wait.Round(time.Millisecond).String()
	}
	fmt.Fprintf(d.out, "%9s GET /v1/plugins/fpga.sock: %s after %d attempts; %s.\n", "", p.State, p.Attempts, next)
	return nil
}

func (d *demo) stepRestart(ctx context.Context) error {
	started := time.Now()
	if _, err := d.startPlugin(plugin.Config{Type: typeDevice, Name: "example.com/fpga", Socket: "fpga.sock", Versions: []string{"v1beta1"}}); err != nil {
		return err
	}
	var reg api.Event
	if err := d.await(ctx, "fpga.sock to register", func(ev api.Event) bool {
		if is(evRegistered, "fpga.sock")(ev) {
			reg = ev
			return true
		}
		return false
	}); err != nil {
		return err
	}
	fmt.Fprintf(d.out, "%9s registered %s after the restart, on attempt %d of the new socket.\n", "",
		max(0, reg.Time.Sub(started)).Round(time.Millisecond), reg.Plugin.Attempts)
	return nil
}

// told prints what a refused plugin heard from plugd: what the plugin's own
// log would say. plugd tells the plugin before it publishes the event, so
// the status is there by now.
func (d *demo) told(s *plugin.Server) {
	if st, ok := s.Status(); ok && !st.Registered {
		fmt.Fprintf(d.out, "%9s the plugin was told: not registered: %s\n", "", d.short(st.Error))
	}
}

// match says whether an event is one a step waits for.
type match func(api.Event) bool

// is matches an event of type typ on the socket whose ID is id.
func is(typ, id string) match {
	return func(ev api.Event) bool { return ev.Type == typ && ev.Plugin.ID == id }
}

// await prints events as they arrive until each of want has matched one. It
// fails if that takes longer than the step timeout, if the stream ends, or
// if ctx is done.
func (d *demo) await(ctx context.Context, what string, want ...match) error {
	timer := time.NewTimer(d.opts.StepTimeout)
	defer timer.Stop()
	for len(want) > 0 {
		select {
		case ev, ok := <-d.events:
			if !ok {
				return d.streamEnded(ctx, "waiting for "+what)
			}
			d.printEvent(ev)
			want = slices.DeleteFunc(want, func(m match) bool { return m(ev) })
		case <-timer.C:
			return fmt.Errorf("waiting for %s: it did not happen within %s; the events above show how far it got", what, d.opts.StepTimeout)
		case <-ctx.Done():
			return fmt.Errorf("waiting for %s: %w", what, ctx.Err())
		}
	}
	return nil
}

// streamEnded is the error for an event stream that ended while the demo
// still needed it.
func (d *demo) streamEnded(ctx context.Context, doing string) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("%s: %w", doing, err)
	}
	select {
	case <-d.runDone:
		return fmt.Errorf("%s: plugd stopped (%v)", doing, d.runErr)
	default:
		return fmt.Errorf("%s: plugd's event stream ended: %v", doing, d.streamErr)
	}
}

// leaveStaleSocket leaves a socket named name in dir that nobody listens on,
// as a crashed plugin does. It is bound under a dot-name, which plugd
// ignores, and renamed into place once closed: bound under its final name,
// it could be dialled in the instant before Close and show a reset
// connection instead of the refusal a crash leaves.
func leaveStaleSocket(dir, name string) error {
	tmp := filepath.Join(dir, "."+name+".tmp")
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: tmp, Net: "unix"})
	if err != nil {
		return fmt.Errorf("making a stale socket for the crashed plugin: %w", err)
	}
	l.SetUnlinkOnClose(false)
	if err := l.Close(); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("making a stale socket for the crashed plugin: %w", err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, name)); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("making a stale socket for the crashed plugin: %w", err)
	}
	return nil
}
