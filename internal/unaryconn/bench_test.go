package unaryconn

import (
	"context"
	"net"
	"testing"
	"time"

	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
)

const getInfo = "/pluginregistration.Registration/GetInfo"

// BenchmarkGetInfo is one liveness probe on a held connection.
func BenchmarkGetInfo(b *testing.B) {
	path := serve(b, registration{})
	c, err := Dial(context.Background(), path)
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	b.ReportAllocs()
	for b.Loop() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		var info registerapi.PluginInfo
		if err := c.Invoke(ctx, getInfo, &registerapi.InfoRequest{}, &info, 1<<16); err != nil {
			b.Fatal(err)
		}
		cancel()
	}
}

// BenchmarkDialGetInfo is one probe on a new connection.
func BenchmarkDialGetInfo(b *testing.B) {
	path := serve(b, registration{})
	b.ReportAllocs()
	for b.Loop() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		c, err := Dial(ctx, path)
		if err != nil {
			b.Fatal(err)
		}
		var info registerapi.PluginInfo
		if err := c.Invoke(ctx, getInfo, &registerapi.InfoRequest{}, &info, 1<<16); err != nil {
			b.Fatal(err)
		}
		c.Close()
		cancel()
	}
}

// BenchmarkOpenRegistration is a registration's calls on a new connection
// from Open: GetInfo, whose request goes with the connection's preface, then
// NotifyRegistrationStatus.
func BenchmarkOpenRegistration(b *testing.B) {
	path := serve(b, registration{})
	b.ReportAllocs()
	for b.Loop() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		nc, err := net.Dial("unix", path)
		if err != nil {
			b.Fatal(err)
		}
		c := Open(nc.(*net.UnixConn), time.Time{})
		var info registerapi.PluginInfo
		if err := c.Invoke(ctx, getInfo, &registerapi.InfoRequest{}, &info, 1<<16); err != nil {
			b.Fatal(err)
		}
		if err := c.Invoke(ctx, notify, &registerapi.RegistrationStatus{PluginRegistered: true}, &registerapi.RegistrationStatusResponse{}, 1<<16); err != nil {
			b.Fatal(err)
		}
		c.Close()
		cancel()
	}
}
