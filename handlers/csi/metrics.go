package csi

import "github.com/prometheus/client_golang/prometheus"

// metrics are the handler's Prometheus series. Labels take only fixed sets of
// values (methods and gRPC codes), except the driver label of the instances
// gauge, which only names drivers that passed validation and registered.
type metrics struct {
	calls     *prometheus.CounterVec
	drivers   *prometheus.Desc
	instances *prometheus.Desc
}

func newMetrics() *metrics {
	return &metrics{
		calls: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "plugd_csi_calls_total",
			Help: "CSI calls made to drivers, by method and gRPC status code.",
		}, []string{"method", "code"}),
		drivers: prometheus.NewDesc("plugd_csi_drivers",
			"CSI drivers registered (with at least one instance).", nil, nil),
		instances: prometheus.NewDesc("plugd_csi_driver_instances",
			"Registered instances of each CSI driver; more than one during a rolling restart.",
			[]string{"driver"}, nil),
	}
}

// driversCollector reads the gauges from the handler's state at scrape time,
// so that registering a driver never touches them.
type driversCollector struct{ h *Handler }

func (c driversCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.h.metrics.drivers
	ch <- c.h.metrics.instances
}

func (c driversCollector) Collect(ch chan<- prometheus.Metric) {
	m := c.h.metrics
	c.h.mu.Lock()
	counts := make(map[string]int, len(c.h.drivers))
	for name, rs := range c.h.drivers {
		counts[name] = len(rs)
	}
	c.h.mu.Unlock()
	ch <- prometheus.MustNewConstMetric(m.drivers, prometheus.GaugeValue, float64(len(counts)))
	for name, n := range counts {
		ch <- prometheus.MustNewConstMetric(m.instances, prometheus.GaugeValue, float64(n), name)
	}
}
