package pluginmanager

import (
	"fmt"
	"testing"
	"time"
)

// The hot paths of an idle or busy manager, with allocation counts: the
// snapshot the status API reads and the event fan-out every change goes
// through (the queue every change is handed to a worker by is benchmarked
// in internal/queue).

func BenchmarkPluginsSnapshot(b *testing.B) {
	for _, n := range []int{100, 1000, 5000} {
		b.Run(fmt.Sprint("n=", n), func(b *testing.B) {
			m, err := New(Options{Dir: b.TempDir()})
			if err != nil {
				b.Fatal(err)
			}
			for i := range n {
				path := fmt.Sprintf("/r/p%05d.sock", i)
				m.reg.entries[path] = &entry{status: PluginStatus{
					Plugin: Plugin{Type: "CSIPlugin", Name: fmt.Sprint("p", i), Endpoint: path, Versions: []string{"1.0.0"}, Socket: path},
					State:  StateRegistered, RegisteredSince: time.Now(), Created: time.Now(),
				}}
			}
			b.ReportAllocs()
			for b.Loop() {
				if len(m.Plugins()) != n {
					b.Fatal("wrong snapshot")
				}
			}
		})
	}
}

func BenchmarkEventFanOut(b *testing.B) {
	for _, subs := range []int{0, 1, 8} {
		b.Run(fmt.Sprint("subscribers=", subs), func(b *testing.B) {
			br := newBroker(1024, 1024)
			for range subs {
				s := br.subscribe(0)
				done := make(chan struct{})
				go func() {
					defer close(done)
					for range s.Events() {
					}
				}()
				b.Cleanup(func() { s.Close(); <-done })
			}
			ev := Event{Type: EventRegistered, Plugin: Plugin{Type: "CSIPlugin", Name: "p", Socket: "/r/p.sock"}, State: StateRegistered}
			b.ReportAllocs()
			for b.Loop() {
				br.publish(ev)
			}
		})
	}
}
