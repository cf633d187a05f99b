package kubenode

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/plugd/plugd/api"
)

// metrics are the Node's Prometheus metrics:
//
//	plugd_kubelet_registered{type,name}                 1 if the running kubelet holds the plugin, 0 if not; absent while Unknown
//	plugd_expected_plugin_ready{type,name,condition}    1 while an expected plugin's condition is True (type anyOf, name the resource's, for an entry with anyOf)
//	plugd_kubernetes_api_healthy                        1 while every read and write of the node's objects works
//	plugd_kubernetes_api_errors_total{operation,reason} failed writes
//	plugd_kubernetes_writes_total{operation}            writes: patch_node_status, remove_taint, add_taint, event
//	plugd_kubelet_live                                  1 while plugd reads the kubelet's own state, 0 while it infers
//	plugd_kubelet_reads_total{what,result}              reads of the kubelet: metrics, pod_resources; ok, error
//	plugd_kubelet_read_bytes_total                      bytes of its /metrics, as they came (gzip)
//	plugd_kubelet_registration_seconds{type}            socket made -> the running kubelet registered it
//	plugd_kubelet_registration_after_start_seconds{type} kubelet started -> it registered a socket that was there before
//	plugd_expected_plugin_not_ready_seconds{type}       how long a condition was not True before it turned True
//	plugd_node_condition_overwritten_total{condition}   plugd's condition, seen on the Node, overwritten by another writer
//	plugd_taint_writes_total{taint,reason}              taints removed (TaintRemoved, TaintReadded) and put back (TaintRestored)
//	plugd_taint_removal_seconds{taint}                  the kubelet held every plugin a taint waits for -> plugd removed it
//	plugd_dra_pool_devices{driver,pool,state}           a DRA driver's devices on this node: usable, tainted, unhealthy (complete pools)
//	plugd_dra_pool_complete{driver,pool}                1 while the pool's newest generation has all its slices
//
// The gauges are read from the Node at scrape time. The registration
// times are as plugd's reads of the kubelet show them: while a socket
// waits for the kubelet, it is read every 250ms.
type metrics struct {
	writes       *prometheus.CounterVec
	apiErrors    *prometheus.CounterVec
	kubeletReads *prometheus.CounterVec
	kubeletBytes prometheus.Counter
	registration *prometheus.HistogramVec
	afterStart   *prometheus.HistogramVec
	notReady     *prometheus.HistogramVec
	overwritten  *prometheus.CounterVec
	taintWrites  *prometheus.CounterVec
	taintRemoval *prometheus.HistogramVec
}

var (
	registeredDesc = prometheus.NewDesc("plugd_kubelet_registered",
		"Whether the running kubelet has registered the plugin (1) or not (0): its plugin manager holds a socket of it, as plugd reads the kubelet; inferred from API objects (CSINode, the Node, ResourceSlices) while plugd cannot read the kubelet (plugd_kubelet_live 0); absent while neither tells.", []string{"type", "name"}, nil)
	readyDesc = prometheus.NewDesc("plugd_expected_plugin_ready",
		"Whether an expected plugin is ready: its Node condition is True.", []string{"type", "name", "condition"}, nil)
	healthyDesc = prometheus.NewDesc("plugd_kubernetes_api_healthy",
		"1 while every read and write plugd makes of its node's objects works, 0 while one fails.", nil, nil)
	poolDevicesDesc = prometheus.NewDesc("plugd_dra_pool_devices",
		"A DRA driver's devices in its complete pools on this node, at their newest generation, by state: usable, tainted (NoSchedule or NoExecute, in the slice or by a DeviceTaintRule), unhealthy (by the driver's DRAResourceHealth stream). The first 64 pools of a driver.", []string{"driver", "pool", "state"}, nil)
	poolCompleteDesc = prometheus.NewDesc("plugd_dra_pool_complete",
		"1 while a DRA driver's pool on this node has, at its newest generation, the ResourceSlices its resourceSliceCount says; 0 while it is incomplete (a republish, or a driver that failed to publish). The first 64 pools of a driver.", []string{"driver", "pool"}, nil)
	kubeletLiveDesc = prometheus.NewDesc("plugd_kubelet_live",
		"1 while plugd reads the kubelet's own state, 0 while it cannot and infers what the kubelet registered from API objects.", nil, nil)
)

// taintRemovalBuckets span a removal within one evaluation of plugd (the
// goal is under 50ms) to one kept back 10 minutes (a CSI driver's
// attach limit that CSINode lacks, a plugd that could not write).
var taintRemovalBuckets = []float64{0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600}

// registrationBuckets span the kubelet's one-second loop and its backoff.
var registrationBuckets = []float64{0.1, 0.25, 0.5, 1, 1.5, 2, 3, 5, 10, 30, 60, 120, 300}

