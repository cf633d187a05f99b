package pluginmanager_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/plugd/plugd/internal/testenv"
	"github.com/plugd/plugd/plugin"
	"github.com/plugd/plugd/pluginmanager"
)

// benchManager runs a manager that accepts every CSIPlugin until the benchmark ends.
func benchManager(b *testing.B) (*pluginmanager.Manager, string) {
	b.Helper()
	dir := testenv.ShortDir(b, "bm")
	m, err := pluginmanager.New(pluginmanager.Options{Dir: dir})
	if err != nil {
		b.Fatal(err)
	}
	m.AddHandler("CSIPlugin", pluginmanager.HandlerFuncs{})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- m.Run(ctx) }()
	b.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			b.Error(err)
		}
	})
	return m, dir
}

// BenchmarkRegistrationLatency measures, one plugin at a time, the time from
// a plugin starting to listen on its socket to the plugin being told it is
// registered. It reports the median and 99th percentile.
func BenchmarkRegistrationLatency(b *testing.B) {
	_, dir := benchManager(b)
	lat := make([]time.Duration, 0, b.N)
	for i := 0; b.Loop(); i++ {
		told := make(chan struct{}, 1)
		begin := time.Now()
		p, err := plugin.Start(plugin.Config{Dir: dir, Type: "CSIPlugin", Name: fmt.Sprint("p", i), Versions: []string{"1.0.0"},
			OnStatus: func(st plugin.Status) {
				if st.Registered {
					told <- struct{}{}
				}
			}})
		if err != nil {
			b.Fatal(err)
		}
		select {
		case <-told:
		case <-time.After(testenv.Timeout):
			b.Fatal("plugin not registered")
		}
		lat = append(lat, time.Since(begin))
		p.Close()
	}
	reportPercentiles(b, lat)
}

func reportPercentiles(b *testing.B, lat []time.Duration) {
	slices.Sort(lat)
	at := func(q float64) float64 {
		return float64(lat[int(q*float64(len(lat)-1))]) / float64(time.Millisecond)
	}
	b.ReportMetric(at(0.5), "p50-ms")
	b.ReportMetric(at(0.99), "p99-ms")
}

// BenchmarkBurst measures how long N plugins that appear at once take until
// every one of them has been told it is registered. The plugins are started
// beforehand in another directory and moved in, so that only the manager's
// work is timed.
func BenchmarkBurst(b *testing.B) {
	for _, n := range []int{100, 1000} {
		b.Run(fmt.Sprint("n=", n), func(b *testing.B) {
			_, dir := benchManager(b)
			for b.Loop() {
				b.StopTimer()
				staging, err := os.MkdirTemp("", "bs")
				if err != nil {
					b.Fatal(err)
				}
				var registered atomic.Int64
				all := make(chan struct{})
				servers := make([]*plugin.Server, n)
				for i := range n {
					servers[i], err = plugin.Start(plugin.Config{Dir: staging, Type: "CSIPlugin", Name: fmt.Sprint("p", i), Versions: []string{"1.0.0"},
						OnStatus: func(st plugin.Status) {
							if st.Registered && registered.Add(1) == int64(n) {
								close(all)
							}
						}})
					if err != nil {
						b.Fatal(err)
					}
				}
				b.StartTimer()
				for _, s := range servers {
					if err := os.Rename(s.Path(), filepath.Join(dir, filepath.Base(s.Path()))); err != nil {
						b.Fatal(err)
					}
				}
				select {
				case <-all:
				case <-time.After(time.Minute):
					b.Fatalf("%d of %d registered after a minute", registered.Load(), n)
				}
				b.StopTimer()
				for _, s := range servers {
					os.Remove(filepath.Join(dir, filepath.Base(s.Path())))
					s.Close()
				}
				os.RemoveAll(staging)
				b.StartTimer()
			}
		})
	}
}
