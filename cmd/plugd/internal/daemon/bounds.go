package daemon

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/plugd/plugd/handlers/dra"
)

// The numeric settings: each one's default and the range a value must be
// in. These tables are the one place they are written: WithDefaults
// refuses a value out of range (at start and on reload, naming the field
// and the range: a typo such as probeInterval: 1ns or workers: 1000000 must
// not spin plugd, exhaust the node, or turn a timeout into a hang) and
// applies the defaults from them, plugd's flags print their defaults from
// them, and TestConfigReference holds docs/reference.md's configuration
// table to them. Zero always means the default.

const (
	minDuration = 10 * time.Millisecond // of every duration without a floor of its own
	day         = 24 * time.Hour
)

// What a negative duration means, where one is allowed.
const (
	disables = "disables"
	// An Unhealthy plugin stays registered while it is Unhealthy, as the
	// kubelet keeps a CSI driver whose registrar died while the driver
	// serves (pluginmanager.Options.UnhealthyGrace).
	keepsForEver = "keeps an Unhealthy plugin registered for ever, as the kubelet does"
)

// countSettings are the configuration's numbers.
var countSettings = []countSetting{
	{field: "workers", flag: "workers", def: 128, max: 1024,
		whatsBig: "each is a goroutine that may hold a dial and a handler call",
		at:       func(c *Config) *int { return &c.Workers }},
	{field: "policy.maxSockets", flag: "max-sockets", def: 20000, max: 100_000,
		whatsBig: "each tracked socket costs memory and, registered, file descriptors",
		at:       func(c *Config) *int { return &c.Policy.MaxSockets }},
}

// durationSettings are the configuration's durations.
var durationSettings = []durationSetting[Config]{
	// The walk lists the whole directory: not more than once a second.
	{field: "resyncInterval", flag: "resync-interval", def: 30 * time.Second, min: time.Second, max: day, negative: disables,
		at: func(c *Config) *Duration { return &c.ResyncInterval }},
	{field: "backoff.initial", flag: "backoff-initial", def: 500 * time.Millisecond, min: minDuration, max: 10 * time.Minute,
		at: func(c *Config) *Duration { return &c.Backoff.Initial }},
	{field: "backoff.max", flag: "backoff-max", def: 2 * time.Minute, min: minDuration, max: time.Hour,
		at: func(c *Config) *Duration { return &c.Backoff.Max }},
	{field: "timeouts.dial", flag: "dial-timeout", def: 5 * time.Second, min: minDuration, max: 5 * time.Minute,
		at: func(c *Config) *Duration { return &c.Timeouts.Dial }},
	{field: "timeouts.getInfo", flag: "get-info-timeout", def: 5 * time.Second, min: minDuration, max: 5 * time.Minute,
		at: func(c *Config) *Duration { return &c.Timeouts.GetInfo }},
	{field: "timeouts.notify", flag: "notify-timeout", def: 5 * time.Second, min: minDuration, max: 5 * time.Minute,
		at: func(c *Config) *Duration { return &c.Timeouts.Notify }},
	{field: "timeouts.handler", flag: "handler-timeout", def: 30 * time.Second, min: minDuration, max: 10 * time.Minute,
		at: func(c *Config) *Duration { return &c.Timeouts.Handler }},
	{field: "shutdownTimeout", flag: "shutdown-timeout", def: 10 * time.Second, min: 100 * time.Millisecond, max: 10 * time.Minute,
		at: func(c *Config) *Duration { return &c.ShutdownTimeout }},
	// Every registered plugin is asked this often.
	{field: "liveness.probeInterval", flag: "probe-interval", def: 5 * time.Minute, min: 100 * time.Millisecond, max: day, negative: disables,
		at: func(c *Config) *Duration { return &c.Liveness.ProbeInterval }},
	{field: "liveness.unhealthyGrace", flag: "unhealthy-grace", def: 30 * time.Second, min: minDuration, max: day, negative: keepsForEver,
		at: func(c *Config) *Duration { return &c.Liveness.UnhealthyGrace }},
	// A plugin's socket exists a moment before it listens: never remove
	// one that young.
	{field: "policy.removeStaleAfter", flag: "remove-stale-after", defText: "never", min: time.Second,
		at: func(c *Config) *Duration { return &c.Policy.RemoveStaleAfter }},
	{field: "kubernetes.disagreementGrace", def: time.Minute, min: time.Second, max: day,
		at: func(c *Config) *Duration {
			if c.Kubernetes == nil {
				return nil
			}
			return &c.Kubernetes.DisagreementGrace
		}},
	// A taint another writer puts back within it is removed again; after
	// it, left to that writer. Zero would make every re-add someone
	// else's, even the node manager's at boot that the window exists for.
	{field: "kubernetes.startupWindow", def: 10 * time.Minute, min: time.Second, max: day,
		at: func(c *Config) *Duration {
			if c.Kubernetes == nil {
				return nil
			}
			return &c.Kubernetes.StartupWindow
		}},
	// One write per node per interval; readers (plugctl cluster) count a
	// condition as unmaintained after twice the longest and a minute
	// (nodecond.MaxHeartbeatAge).
	{field: "kubernetes.heartbeatInterval", def: 5 * time.Minute, min: time.Minute, max: 5 * time.Minute,
		at: func(c *Config) *Duration {
			if c.Kubernetes == nil {
				return nil
			}
			return &c.Kubernetes.HeartbeatInterval
		}},
	// Each read costs the kubelet the rendering of all its metrics.
	{field: "kubernetes.kubelet.resync", def: 5 * time.Minute, min: 10 * time.Second, max: day,
		at: func(c *Config) *Duration {
			if c.Kubernetes == nil {
				return nil
			}
			return &c.Kubernetes.Kubelet.Resync
		}},
}

