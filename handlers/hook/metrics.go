package hook

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the handler's Prometheus series. The labels take only the
// handler's own fixed values, never anything a plugin or hook chose.
type metrics struct {
	runs     *prometheus.CounterVec
	duration *prometheus.HistogramVec
}

// newMetrics returns the collectors, registered on reg if it is not nil. The
// series of the configured events start at zero, so that a rate is defined
// before the first failure.
func newMetrics(reg prometheus.Registerer, events []string) (*metrics, error) {
	m := &metrics{
		runs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "plugd_hook_runs_total",
			Help: "Hook runs, by event and result (accepted, refused, error, timeout).",
		}, []string{"event", "result"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "plugd_hook_duration_seconds",
			Help:    "How long hook runs took, by event.",
			Buckets: []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60},
		}, []string{"event"}),
	}
	if reg != nil {
		var err error
		if m.runs, err = register(reg, m.runs); err != nil {
			return nil, err
		}
		if m.duration, err = register(reg, m.duration); err != nil {
			return nil, err
		}
	}
	for _, ev := range events {
		for _, res := range []string{resultAccepted, resultRefused, resultError, resultTimeout} {
			m.runs.WithLabelValues(ev, res)
		}
		m.duration.WithLabelValues(ev)
	}
	return m, nil
}

// register registers c on reg, or returns the collector already there: the
// handlers of several plugin types may share a registry, and count together.
func register[C prometheus.Collector](reg prometheus.Registerer, c C) (C, error) {
	err := reg.Register(c)
	if are := (prometheus.AlreadyRegisteredError{}); errors.As(err, &are) {
		if existing, ok := are.ExistingCollector.(C); ok {
			return existing, nil
		}
	}
	return c, err
}
