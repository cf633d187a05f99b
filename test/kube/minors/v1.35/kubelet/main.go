// Command kubelet is the kubelet of k8s.io/kubernetes v1.35.4, built from the Go
// module proxy so that the tests of this module can run a real kubelet
// (in a private mount namespace, on loopback) beside plugd.
package main

import (
	"context"
	"os"

	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/metrics/prometheus/clientgo" // the kubelet's client metrics, as its own main registers them
	_ "k8s.io/component-base/metrics/prometheus/version"
	"k8s.io/kubernetes/cmd/kubelet/app"
)

func main() {
	os.Exit(cli.Run(app.NewKubeletCommand(context.Background())))
}