// handlerSettings are the durations of a handlers entry; their fields are
// the entry's own.
var handlerSettings = []durationSetting[HandlerConfig]{
	// One default for both handlers (deviceplugin.DefaultGracePeriod is
	// the same constant).
	{field: "gracePeriod", def: dra.DefaultGracePeriod, min: minDuration, max: day,
		at: func(h *HandlerConfig) *Duration {
			if h.Handler != "dra" && h.Handler != "deviceplugin" {
				return nil // refused if set: checkHandler
			}
			return &h.GracePeriod
		}},
	{field: "unhealthyGrace", defText: "liveness.unhealthyGrace", min: minDuration, max: day, negative: keepsForEver,
		at: func(h *HandlerConfig) *Duration { return &h.UnhealthyGrace }},
	{field: "probeInterval", defText: "liveness.probeInterval", min: 100 * time.Millisecond, max: day, negative: disables,
		at: func(h *HandlerConfig) *Duration { return &h.ProbeInterval }},
	{field: "hook.timeout", def: 10 * time.Second, min: minDuration, max: 10 * time.Minute,
		at: func(h *HandlerConfig) *Duration {
			if h.Hook == nil {
				return nil
			}
			return &h.Hook.Timeout
		}},
}

// countSetting is a number from 1 to max.
type countSetting struct {
	field    string // the YAML path, as errors and the reference name it
	flag     string // the command-line flag, without dashes
	def, max int
	whatsBig string // what a large value costs, said when one is refused
	at       func(*Config) *int
}

func (s countSetting) check(c *Config) error {
	if v := *s.at(c); v < 0 || v > s.max {
		return fmt.Errorf("%s is %d: it must be from 1 to %d (default %d; %s)", s.field, v, s.max, s.def, s.whatsBig)
	}
	return nil
}

func (s countSetting) applyDefault(c *Config) {
	if p := s.at(c); *p == 0 {
		*p = s.def
	}
}

