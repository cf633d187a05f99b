package kubeletstate

import "time"

// The timing of the reads of the kubelet, each with the kubelet behaviour
// it assumes and the test that pins it. Reads follow change: kubenode asks
// for them (Want) while the kubelet and the sockets disagree, and every
// change of the node's API objects asks for one (Request); otherwise the
// kubelet is read every Config.Resync, and the held connection says at
// once when its process goes. kubenode's timing.go has the rest of the
// table, the pacing of those wishes.
const (
	// DefaultResync is Config.Resync's default: a quiet node's kubelet is
	// read this often. TestWatchDue ("resync", with a Resync of its own).
	DefaultResync = 5 * time.Minute
	// minReadGap spaces out the reads a burst of changes asks for.
	// TestWatchRun (a request read once the gap has passed).
	minReadGap = 100 * time.Millisecond
	// Settle is how long after a socket is re-created the kubelet's
	// registration at its path may still be the old socket's: its plugin
	// manager's reconciler runs every second and registers a new socket
	// within one pass. A registration seen to start after the socket was
	// made counts at once. A registration the kubelet drops to register
	// the path again counts for as long (Evidence.Reregistering).
	// TestCredited, TestReregistering; kubenode's
	// TestRegistrarRestartWritesTwice, TestRefusedRegistrationRetried, and
	// TestDecide's "the kubelet drops the path it registered" cases.
	Settle = 2 * time.Second
	// Redials of the held connection: after a refused one (the kubelet is
	// restarting: systemd's RestartSec is 10s) from holdRetryMin up to
	// holdRetryDown; after any other failure (TLS, no route) up to
	// holdRetryMax. TestWatchHoldRedials.
	holdRetryMin  = 250 * time.Millisecond
	holdRetryDown = 2 * time.Second
	holdRetryMax  = time.Minute
	// A read cut off mid-way is tried again after cutRetry, up to maxCuts
	// times, before it counts: a kubelet going away resets its
	// connections a moment before its port refuses. TestWatchCutOff.
	cutRetry = 100 * time.Millisecond
	maxCuts  = 5
	// timeout bounds each read and dial of the kubelet; keepAlive is the
	// held connection's TCP keep-alive: a kubelet's host gone without a
	// FIN is found within it. TestWatchNoAnswer (with a shorter timeout:
	// the reason and message, not the bound).
	timeout   = 10 * time.Second
	keepAlive = 30 * time.Second
)
