// Command bench measures plugd's plugin manager against the kubelet's
// (k8s.io/kubernetes/pkg/kubelet/pluginmanager), side by side on one machine
// under the same load: registration latency, bursts of new sockets,
// re-created sockets, and the cost of sitting idle with many plugins.
//
//	cd bench && go run . -runs 5
//
// Each manager runs in a child process of its own, from a binary of its own
// (cmd/plugd-manager, cmd/kubelet-manager, built at start), so that its CPU
// time and memory can be read from /proc apart from the load generator's,
// which runs the plugins in this process.
// README.md says what each figure means and holds the latest results.
package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
)

// config is what the flags set.
type config struct {
	runs      int
	managers  []string
	latency   int
	gap       time.Duration
	bursts    []int
	idle      time.Duration
	settle    time.Duration
	churn     int
	churnBase int
	timeout   time.Duration
	jsonPath  string
	profiles  string
}

func main() {
	fs := flag.NewFlagSet("bench", flag.ExitOnError)
	cfg, err := parseFlags(fs, os.Args[1:])
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(2)
	}
	if err := run(cfg, fs); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

func parseFlags(fs *flag.FlagSet, args []string) (*config, error) {
	cfg := &config{}
	var managerList, burstList string
	fs.IntVar(&cfg.runs, "runs", 4, "runs of every scenario for each manager; the table shows medians over runs")
	fs.StringVar(&managerList, "managers", plugd+","+kubelet, "managers to measure: plugd, kubelet, or both")
	fs.IntVar(&cfg.latency, "latency", 25, "plugins placed one at a time in the latency scenario (0 skips it)")
	fs.DurationVar(&cfg.gap, "gap", time.Second, "a one-at-a-time plugin appears after a random pause below this, so that it lands at a random point of the kubelet's 1s loop")
	fs.StringVar(&burstList, "burst", "1000,5000", "plugin counts for the burst and idle scenarios, comma-separated (empty skips them)")
	fs.DurationVar(&cfg.idle, "idle", 10*time.Second, "window over which idle CPU is measured after each burst (0 skips idle)")
	fs.DurationVar(&cfg.settle, "settle", time.Second, "pause between a burst's last registration and the idle window (for plugd with probing on, at least its steady state, 12s)")
	fs.IntVar(&cfg.churn, "churn", 10, "sockets removed and re-created one at a time in the churn scenario (0 skips it)")
	fs.IntVar(&cfg.churnBase, "churn-base", 100, "plugins registered during the churn scenario")
	fs.DurationVar(&cfg.timeout, "timeout", 2*time.Minute, "longest wait for plugins to be registered before the benchmark fails")
	fs.StringVar(&cfg.jsonPath, "json", "", "also write every run and the medians as JSON to this file")
	fs.StringVar(&cfg.profiles, "profiles", "", "write a CPU profile of each manager process's run, and a heap profile at its end, into this directory (for go tool pprof)")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	for m := range strings.SplitSeq(managerList, ",") {
		if m = strings.TrimSpace(m); m != plugd && m != kubelet {
			return nil, fmt.Errorf("-managers: unknown manager %q: use plugd, kubelet or both", m)
		}
		cfg.managers = append(cfg.managers, strings.TrimSpace(m))
	}
	for s := range strings.SplitSeq(burstList, ",") {
		if s = strings.TrimSpace(s); s == "" {
			continue
		}
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 {
			return nil, fmt.Errorf("-burst: %q is not a positive count of plugins", s)
		}
		cfg.bursts = append(cfg.bursts, n)
	}
	slices.Sort(cfg.bursts)
	switch {
	case cfg.runs < 1:
		return nil, fmt.Errorf("-runs must be at least 1")
	case cfg.churn > 0 && cfg.churnBase < 1:
		return nil, fmt.Errorf("-churn-base must be at least 1")
	}
	return cfg, nil
}

// step is one scenario, run once per manager in each run.
type step struct {
	scenario string
	managers []string
	run      func(*session) (map[string]float64, error)
}

// plan lists the steps of one run.
func plan(cfg *config) []step {
	var steps []step
	if cfg.latency > 0 {
		steps = append(steps, step{"latency", cfg.managers, latency(cfg.latency, cfg.gap)})
	}
	if cfg.churn > 0 {
		steps = append(steps, step{"churn", cfg.managers, churn(cfg.churnBase, cfg.churn, cfg.gap)})
	}
	// plugd's idle cost is measured at its defaults and probing every
	// 10 s, so that frequent probing is seen apart from the rest.
	burstManagers := cfg.managers
	if cfg.idle > 0 && slices.Contains(cfg.managers, plugd) {
		burstManagers = slices.Insert(slices.Clone(cfg.managers), slices.Index(cfg.managers, plugd)+1, plugdProbing)
	}
	for _, n := range cfg.bursts {
		steps = append(steps, step{burstScenario(n), burstManagers, burst(n, cfg.settle, cfg.idle)})
	}
	return steps
}

func burstScenario(n int) string { return fmt.Sprintf("burst-%d", n) }

// run builds the managers, runs every scenario, and prints the table of
// medians (and writes the JSON, if asked).
func run(cfg *config, fs *flag.FlagSet) error {
	began := time.Now()
	m := describeMachine()
	fmt.Println(m)
	bin, err := os.MkdirTemp("", "plugd-bench-bin-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(bin)
	if err := buildManagers(bin, cfg.managers); err != nil {
		return err
	}
	if cfg.profiles != "" {
		if err := os.MkdirAll(cfg.profiles, 0o755); err != nil {
			return err
		}
	}
	results, err := runAll(cfg, bin)
	if err != nil {
		return err
	}
	rows := table(cfg, medians(results))
	fmt.Printf("\nmedians of %d runs (%s in all)\n\n", cfg.runs, time.Since(began).Round(time.Second))
	printTable(os.Stdout, rows)
	if cfg.jsonPath != "" {
		return writeJSON(cfg.jsonPath, m, fs, results, rows)
	}
	return nil
}

// runAll runs every step of the plan for each of its managers, cfg.runs
// times, with the manager binaries in bin. Which manager goes first
// alternates between runs, so that drifts of a shared machine fall on both.
func runAll(cfg *config, bin string) ([]result, error) {
	var results []result
	for r := 1; r <= cfg.runs; r++ {
		for _, st := range plan(cfg) {
			order := slices.Clone(st.managers)
			if r%2 == 0 {
				slices.Reverse(order)
			}
			for _, name := range order {
				l := launch{bin: bin, name: name}
				if cfg.profiles != "" {
					l.profile = filepath.Join(cfg.profiles, fmt.Sprintf("run%d-%s-%s", r, st.scenario, name))
				}
				began := time.Now()
				res, err := runStep(r, st, l, cfg.timeout)
				if err != nil {
					return nil, fmt.Errorf("run %d, %s, %s: %w", r, st.scenario, name, err)
				}
				fmt.Fprintf(os.Stderr, "run %d/%d  %-10s %-14s %5.1fs  %s\n", r, cfg.runs, st.scenario, name,
					time.Since(began).Seconds(), res.summary())
				results = append(results, res)
			}
		}
	}
	return results, nil
}

// runStep runs one scenario against a fresh manager.
func runStep(r int, st step, l launch, timeout time.Duration) (result, error) {
	res := result{Run: r, Scenario: st.scenario, Manager: l.name}
	s, err := openSession(l, timeout)
	if err != nil {
		return res, err
	}
	res.Values, err = st.run(s)
	if closeErr := s.close(err != nil); err == nil {
		err = closeErr
	}
	return res, err
}
