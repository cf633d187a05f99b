// Package backoff is the delay of the retries plugd paces itself: the
// manager's registration retries and its redials of a registration socket
// that hung up; in the handlers a device plugin's stream redials, a DRA
// driver's health stream reopenings and an endpoint watch's reconnections
// (handlers/internal/endpointwatch); and on Kubernetes the node agent's
// writes to the API server (cmd/plugd/internal/kubenode). The delay starts
// at an initial value and doubles after each failure up to a cap
// (k8s.io/apimachinery's wait.Backoff does the stepping); jitter spreads
// each delay around its step so that plugins that failed together do not
// retry together, and never past the cap.
//
// A retry that a library makes on its own is that library's to pace: the
// DRA handler's gRPC connection to a driver reconnects by grpc-go's backoff
// (a grpc/backoff.Config in handlers/dra's connect), since grpc-go owns the
// connection's reconnections: plugd only sets their parameters. And two
// retries keep a delay of their own: the node agent's held connection to
// the kubelet (kubenode/kubeletstate's watch.go) redials after a doubling
// delay whose cap depends on why the last dial failed (a kubelet that is
// not running, restarting, is tried again within 2 s), which a Backoff's
// one cap does not say; and its write back of an overwritten condition
// (kubenode's decide.go) is spread by a draw made before decide, which is
// pure, where a Backoff draws its own.
package backoff

import (
	"math"
	"math/rand/v2"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
)

// Backoff is the delay before each next attempt. The zero value waits no
// time; make one with New. It is not safe for concurrent use: each retrying
// thing (a socket, a stream) has its own.
type Backoff struct {
	initial, max time.Duration
	jitter       float64
	steps        wait.Backoff
}

// New returns a Backoff whose first delay is initial, doubling after each
// attempt up to limit (initial if limit is smaller). With jitter j (0 ≤ j < 1),
// each delay is its step times a random factor in [1-j, 1+j], and at most
// limit.
func New(initial, limit time.Duration, jitter float64) Backoff {
	b := Backoff{initial: initial, max: max(initial, limit), jitter: jitter}
	b.Reset()
	return b
}

// Next returns the delay to wait now, and moves on to the next step.
func (b *Backoff) Next() time.Duration {
	d := b.steps.Step()
	if b.jitter > 0 {
		d = time.Duration(float64(d) * (1 - b.jitter + 2*b.jitter*rand.Float64()))
	}
	return min(d, b.max)
}

// Reset starts again from the initial delay: the thing retried came back.
func (b *Backoff) Reset() {
	b.steps = wait.Backoff{Duration: b.initial, Factor: 2, Steps: math.MaxInt32, Cap: b.max}
}

// Max is the longest delay Next returns.
func (b *Backoff) Max() time.Duration { return b.max }
