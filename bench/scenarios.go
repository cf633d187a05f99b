package main

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"time"
)

// session is one manager process under test, on a registry directory of its
// own, with the plugins started for it. Every scenario gets a fresh one, so
// that no run inherits another's memory or backlog.
type session struct {
	mgr     *managerProc
	fleet   *fleet
	tmp     string
	timeout time.Duration
}

// openSession starts the manager l and waits until it has registered a
// first plugin: only then is it known to be up, and nothing timed includes
// its start.
func openSession(l launch, timeout time.Duration) (*session, error) {
	tmp, err := os.MkdirTemp("", "plugd-bench-")
	if err != nil {
		return nil, err
	}
	dir := filepath.Join(tmp, "registry")
	// 0750: plugd refuses a registry directory that others may write to.
	if err := os.Mkdir(dir, 0o750); err != nil {
		return nil, err
	}
	mgr, err := startManager(l, dir, filepath.Join(tmp, "manager.log"))
	if err != nil {
		return nil, err
	}
	s := &session{mgr: mgr, fleet: &fleet{dir: dir}, tmp: tmp, timeout: timeout}
	p, err := s.fleet.listen("warmup")
	if err == nil {
		_, err = p.place()
	}
	if err == nil {
		err = s.wait([]*fakePlugin{p})
	}
	if err != nil {
		return nil, errors.Join(fmt.Errorf("warming up: %w", err), s.close(true))
	}
	return s, nil
}

// close stops the manager, then the plugins, so that the manager does not
// spend the end of the run deregistering them. A failed session keeps its
// directory, and with it the manager's log.
func (s *session) close(failed bool) error {
	err := s.mgr.stop()
	s.fleet.close()
	if failed {
		fmt.Fprintf(os.Stderr, "bench: kept %s for the manager's log\n", s.tmp)
		return nil // the failure that closes the session already said why
	}
	return errors.Join(err, os.RemoveAll(s.tmp))
}

// wait returns once every plugin in ps has been told it is registered, or an
// error if that takes longer than the session's timeout or the manager exits.
func (s *session) wait(ps []*fakePlugin) error {
	timer := time.NewTimer(s.timeout)
	defer timer.Stop()
	for _, p := range ps {
		select {
		case <-p.registered:
		case <-s.mgr.exited:
			return s.mgr.died()
		case <-timer.C:
			n := 0
			for _, q := range ps {
				if q.isRegistered() {
					n++
				}
			}
			return fmt.Errorf("the %s manager registered %d of %d plugins within %s (plugins were told %d times they were not registered)%s",
				s.mgr.name, n, len(ps), s.timeout, s.fleet.rejections.Load(), s.mgr.logTail())
		}
	}
	return nil
}

// listenAll starts n plugins, listening but not yet visible.
func (s *session) listenAll(prefix string, n int) ([]*fakePlugin, error) {
	ps := make([]*fakePlugin, n)
	for i := range ps {
		p, err := s.fleet.listen(fmt.Sprintf("%s-%05d", prefix, i))
		if err != nil {
			return nil, err
		}
		ps[i] = p
	}
	return ps, nil
}

// placeAll puts every socket in view as fast as renames go, and returns
// when the first one appeared.
func placeAll(ps []*fakePlugin) (time.Time, error) {
	start := time.Now()
	for _, p := range ps {
		if _, err := p.place(); err != nil {
			return start, err
		}
	}
	return start, nil
}

// latency places plugins one at a time and times each from its socket
// being in place to its being told it is registered.
func latency(n int, gap time.Duration) func(*session) (map[string]float64, error) {
	return func(s *session) (map[string]float64, error) {
		lat := make([]time.Duration, 0, n)
		for i := range n {
			pause(gap)
			p, err := s.fleet.listen(fmt.Sprintf("lat-%05d", i))
			if err != nil {
				return nil, err
			}
			placed, err := p.place()
			if err != nil {
				return nil, err
			}
			if err := s.wait([]*fakePlugin{p}); err != nil {
				return nil, err
			}
			lat = append(lat, p.at.Sub(placed))
		}
		return map[string]float64{
			"p50_ms": ms(percentile(lat, 0.50)),
			"p99_ms": ms(percentile(lat, 0.99)),
		}, nil
	}
}

