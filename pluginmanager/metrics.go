package pluginmanager

import (
	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the manager's Prometheus series. Type labels only take the types
// a handler was added for, and "other": a plugin chooses its type string, and
// must not be able to create series at will.
type metrics struct {
	attempts        prometheus.Counter
	failures        *prometheus.CounterVec
	latency         *prometheus.HistogramVec
	deregistrations *prometheus.CounterVec
	overLimit       prometheus.Counter
	fdReserveHits   prometheus.Counter
	fdExhausted     prometheus.Counter
	plugins         *prometheus.Desc
}

const otherType = "other"

func newMetrics() *metrics {
	return &metrics{
		attempts: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "plugd_registration_attempts_total",
			Help: "Registration attempts started.",
		}),
		failures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "plugd_registration_failures_total",
			Help: "Registration attempts that failed, by plugin type and the step that failed.",
		}, []string{"type", "reason"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "plugd_registration_latency_seconds",
			Help:    "Time from a socket being discovered to its plugin being registered and told so.",
			Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120, 300},
		}, []string{"type"}),
		deregistrations: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "plugd_deregistrations_total",
			Help: "Plugins deregistered from their handler.",
		}, []string{"type"}),
		overLimit: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "plugd_sockets_over_limit_total",
			Help: "Sockets not tracked because the manager already tracked Options.MaxSockets.",
		}),
		fdReserveHits: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "plugd_fd_reserve_hits_total",
			Help: "Connections to plugins not held, so as to keep file descriptors for new registrations; those plugins are watched by their probes.",
		}),
		fdExhausted: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "plugd_fd_exhausted_total",
			Help: "Connections to plugins that could not be made for want of file descriptors (EMFILE, ENFILE); retried, and not counted as the plugins' failures.",
		}),
		plugins: prometheus.NewDesc("plugd_plugins",
			"Registration sockets known to the manager, by plugin type and state.",
			[]string{"type", "state"}, nil),
	}
}

// register puts the collectors on reg; the plugins gauge is read from the
// manager's state at scrape time, so the hot path never touches it.
func (m *Manager) registerMetrics(reg prometheus.Registerer) error {
	held := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "plugd_held_connections",
		Help: "Idle connections held to plugins, to hear at once when one goes.",
	}, func() float64 { return float64(m.client.conns.Len()) })
	for _, c := range []prometheus.Collector{m.metrics.attempts, m.metrics.failures, m.metrics.latency, m.metrics.deregistrations, m.metrics.overLimit,
		m.metrics.fdReserveHits, m.metrics.fdExhausted, held, pluginsCollector{m}} {
		if err := reg.Register(c); err != nil {
			return err
		}
	}
	return nil
}

type pluginsCollector struct{ m *Manager }

func (c pluginsCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.m.metrics.plugins }

func (c pluginsCollector) Collect(ch chan<- prometheus.Metric) {
	type key struct {
		typ   string
		state State
	}
	counts := make(map[key]int)
	m := c.m
	// Every handled type reports every state, so that series do not vanish at zero.
	for _, typ := range m.table.types() {
		for _, s := range m.rec.states() {
			counts[key{typ, s}] = 0
		}
	}
	m.reg.lock()
	for _, e := range m.reg.entries {
		counts[key{m.table.label(e.status.Type), e.status.State}]++
	}
	m.reg.unlock()
	for k, n := range counts {
		ch <- prometheus.MustNewConstMetric(m.metrics.plugins, prometheus.GaugeValue, float64(n), k.typ, string(k.state))
	}
}
