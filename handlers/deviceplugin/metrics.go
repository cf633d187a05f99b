package deviceplugin

import (
	"github.com/prometheus/client_golang/prometheus"
	api "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// The handler's series, read from its state at scrape time. A resource label
// takes only the names of resources that are registered (or within the grace
// period after their last instance went) and not dropped: a plugin chooses its
// name, and must not leave series behind once it is gone.
var (
	devicesDesc = prometheus.NewDesc("plugd_deviceplugin_devices",
		"Devices of each registered device plugin resource, by health.",
		[]string{"resource", "health"}, nil)
	connectedDesc = prometheus.NewDesc("plugd_deviceplugin_connected",
		"1 while the ListAndWatch stream of the instance serving the resource is up, 0 while it is redialed.",
		[]string{"resource"}, nil)
	reconnectsDesc = prometheus.NewDesc("plugd_deviceplugin_stream_reconnects_total",
		"ListAndWatch streams of the resource's instances re-established after a break, since it was registered.",
		[]string{"resource"}, nil)
)

type collector struct{ h *Handler }

func (collector) Describe(ch chan<- *prometheus.Desc) {
	ch <- devicesDesc
	ch <- connectedDesc
	ch <- reconnectsDesc
}

func (c collector) Collect(ch chan<- prometheus.Metric) {
	// Build the series under the lock, send them without it: the registry
	// reads the channel at its own pace.
	var ms []prometheus.Metric
	c.h.mu.Lock()
	for _, r := range c.h.resources {
		s := r.serving()
		if s.dropped {
			continue
		}
		healthy := 0
		for _, d := range s.devices {
			if d.Health == api.Healthy {
				healthy++
			}
		}
		connected := 0.0
		if s.connected {
			connected = 1
		}
		ms = append(ms,
			prometheus.MustNewConstMetric(devicesDesc, prometheus.GaugeValue, float64(healthy), r.name, api.Healthy),
			prometheus.MustNewConstMetric(devicesDesc, prometheus.GaugeValue, float64(len(s.devices)-healthy), r.name, api.Unhealthy),
			prometheus.MustNewConstMetric(connectedDesc, prometheus.GaugeValue, connected, r.name),
			prometheus.MustNewConstMetric(reconnectsDesc, prometheus.CounterValue, float64(r.reconnects), r.name),
		)
	}
	c.h.mu.Unlock()
	for _, m := range ms {
		ch <- m
	}
}
