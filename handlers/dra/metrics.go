package dra

import (
	"github.com/prometheus/client_golang/prometheus"
)

// collector exports the handler's state, read from a snapshot at scrape time
// so that registration never touches a metric. No series is labelled by
// driver name: plugins choose their names, and must not be able to create
// series at will.
type collector struct {
	h                *Handler
	instances        *prometheus.Desc
	drivers          *prometheus.Desc
	driversAvailable *prometheus.Desc
	devices          *prometheus.Desc
}

func newCollector(h *Handler) *collector {
	return &collector{
		h: h,
		instances: prometheus.NewDesc("plugd_dra_instances",
			"Registered DRA driver instances, by the state of their connection.",
			[]string{"state"}, nil),
		drivers: prometheus.NewDesc("plugd_dra_drivers",
			"DRA drivers known, available or not.", nil, nil),
		driversAvailable: prometheus.NewDesc("plugd_dra_drivers_available",
			"DRA drivers with a connected instance, or within the grace period after losing the last one.", nil, nil),
		devices: prometheus.NewDesc("plugd_dra_devices",
			"Devices whose health DRA drivers report, by health.",
			[]string{"health"}, nil),
	}
}

func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.instances
	ch <- c.drivers
	ch <- c.driversAvailable
	ch <- c.devices
}

func (c *collector) Collect(ch chan<- prometheus.Metric) {
	var connected, disconnected, available int
	devices := map[Health]int{Healthy: 0, Unhealthy: 0, Unknown: 0}
	drivers := c.h.Drivers()
	for _, d := range drivers {
		if d.Available {
			available++
		}
		for _, in := range d.Instances {
			if in.Connected {
				connected++
			} else {
				disconnected++
			}
		}
		for _, dev := range d.Devices {
			devices[dev.Health]++
		}
	}
	ch <- prometheus.MustNewConstMetric(c.instances, prometheus.GaugeValue, float64(connected), "connected")
	ch <- prometheus.MustNewConstMetric(c.instances, prometheus.GaugeValue, float64(disconnected), "disconnected")
	ch <- prometheus.MustNewConstMetric(c.drivers, prometheus.GaugeValue, float64(len(drivers)))
	ch <- prometheus.MustNewConstMetric(c.driversAvailable, prometheus.GaugeValue, float64(available))
	for health, n := range devices {
		ch <- prometheus.MustNewConstMetric(c.devices, prometheus.GaugeValue, float64(n), string(health))
	}
}
