// Command kube-apiserver is the Kubernetes API server of k8s.io/kubernetes,
// built from the Go module proxy so that the tests of this module can run a
// real control plane on loopback.
package main

import (
	"os"

	"k8s.io/component-base/cli"
	"k8s.io/kubernetes/cmd/kube-apiserver/app"
)

func main() {
	os.Exit(cli.Run(app.NewAPIServerCommand()))
}
