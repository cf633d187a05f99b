package main

import (
	"flag"
	"fmt"
	"log"
	"net"
	"os"
	"os/signal"
	"syscall"

	mockdriver "k8s.io/kubernetes/test/e2e/storage/drivers/csi-test/driver"
	mockservice "k8s.io/kubernetes/test/e2e/storage/drivers/csi-test/mock/service"
)

// csiMock serves the CSI mock driver of the Kubernetes e2e tests
// (k8s.io/kubernetes test/e2e/storage/drivers/csi-test: its mock service,
// Identity, Controller and Node, served by its own driver package, as
// test/e2e/storage/drivers/csi.go serves it embedded) on the unix socket
// --endpoint, until SIGTERM or SIGINT. Its node id is its driver name:
// mockservice.New sets it so, and nothing in its Config changes it.
func csiMock(args []string) error {
	fs := flag.NewFlagSet("csi-mock", flag.ExitOnError)
	endpoint := fs.String("endpoint", "", "the CSI socket to serve")
	var cfg mockservice.Config
	fs.StringVar(&cfg.DriverName, "name", mockservice.Name, "the driver's name, also its node id")
	fs.Int64Var(&cfg.AttachLimit, "attach-limit", 0, "the max volumes per node NodeGetInfo answers (0: none said)")
	fs.BoolVar(&cfg.EnableTopology, "enable-topology", false, "report the mock's fixed topology segment in NodeGetInfo")
	fs.BoolVar(&cfg.DisableAttach, "disable-attach", false, "no ControllerPublishVolume: stage and publish without a device in the publish context")
	fs.Parse(args)
	if *endpoint == "" {
		return fmt.Errorf("csi-mock: give --endpoint, the CSI socket to serve")
	}
	if err := os.Remove(*endpoint); err != nil && !os.IsNotExist(err) {
		return err
	}
	l, err := net.Listen("unix", *endpoint) // unlinked when the server closes it
	if err != nil {
		return err
	}
	s := mockservice.New(cfg)
	d := mockdriver.NewCSIDriver(&mockdriver.CSIDriverServers{Controller: s, Identity: s, Node: s})
	// A nil interceptor is the driver's own: it logs each call and checks
	// no secret, as no credentials are set.
	if err := d.Start(l, nil); err != nil {
		return err
	}
	log.Printf("Kubernetes e2e CSI mock driver %s on %s", cfg.DriverName, *endpoint)
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	<-sig
	d.Stop()
	return nil
}
