//go:build linux

// Package kube tests plugd against a real Kubernetes control plane: etcd
// and kube-apiserver from k8s.io/kubernetes, built from source and started
// on loopback by TestMain, with RBAC on; and, as root, against real
// kubelets (package kubelet: in a mount namespace of their own, with
// k8s.io/cri-client's fake runtime). Where no kubelet runs, the test plays
// the kubelet's API side (CSINode drivers, Node capacity and allocatable).
// Real plugins serve in registry directories, and plugd runs as a process
// with a ServiceAccount token bound to the DaemonSet's ClusterRole.
//
// PLUGD_KUBELET_MINOR (1.35, 1.36; unset: 1.37, this module's) picks the
// kubelet the tests run: an older minor is built from its own module in
// minors/ (minors/run runs the truth scenarios against each).
//
// go test -short skips it all, and the kubelet's tests skip where not run
// as root; PLUGD_KUBE=require (as .ci/run sets) makes either a failure. The
// first run builds kube-apiserver and the
// kubelet, which takes minutes; later runs take them from the Go build
// cache.
package kube

import (
	"context"
	"flag"
	"fmt"
	"os"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes"

	"github.com/plugd/plugd/test/kube/controlplane"
)

var (
	cp    *controlplane.ControlPlane
	dirs  controlplane.Dirs
	admin kubernetes.Interface
	// kubeletBin is the kubelet the tests run: of the minor
	// PLUGD_KUBELET_MINOR names, the newest if unset.
	kubeletBin controlplane.Kubelet
)

func TestMain(m *testing.M) {
	flag.Parse()
	if testing.Short() {
		if requireAll() {
			fmt.Fprintln(os.Stderr, "test/kube: -short would skip every test, and PLUGD_KUBE=require says none may be")
			os.Exit(1)
		}
		fmt.Println("test/kube: skipped (-short): these tests build and run a real kube-apiserver and etcd")
		os.Exit(0)
	}
	os.Exit(run(m))
}

func run(m *testing.M) int {
	ctx := context.Background()
	var err error
	if dirs, err = controlplane.Locate(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	start := time.Now()
	if err := controlplane.Build(dirs, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if kubeletBin, err = controlplane.BuildKubelet(dirs, os.Getenv(controlplane.MinorEnv), os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Fprintf(os.Stderr, "binaries in %s, ready after %s; the kubelet: %s, of k8s.io/kubernetes %s\n",
		dirs.Bin, time.Since(start).Round(time.Second), kubeletBin.Path, kubeletBin.Version)
	dir, err := os.MkdirTemp("", "kube")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	if cp, err = controlplane.Start(ctx, dirs.Bin, dir); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer cp.Stop()
	fmt.Fprintf(os.Stderr, "kube-apiserver ready in %s at %s\n", cp.StartupTime.Round(time.Millisecond), cp.URL)
	if admin, err = kubernetes.NewForConfig(cp.Config(cp.AdminToken)); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return m.Run()
}
