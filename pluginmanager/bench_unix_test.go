//go:build unix

package pluginmanager_test

import (
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/plugd/plugd/plugin"
	"github.com/plugd/plugd/pluginmanager"
)

// BenchmarkIdle measures the CPU the process uses while N plugins are
// registered and nothing changes: the manager should cost nothing then.
// Each iteration is a 100ms window; cpu-% is of one core.
func BenchmarkIdle(b *testing.B) {
	for _, n := range []int{1000} {
		b.Run(fmt.Sprint("n=", n), func(b *testing.B) {
			m, dir := benchManager(b)
			for i := range n {
				p, err := plugin.Start(plugin.Config{Dir: dir, Type: "CSIPlugin", Name: fmt.Sprint("p", i), Versions: []string{"1.0.0"}})
				if err != nil {
					b.Fatal(err)
				}
				b.Cleanup(func() { p.Close() })
			}
			sub := m.Subscribe()
			defer sub.Close()
			deadline := time.After(time.Minute)
			// Events may be lost while the plugins start; each one that
			// arrives is only a cue to count again.
			for {
				registered := 0
				for _, s := range m.Plugins() {
					if s.State == pluginmanager.StateRegistered {
						registered++
					}
				}
				if registered == n {
					break
				}
				select {
				case <-sub.Events():
				case <-deadline:
					b.Fatalf("only %d of %d registered", registered, n)
				}
			}
			before, wallBefore := cpuTime(b), time.Now()
			for b.Loop() {
				time.Sleep(100 * time.Millisecond) // the idle window being measured, not a wait for anything
			}
			cpu, wall := cpuTime(b)-before, time.Since(wallBefore)
			b.ReportMetric(100*cpu.Seconds()/wall.Seconds(), "cpu-%")
		})
	}
}

func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
