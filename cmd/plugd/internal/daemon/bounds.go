package daemon

import (
	"fmt"
	"time"
)

// Floors and ceilings of the numeric settings. A value outside is refused at
// start (and on reload), naming the field and the range: a typo such as
// probeInterval: 1ns or workers: 1000000 must not spin plugd, exhaust the
// node, or turn a timeout into a hang. Zero is always the default.
const (
	maxWorkers    = 1024
	maxMaxSockets = 100_000
	minDuration   = 10 * time.Millisecond // of every duration without a floor of its own
	day           = 24 * time.Hour
)

// durationBound is the range of one duration setting.
type durationBound struct {
	name       string
	v          Duration
	min, max   time.Duration // max 0: no ceiling
	def        string        // the default, for the message
	canDisable bool          // negative disables it
}

func (b durationBound) check() error {
	d := time.Duration(b.v)
	if d == 0 || d < 0 && b.canDisable {
		return nil
	}
	if d >= b.min && (b.max == 0 || d <= b.max) {
		return nil
	}
	rng := "at least " + b.min.String()
	if b.max > 0 {
		rng += " and at most " + b.max.String()
	}
	extra := ""
	if b.canDisable {
		extra = ", or negative to disable it"
	}
	return fmt.Errorf("%s is %s: it must be %s (default %s)%s", b.name, d, rng, b.def, extra)
}

func checkDurations(bs []durationBound) error {
	for _, b := range bs {
		if err := b.check(); err != nil {
			return err
		}
	}
	return nil
}

// checkBounds refuses a numeric setting of c out of its range.
func (c Config) checkBounds() error {
	for _, n := range []struct {
		name     string
		v, max   int
		def      string
		whatsBig string
	}{
		{"workers", c.Workers, maxWorkers, "128", "each is a goroutine that may hold a dial and a handler call"},
		{"policy.maxSockets", c.Policy.MaxSockets, maxMaxSockets, "20000", "each tracked socket costs memory and, registered, file descriptors"},
	} {
		if n.v < 0 || n.v > n.max {
			return fmt.Errorf("%s is %d: it must be from 1 to %d (default %s; %s)", n.name, n.v, n.max, n.def, n.whatsBig)
		}
	}
	bs := []durationBound{
		// The walk lists the whole directory: not more than once a second.
		{name: "resyncInterval", v: c.ResyncInterval, min: time.Second, max: day, def: "30s", canDisable: true},
		{name: "backoff.initial", v: c.Backoff.Initial, min: minDuration, max: 10 * time.Minute, def: "500ms"},
		{name: "backoff.max", v: c.Backoff.Max, min: minDuration, max: time.Hour, def: "2m"},
		{name: "timeouts.dial", v: c.Timeouts.Dial, min: minDuration, max: 5 * time.Minute, def: "5s"},
		{name: "timeouts.getInfo", v: c.Timeouts.GetInfo, min: minDuration, max: 5 * time.Minute, def: "5s"},
		{name: "timeouts.notify", v: c.Timeouts.Notify, min: minDuration, max: 5 * time.Minute, def: "5s"},
		{name: "timeouts.handler", v: c.Timeouts.Handler, min: minDuration, max: 10 * time.Minute, def: "30s"},
		{name: "shutdownTimeout", v: c.ShutdownTimeout, min: 100 * time.Millisecond, max: 10 * time.Minute, def: "10s"},
		// Every registered plugin is asked this often.
		{name: "liveness.probeInterval", v: c.Liveness.ProbeInterval, min: 100 * time.Millisecond, max: day, def: "5m", canDisable: true},
		{name: "liveness.unhealthyGrace", v: c.Liveness.UnhealthyGrace, min: minDuration, max: day, def: "30s"},
		// A plugin's socket exists a moment before it listens: never remove
		// one that young.
		{name: "policy.removeStaleAfter", v: c.Policy.RemoveStaleAfter, min: time.Second, def: "never"},
	}
	if k := c.Kubernetes; k != nil {
		bs = append(bs, durationBound{name: "kubernetes.disagreementGrace", v: k.DisagreementGrace, min: time.Second, max: day, def: "1m"})
	}
	return checkDurations(bs)
}

// checkBounds refuses a handler's numeric setting out of its range; the
// names are the entry's own.
func (h HandlerConfig) checkBounds() error {
	bs := []durationBound{
		{name: "gracePeriod", v: h.GracePeriod, min: minDuration, max: day, def: "30s"},
		{name: "unhealthyGrace", v: h.UnhealthyGrace, min: minDuration, max: day, def: "liveness.unhealthyGrace"},
		{name: "probeInterval", v: h.ProbeInterval, min: 100 * time.Millisecond, max: day, def: "liveness.probeInterval", canDisable: true},
	}
	if h.Hook != nil {
		bs = append(bs, durationBound{name: "hook.timeout", v: h.Hook.Timeout, min: minDuration, max: 10 * time.Minute, def: "10s"})
	}
	return checkDurations(bs)
}