// burst places n sockets at once and times until all are told registered;
// then, with nothing changing, it measures the manager's idle cost over
// window (skipped if zero), settle after the burst.
func burst(n int, settle, window time.Duration) func(*session) (map[string]float64, error) {
	return func(s *session) (map[string]float64, error) {
		ps, err := s.listenAll("burst", n)
		if err != nil {
			return nil, err
		}
		before := s.fleet.counts()
		cpu0, err := s.mgr.cpu()
		if err != nil {
			return nil, err
		}
		load0, err := cpuTime(os.Getpid())
		if err != nil {
			return nil, err
		}
		start, err := placeAll(ps)
		if err != nil {
			return nil, err
		}
		if err := s.wait(ps); err != nil {
			return nil, err
		}
		cpu1, err := s.mgr.cpu()
		if err != nil {
			return nil, err
		}
		load1, err := cpuTime(os.Getpid())
		if err != nil {
			return nil, err
		}
		last := start
		for _, p := range ps {
			if p.at.After(last) {
				last = p.at
			}
		}
		c := s.fleet.counts().minus(before)
		v := map[string]float64{
			"seconds":    last.Sub(start).Seconds(),
			"expired":    float64(c.expired),
			"retries":    float64(c.getInfos - int64(n)), // GetInfo calls beyond one per plugin
			"rejections": float64(c.rejections),
			// CPU time of the manager and of the plugins (this process)
			// over the burst: when they add up to all the cores for as
			// long as the burst lasted, the machine was the bottleneck.
			"cpu_s":      (cpu1 - cpu0).Seconds(),
			"load_cpu_s": (load1 - load0).Seconds(),
		}
		if window > 0 {
			if s.mgr.name == plugdProbing {
				settle = max(settle, probeSettle)
			}
			cpu, rss, err := s.idle(settle, window)
			if err != nil {
				return nil, err
			}
			v["idle_cpu_pct"], v["idle_rss_mib"] = cpu, rss
		}
		return v, nil
	}
}

// idle waits settle, then returns the manager's CPU use over window, in
// percent of one core, and its resident memory at the end, in MiB.
func (s *session) idle(settle, window time.Duration) (cpuPct, rssMiB float64, err error) {
	time.Sleep(settle)
	cpu0, err := s.mgr.cpu()
	if err != nil {
		return 0, 0, err
	}
	start := time.Now()
	select {
	case <-time.After(window):
	case <-s.mgr.exited:
		return 0, 0, s.mgr.died()
	}
	cpu1, err := s.mgr.cpu()
	if err != nil {
		return 0, 0, err
	}
	elapsed := time.Since(start)
	rss, err := s.mgr.rss()
	if err != nil {
		return 0, 0, err
	}
	return 100 * float64(cpu1-cpu0) / float64(elapsed), float64(rss) / (1 << 20), nil
}

// churn registers base plugins, then, one at a time, removes a plugin's
// socket and creates it again, as a restarting plugin does, and times each
// from the new socket being in place to the new plugin being told it is
// registered.
func churn(base, count int, gap time.Duration) func(*session) (map[string]float64, error) {
	return func(s *session) (map[string]float64, error) {
		ps, err := s.listenAll("churn", base)
		if err != nil {
			return nil, err
		}
		if _, err := placeAll(ps); err != nil {
			return nil, err
		}
		if err := s.wait(ps); err != nil {
			return nil, err
		}
		lat := make([]time.Duration, 0, count)
		for i := range count {
			pause(gap)
			old := ps[i%base]
			old.close()
			p, err := s.fleet.listen(old.name)
			if err != nil {
				return nil, err
			}
			placed, err := p.place()
			if err != nil {
				return nil, err
			}
			if err := s.wait([]*fakePlugin{p}); err != nil {
				return nil, err
			}
			lat = append(lat, p.at.Sub(placed))
			ps[i%base] = p
		}
		return map[string]float64{
			"p50_ms": ms(percentile(lat, 0.50)),
			"p99_ms": ms(percentile(lat, 0.99)),
		}, nil
	}
}

// pause sleeps a random time below max, so that plugins placed one at a
// time arrive at random points of the kubelet's one-second loop rather than
// in step with it.
func pause(max time.Duration) {
	if max > 0 {
		time.Sleep(rand.N(max))
	}
}

// percentile returns the nearest-rank q-quantile of ds.
func percentile(ds []time.Duration, q float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	i := int(math.Ceil(q*float64(len(s)))) - 1
	return s[max(0, min(i, len(s)-1))]
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
