package kubenode

import (
	"time"

	"github.com/plugd/plugd/cmd/plugd/internal/kubenode/kubeletstate"
)

// The timing of the node agent, in one table: each constant, the
// behaviour of the kubelet (or of the API server) it assumes, and the
// test that pins it. The reads of the kubelet themselves (their resync,
// gap, redials, retries and bounds) are kubeletstate's table
// (kubeletstate/timing.go); this one says when kubenode evaluates, asks
// for reads, writes and tells.
const (
	// localResync: the plugins are compared with the kubelet's and the
	// API's view this often when nothing tells of a change (a device
	// plugin's health changes in its handler's details, without an
	// event): local work only, no request. TestRunPacing.
	localResync = 5 * time.Second
	// csiNodeWait: the kubelet writes a CSI driver into CSINode as it
	// registers it (one API call, retried for a few seconds); a socket it
	// holds whose driver CSINode has not listed for this long is a
	// registration that failed, which a kubelet before v1.36 keeps in its
	// actual state and never retries (kubernetes/kubernetes#133335).
	// TestDecide ("the kubelet holds a CSI socket CSINode never lists").
	csiNodeWait = 10 * time.Second
	// minEvalGap spaces out evaluations during a burst of changes: at
	// most 40 a second. Short, because the kubelet's registration of a
	// CSI driver is such a burst: it writes the Node (the driver's node
	// ID annotation) and then CSINode, milliseconds apart, and the
	// second, the one that makes the driver ready, waits out the gap
	// before its taint goes (at 100 ms, the kubelet's CSINode write to the
	// taint's removal took 100 ms every time; test/kube TestTaintFigures).
	// TestRunPacing.
	minEvalGap = 25 * time.Millisecond

	// While the kubelet and the sockets disagree (unsettled), the kubelet
	// is read every unsettledFast for fastFor, then every unsettledSlow
	// until slowFor, then only on change and resync: its plugin manager's
	// reconciler runs every second, and registers or deregisters a socket
	// within a pass or two; a registration it refused is retried with an
	// exponential backoff (from 500ms, doubling to about 2 minutes).
	// TestDecide ("the socket answers, the kubelet has not taken it up
	// yet", "registrar SIGKILL", "the kubelet restarted, not registered
	// yet").
	unsettledFast = 250 * time.Millisecond
	fastFor       = 5 * time.Second
	unsettledSlow = time.Second
	slowFor       = time.Minute
	// devicesPoll: pod-resources is asked this often while an expected
	// device plugin waits for healthy devices: cheap, and local; the
	// kubelet's device manager takes a plugin's ListAndWatch update at
	// once. TestDecide ("device plugin health: too few healthy devices"),
	// kubeletstate's TestWatchDevicesPoll.
	devicesPoll = time.Second
	// kubeletSettle is kubeletstate.Settle: how long after a socket is
	// re-created the kubelet's registration at its path may still be the
	// old socket's (one pass of its reconciler, every second).
	// TestRegistrarRestartWritesTwice, TestDecide ("registrar started
	// again").
	kubeletSettle = kubeletstate.Settle
	// staleSettle: a CSINode entry the running kubelet does not hold
	// counts as stale once the kubelet has run this long, long enough to
	// register what serves (a pass a second); so too a /metrics without
	// the plugin manager's gauge says it was renamed (metricMissing).
	// TestKubeletWithoutPlugins ("a kubelet just started").
	staleSettle = 10 * time.Second

	// A change of a condition's reason or message that keeps its status
	// is written once it has held for coalesce (at most maxCoalesce after
	// the first such change): a registrar restart goes through several
	// reasons for False within a second, and writes False once and True
	// once. A change of status is written at once. coalesce outlasts
	// kubeletSettle, the longest a re-created socket waits to count as
	// registered. TestRegistrarRestartWritesTwice, TestOddNodeIDWrittenOnce.
	coalesce    = 3 * time.Second
	maxCoalesce = 10 * time.Second
	// switchGrace is how long an anyOf condition stays True after its
	// holder stopped while no other alternative is ready (anyof.go): a
	// move from a device plugin to a DRA driver that stops the old before
	// the new one has registered (its pod started, the kubelet's one-second
	// loop, plugd's read of the kubelet) is not a False. A resource that
	// is really gone says False this much later. TestDecide ("anyOf: ...").
	switchGrace = 10 * time.Second
	// defaultHeartbeat is HeartbeatInterval's default: the kubelet's own
	// nodeStatusReportFrequency (5 minutes), so that plugd's conditions
	// age as the kubelet's do. TestHeartbeat.
	defaultHeartbeat = 5 * time.Minute
	// defaultGrace is DisagreementGrace's default: the kubelet and a
	// socket may disagree this long (its backoff after a refusal reaches
	// tens of seconds) before an event says so. TestDecide ("the kubelet
	// has seen the socket and refuses it").
	defaultGrace = time.Minute

	// republishGrace: a DRA driver whose condition is True and one of
	// whose pools turns incomplete (a republish: the generation moves, and
	// the driver's ResourceSlice controller rewrites the slices one by
	// one) keeps its condition this long before it says PoolIncomplete.
	// The controller writes with its client's rate limit (client-go's
	// default: 5 a second after a burst of 10), so 30 s covers a pool of
	// some 150 slices; a node-local pool has a few. It is also the
	// kubelet's own grace before it wipes the slices of a driver that lost
	// its connection. TestDecide ("DRA republish: ..."), test/kube's
	// TestDRALayers.
	republishGrace = 30 * time.Second

	// Each write to the API server is bounded by writeTimeout; failed
	// writes are retried after a backoff from writeBackoffMin, doubling to
	// writeBackoffMax, each delay spread by writeJitter around its step,
	// so that a cluster's nodes do not retry in step after an outage of
	// the API server. TestWriteBackoff.
	writeTimeout    = 10 * time.Second
	writeBackoffMin = time.Second
	writeBackoffMax = 2 * time.Minute
	writeJitter     = 0.5
	// listTimeout bounds each list of the informers (watches are bounded
	// by client-go); a list of one node's objects is small. A bound, no
	// kubelet behaviour: no test pins it.
	listTimeout = 30 * time.Second

	// Overwrites (decide.go): after fightUndos overwrites of a condition
	// by another writer within fightWindow, plugd writes it back only
	// after a delay doubling from fightDelayMin to fightDelayMax; a
	// condition left as plugd wrote it for fightWindow ends the fight.
	// A caretaker that judges plugd's heartbeat on a skewed clock
	// overwrote it 2.7 times a second (issue 33). TestOverwrittenBacksOff,
	// TestDecide ("overwrite fight: ...").
	fightUndos    = 3
	fightWindow   = 10 * time.Minute
	fightDelayMin = 10 * time.Second
	fightDelayMax = 5 * time.Minute
)
