// Package managers is what the two manager binaries under test share: the
// interface both managers are run through, and the process around them.
//
// Each manager is a binary of its own, so that neither carries the other's
// code: linking k8s.io/kubernetes alone adds some 20 MiB of resident memory
// (its packages' init), which would be charged to plugd if both ran from one
// binary.
package managers

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"runtime"
	"runtime/pprof"
	"syscall"
)

// PluginType is the type every benchmark plugin declares, and the one each
// manager has an accept-everything handler for.
const PluginType = "CSIPlugin"

// Manager is a plugin manager under test. It is an interface because there
// are two: plugd's and the kubelet's.
type Manager interface {
	// Run registers every plugin of PluginType whose socket appears in dir,
	// accepting all of them, until ctx is done.
	Run(ctx context.Context, dir string) error
}

// Main is the whole of a manager binary: it runs m on the directory given
// by -dir until SIGTERM or SIGINT, and exits non-zero if m fails. Flags of
// the binary's own must be defined before it is called.
func Main(m Manager) {
	dir := flag.String("dir", "", "registry directory to watch (required)")
	profile := flag.String("cpuprofile", "", "write a CPU profile of the whole run to this file")
	memProfile := flag.String("memprofile", "", "write a heap profile to this file at the end of the run")
	flag.Parse()
	if *dir == "" || flag.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "usage: %s -dir DIR [flags]\n", os.Args[0])
		flag.PrintDefaults()
		os.Exit(2)
	}
	if err := run(m, *dir, *profile, *memProfile); err != nil {
		fmt.Fprintln(os.Stderr, "manager:", err)
		os.Exit(1)
	}
}

func run(m Manager, dir, profile, memProfile string) (err error) {
	if profile != "" {
		f, err := os.Create(profile)
		if err != nil {
			return err
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			f.Close()
			return err
		}
		defer func() {
			pprof.StopCPUProfile()
			err = errors.Join(err, f.Close())
		}()
	}
	signalled, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	ctx, cancel := context.WithCancel(context.Background())
	var heapErr error
	go func() {
		<-signalled.Done()
		if memProfile != "" {
			// Before the manager lets its plugins go.
			heapErr = writeHeapProfile(memProfile)
		}
		cancel()
	}()
	err = m.Run(ctx, dir)
	<-ctx.Done()
	return errors.Join(err, heapErr)
}

// writeHeapProfile writes what is in use when the run is asked to end, with
// every plugin still registered (the benchmark stops the manager before
// its plugins).
func writeHeapProfile(path string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	runtime.GC() // the profile shows the heap as of the last collection
	return errors.Join(pprof.WriteHeapProfile(f), f.Close())
}