func (s countSetting) defaultText() string { return fmt.Sprint(s.def) }
func (s countSetting) rangeText() string   { return fmt.Sprintf("1 to %d", s.max) }

// durationSetting is a duration of T (a Config, or a handlers entry).
type durationSetting[T any] struct {
	field    string // the YAML path, as errors and the reference name it
	flag     string // the command-line flag, without dashes; "" for none
	def      time.Duration
	defText  string        // the default when def is zero: "never", or the setting it inherits
	min, max time.Duration // max 0: no ceiling
	negative string        // what a negative value means (disables); "" refuses one
	// at is the field in t, or nil where the setting does not apply to t
	// (no kubernetes section; a handler without a hook).
	at func(t *T) *Duration
}

func (s durationSetting[T]) check(t *T) error {
	p := s.at(t)
	if p == nil {
		return nil
	}
	d := time.Duration(*p)
	if d == 0 || d < 0 && s.negative != "" {
		return nil
	}
	if d >= s.min && (s.max == 0 || d <= s.max) {
		return nil
	}
	rng := "at least " + s.min.String()
	if s.max > 0 {
		rng += " and at most " + s.max.String()
	}
	extra := ""
	if s.negative != "" {
		extra = ", or negative, which " + s.negative
	}
	return fmt.Errorf("%s is %s: it must be %s (default %s)%s", s.field, d, rng, s.defaultText(), extra)
}

func (s durationSetting[T]) applyDefault(t *T) {
	if p := s.at(t); p != nil && *p == 0 && s.def != 0 {
		*p = Duration(s.def)
	}
}

func (s durationSetting[T]) defaultText() string {
	if s.def == 0 {
		return s.defText
	}
	return shortDuration(s.def)
}

// rangeText is the range, as the reference writes it.
func (s durationSetting[T]) rangeText() string {
	r := "at least `" + shortDuration(s.min) + "`"
	if s.max > 0 {
		r = "`" + shortDuration(s.min) + "` to `" + shortDuration(s.max) + "`"
	}
	if s.negative != "" {
		r += "; negative " + s.negative
	}
	return r
}

// shortDuration writes d as a person would: 2m, not 2m0s.
func shortDuration(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}

// checkBounds refuses a numeric setting of c out of its range.
func (c Config) checkBounds() error {
	for _, s := range countSettings {
		if err := s.check(&c); err != nil {
			return err
		}
	}
	for _, s := range durationSettings {
		if err := s.check(&c); err != nil {
			return err
		}
	}
	return nil
}

// applyNumberDefaults sets c's zero numeric settings to their defaults.
// c is a copy whose kubernetes section checkKubernetes has copied; its
// handlers and their hooks are copied here, so that nothing is written
// through to the caller's.
func (c *Config) applyNumberDefaults() {
	c.Handlers = slices.Clone(c.Handlers)
	for _, s := range countSettings {
		s.applyDefault(c)
	}
	for _, s := range durationSettings {
		s.applyDefault(c)
	}
	for i := range c.Handlers {
		h := &c.Handlers[i]
		if h.Hook != nil {
			hook := *h.Hook
			h.Hook = &hook
		}
		for _, s := range handlerSettings {
			s.applyDefault(h)
		}
	}
}

// checkBounds refuses a handler's numeric setting out of its range; the
// names are the entry's own.
func (h HandlerConfig) checkBounds() error {
	for _, s := range handlerSettings {
		if err := s.check(&h); err != nil {
			return err
		}
	}
	return nil
}

// flagDefault is " (default X)" for the flag of a numeric setting, for
// its help text.
func flagDefault(flag string) string {
	for _, s := range countSettings {
		if s.flag == flag {
			return " (default " + s.defaultText() + ")"
		}
	}
	for _, s := range durationSettings {
		if s.flag == flag {
			return " (default " + s.defaultText() + ")"
		}
	}
	panic("no numeric setting has the flag --" + flag)
}