func newMetrics(n *Node, reg prometheus.Registerer) *metrics {
	m := &metrics{
		writes: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "plugd_kubernetes_writes_total",
			Help: "Writes plugd made to the Kubernetes API, by operation (patch_node_status, remove_taint, add_taint, event)."}, []string{"operation"}),
		apiErrors: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "plugd_kubernetes_api_errors_total",
			Help: "Writes to the Kubernetes API that failed, by operation and reason (APIUnavailable, Forbidden, Unauthorized)."}, []string{"operation", "reason"}),
		kubeletReads: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "plugd_kubelet_reads_total",
			Help: "Reads of the kubelet's own state, by what was read (metrics, pod_resources) and result (ok, error)."}, []string{"what", "result"}),
		kubeletBytes: prometheus.NewCounter(prometheus.CounterOpts{Name: "plugd_kubelet_read_bytes_total",
			Help: "Bytes of the kubelet's /metrics plugd read, as they came over the wire."}),
		registration: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "plugd_kubelet_registration_seconds",
			Help:    "Time from a registration socket's creation to the running kubelet having registered it, by plugin type.",
			Buckets: registrationBuckets}, []string{"type"}),
		afterStart: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "plugd_kubelet_registration_after_start_seconds",
			Help:    "Time from the kubelet's start to it having registered a socket that was there before it started, by plugin type.",
			Buckets: registrationBuckets}, []string{"type"}),
		notReady: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "plugd_expected_plugin_not_ready_seconds",
			Help:    "Time an expected plugin's condition was not True before it turned True, by plugin type.",
			Buckets: registrationBuckets}, []string{"type"}),
		overwritten: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "plugd_node_condition_overwritten_total",
			Help: "Times plugd's condition, once seen on the Node as plugd wrote it, was found overwritten by another writer while plugd's verdict stayed the same, by condition type."}, []string{"condition"}),
		taintWrites: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "plugd_taint_writes_total",
			Help: "Startup taints plugd removed or put back, by taint (KEY:EFFECT) and reason: TaintRemoved (its plugins ready), TaintReadded (put back by another writer within the startup window, removed again), TaintRestored (retaint: a plugin that was ready is not)."}, []string{"taint", "reason"}),
		taintRemoval: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "plugd_taint_removal_seconds",
			Help: "Time from the first read of the kubelet that showed it held every plugin a startup taint waits for to plugd's removal of the taint (TaintRemoved), by taint (KEY:EFFECT). " +
				"Observed only while plugd reads the kubelet's own state.",
			Buckets: taintRemovalBuckets}, []string{"taint"}),
	}
	if reg != nil {
		reg.MustRegister(m.writes, m.apiErrors, m.kubeletReads, m.kubeletBytes, m.registration, m.afterStart, m.notReady, m.overwritten, m.taintWrites, m.taintRemoval, collector{n})
	}
	return m
}

// observe observes o in the histogram of its kind.
func (m *metrics) observe(o observation) {
	h := m.notReady
	switch o.kind {
	case observedRegistration:
		h = m.registration
	case observedAfterStart:
		h = m.afterStart
	}
	h.WithLabelValues(o.typ).Observe(o.seconds)
}

// collector reads the Node's views and readiness at scrape time.
type collector struct{ n *Node }

func (c collector) Describe(ch chan<- *prometheus.Desc) {
	ch <- registeredDesc
	ch <- readyDesc
	ch <- healthyDesc
	ch <- kubeletLiveDesc
	ch <- poolDevicesDesc
	ch <- poolCompleteDesc
}

// maxPoolSeries bounds the pools of a driver its metrics show: anyone who
// may create ResourceSlices for the node can make thousands.
const maxPoolSeries = 64

func (c collector) Collect(ch chan<- prometheus.Metric) {
	n := c.n
	healthy := 1.0
	if len(n.Problems()) > 0 {
		healthy = 0
	}
	ch <- prometheus.MustNewConstMetric(healthyDesc, prometheus.GaugeValue, healthy)
	live := 0.0
	if n.kubelet != nil && n.Kubelet().Live {
		live = 1
	}
	ch <- prometheus.MustNewConstMetric(kubeletLiveDesc, prometheus.GaugeValue, live)
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
	for driver, pools := range n.pools {
		for _, p := range pools {
			complete := 0.0
			if p.complete() {
				complete = 1
			}
			ch <- prometheus.MustNewConstMetric(poolCompleteDesc, prometheus.GaugeValue, complete, driver, p.name)
			for state, count := range map[string]int{"usable": p.usable, "tainted": p.tainted, "unhealthy": p.unhealthy} {
				ch <- prometheus.MustNewConstMetric(poolDevicesDesc, prometheus.GaugeValue, float64(count), driver, p.name, state)
			}
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
