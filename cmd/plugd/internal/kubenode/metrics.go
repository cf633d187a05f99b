package kubenode

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/plugd/plugd/api"
)

// metrics are the Node's Prometheus metrics:
//
//	plugd_kubelet_registered{type,name}                 1 if the kubelet has the plugin, 0 if not; absent while Unknown
//	plugd_expected_plugin_ready{type,name,condition}    1 while an expected plugin's condition is True
//	plugd_kubernetes_api_healthy                        1 while every read and write of the node's objects works
//	plugd_kubernetes_api_errors_total{operation,reason} failed writes
//	plugd_kubernetes_writes_total{operation}            writes: patch_node_status, remove_taint, event
//
// The gauges are read from the Node at scrape time.
type metrics struct {
	writes    *prometheus.CounterVec
	apiErrors *prometheus.CounterVec
}

var (
	registeredDesc = prometheus.NewDesc("plugd_kubelet_registered",
		"Whether the kubelet has registered the plugin, as the Kubernetes API shows it (1) or not (0); absent while the API cannot tell.", []string{"type", "name"}, nil)
	readyDesc = prometheus.NewDesc("plugd_expected_plugin_ready",
		"Whether an expected plugin is ready: its Node condition is True.", []string{"type", "name", "condition"}, nil)
	healthyDesc = prometheus.NewDesc("plugd_kubernetes_api_healthy",
		"1 while every read and write plugd makes of its node's objects works, 0 while one fails.", nil, nil)
)

func newMetrics(n *Node, reg prometheus.Registerer) *metrics {
	m := &metrics{
		writes: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "plugd_kubernetes_writes_total",
			Help: "Writes plugd made to the Kubernetes API, by operation (patch_node_status, remove_taint, event)."}, []string{"operation"}),
		apiErrors: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "plugd_kubernetes_api_errors_total",
			Help: "Writes to the Kubernetes API that failed, by operation and reason (APIUnavailable, Forbidden, Unauthorized)."}, []string{"operation", "reason"}),
	}
	if reg != nil {
		reg.MustRegister(m.writes, m.apiErrors, collector{n})
	}
	return m
}

// collector reads the Node's views and readiness at scrape time.
type collector struct{ n *Node }

func (c collector) Describe(ch chan<- *prometheus.Desc) {
	ch <- registeredDesc
	ch <- readyDesc
	ch <- healthyDesc
}

func (c collector) Collect(ch chan<- prometheus.Metric) {
	n := c.n
	healthy := 1.0
	if len(n.Problems()) > 0 {
		healthy = 0
	}
	ch <- prometheus.MustNewConstMetric(healthyDesc, prometheus.GaugeValue, healthy)
	n.mu.Lock()
	defer n.mu.Unlock()
	for k, v := range n.views {
		switch v.State {
		case api.KubeletRegistered:
			ch <- prometheus.MustNewConstMetric(registeredDesc, prometheus.GaugeValue, 1, k.typ, k.name)
		case api.KubeletNotRegistered:
			ch <- prometheus.MustNewConstMetric(registeredDesc, prometheus.GaugeValue, 0, k.typ, k.name)
		}
	}
	for _, e := range n.cfg.Expect {
		if ready, ok := n.ready[e.Condition]; ok {
			v := 0.0
			if ready {
				v = 1
			}
			ch <- prometheus.MustNewConstMetric(readyDesc, prometheus.GaugeValue, v, e.Type, e.Name, e.Condition)
		}
	}
}
