package main

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/plugd/plugd/bench/internal/managers"
	"google.golang.org/grpc"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
)

// fleet is the load generator: real plugins, each a gRPC server of the
// registration service on a unix socket of its own in one registry
// directory. It runs in the benchmark's process, not the manager's.
type fleet struct {
	dir string

	getInfos   atomic.Int64 // GetInfo calls received by plugins not yet told registered
	expired    atomic.Int64 // GetInfo calls whose deadline had passed, or that the caller cancelled, before the plugin answered
	rejections atomic.Int64 // notifications saying "not registered"

	mu      sync.Mutex
	plugins []*fakePlugin // every plugin started, to stop them all at the end
}

// counts is a snapshot of a fleet's counters, to tell what one phase added.
type counts struct{ getInfos, expired, rejections int64 }

func (f *fleet) counts() counts {
	return counts{f.getInfos.Load(), f.expired.Load(), f.rejections.Load()}
}

func (c counts) minus(d counts) counts {
	return counts{c.getInfos - d.getInfos, c.expired - d.expired, c.rejections - d.rejections}
}

// fakePlugin is one plugin. It listens on a dot-name, which both managers
// ignore, and place renames the socket into view, as plugd's plugin SDK does,
// so a manager never sees a socket that does not accept connections yet.
type fakePlugin struct {
	fleet *fleet
	name  string
	tmp   string // the dot-name it listens on until placed
	path  string // the socket's name once placed
	srv   *grpc.Server

	served     chan struct{} // closed when Serve returns
	closeOnce  sync.Once
	once       sync.Once
	registered chan struct{} // closed at the first "registered" notification
	at         time.Time     // when registered was closed; read after it is
}

// listen starts a plugin called name, listening but not yet visible.
func (f *fleet) listen(name string) (*fakePlugin, error) {
	p := &fakePlugin{
		fleet:      f,
		name:       name,
		tmp:        filepath.Join(f.dir, "."+name+".tmp"),
		path:       filepath.Join(f.dir, name+".sock"),
		srv:        grpc.NewServer(),
		served:     make(chan struct{}),
		registered: make(chan struct{}),
	}
	lis, err := net.Listen("unix", p.tmp)
	if err != nil {
		return nil, fmt.Errorf("plugin %s: %w", name, err)
	}
	// After the rename the name the listener was bound to is gone; close
	// removes the socket by its final name.
	lis.(*net.UnixListener).SetUnlinkOnClose(false)
	registerapi.RegisterRegistrationServer(p.srv, registration{p: p})
	go func() {
		defer close(p.served)
		p.srv.Serve(lis) // returns when close stops the server
	}()
	f.mu.Lock()
	f.plugins = append(f.plugins, p)
	f.mu.Unlock()
	return p, nil
}

// place moves the socket into view and returns when it is there.
func (p *fakePlugin) place() (time.Time, error) {
	if err := os.Rename(p.tmp, p.path); err != nil {
		return time.Time{}, fmt.Errorf("plugin %s: placing socket: %w", p.name, err)
	}
	return time.Now(), nil
}

// close removes the socket, as a plugin that exits cleanly does, and stops
// serving. It may be called more than once: only the first call removes the
// socket, which by a later call may be a successor's at the same path.
func (p *fakePlugin) close() {
	p.closeOnce.Do(func() {
		for _, path := range []string{p.path, p.tmp} {
			if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
				fmt.Fprintf(os.Stderr, "bench: removing %s: %v\n", path, err)
			}
		}
		p.srv.Stop()
		<-p.served
	})
}

// isRegistered reports whether the plugin was told it is registered.
func (p *fakePlugin) isRegistered() bool {
	select {
	case <-p.registered:
		return true
	default:
		return false
	}
}

// close stops every plugin the fleet started.
func (f *fleet) close() {
	f.mu.Lock()
	plugins := f.plugins
	f.plugins = nil
	f.mu.Unlock()
	for _, p := range plugins {
		p.close()
	}
}

// registration is the service a plugin serves.
type registration struct {
	registerapi.UnimplementedRegistrationServer
	p *fakePlugin
}

func (r registration) GetInfo(ctx context.Context, _ *registerapi.InfoRequest) (*registerapi.PluginInfo, error) {
	f := r.p.fleet
	// Calls after registration are liveness probes, not registration work.
	if !r.p.isRegistered() {
		f.getInfos.Add(1)
	}
	// A manager that is too slow to take our answer within its own deadline
	// (the kubelet gives GetInfo 1s) has already given up by now.
	if ctx.Err() != nil {
		f.expired.Add(1)
	}
	return &registerapi.PluginInfo{
		Type:              managers.PluginType,
		Name:              r.p.name,
		SupportedVersions: []string{"1.0.0"},
	}, nil
}

func (r registration) NotifyRegistrationStatus(_ context.Context, st *registerapi.RegistrationStatus) (*registerapi.RegistrationStatusResponse, error) {
	if !st.PluginRegistered {
		r.p.fleet.rejections.Add(1)
		return &registerapi.RegistrationStatusResponse{}, nil
	}
	r.p.once.Do(func() {
		r.p.at = time.Now()
		close(r.p.registered)
	})
	return &registerapi.RegistrationStatusResponse{}, nil
}
