//go:build linux

// Command fleetbench measures kubectl plugd cluster on a large cluster: it
// starts the real etcd and kube-apiserver of package controlplane, creates
// Nodes as large as real ones (the kubelet's conditions, addresses, node
// info, capacity, some 50 images with their digests, labels, and plugd's
// conditions for three expected plugins; about 20 KB each as JSON), with
// plugd caretaker keeping the fleet summary, and at each size (-nodes,
// growing) runs kubectl-plugd cluster -runs times each way: reading every
// Node (--source=nodes -o json) and reading the caretaker's summary
// (--source=summary), recording its wall time, its CPU time, its peak
// resident memory (the kernel's maxrss of the process) and the API
// server's CPU time meanwhile. Nodes are created once and kept as the
// fleet grows.
//
//	cd test/kube && go run ./cmd/fleetbench                      # 100, 1000, 5000, 15000 nodes
//	cd test/kube && go run ./cmd/fleetbench -nodes 15000,65000   # the largest clusters (about 30 minutes)
//	cd test/kube && go run ./cmd/fleetbench -nodes 1200 -runs 1  # the smoke run CI makes
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/plugd/plugd/internal/nodecond"
	"github.com/plugd/plugd/test/kube/controlplane"
)

// Result is one size's measurements, of each way of reading.
type Result struct {
	Nodes     int `json:"nodes"`
	NodeBytes int `json:"nodeBytes"` // one Node as JSON, as the API server serves it (managedFields included)
	// Nodes is kubectl plugd cluster --source=nodes -o json (a paged
	// list of every Node); Summary is --source=summary (plugd caretaker's
	// summary, one ConfigMap).
	List    Measures `json:"list"`
	Summary Measures `json:"summary"`
	// ListPages and ListBytes are what one list of every Node reads (as
	// protobuf, before the gzip of the wire); SummaryBytes the summary's
	// ConfigMap, the one object the other way reads.
	ListPages    int `json:"listPages"`
	ListBytes    int `json:"listBytes"`
	SummaryBytes int `json:"summaryBytes"`
}

// Measures are the runs of one way of reading at one size.
type Measures struct {
	Seconds   []float64 `json:"seconds"`
	PeakRSSMB []float64 `json:"peakRSSMB"`
	// CPUSeconds is the command's own CPU time (user and system): the
	// rest of its wall time it waits for the API server.
	CPUSeconds []float64 `json:"cpuSeconds"`
	// APIServerCPUSeconds is the API server's CPU time (user and system)
	// during each run: what one invocation costs it.
	APIServerCPUSeconds []float64 `json:"apiServerCPUSeconds"`
	// Ready and Expected are what the command counted for the first
	// expected plugin, checked against what was created.
	Ready, Expected int
}

func main() {
	if usage := os.Getenv(runnerEnv); usage != "" {
		if err := runCommand(usage); err != nil {
			fail("%v", err)
		}
		return
	}
	sizes := flag.String("nodes", "100,1000,5000,15000", "fleet sizes to measure, growing")
	runs := flag.Int("runs", 3, "runs of kubectl plugd cluster at each size")
	workers := flag.Int("workers", 8, "Nodes created at once")
	out := flag.String("json", "", "write the results as JSON to this file")
	extra := flag.String("flags", "", "more flags for kubectl plugd cluster, e.g. --disable-compression")
	caretakerMem := flag.String("caretaker-gomemlimit", "", "GOMEMLIMIT of plugd caretaker, as the chart's caretaker.goMemLimit sets it (empty: none)")
	profile := flag.String("pprof", "", "write the API server's CPU profile of the last run at each size to this directory")
	flag.Parse()
	var ns []int
	for s := range strings.SplitSeq(*sizes, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n <= 0 || len(ns) > 0 && n < ns[len(ns)-1] {
			fail("-nodes %q: give growing counts, such as 100,1000", *sizes)
		}
		ns = append(ns, n)
	}
	o := options{runs: *runs, workers: *workers, out: *out, profile: *profile, caretakerMem: *caretakerMem, extra: strings.Fields(*extra)}
	if err := run(ns, o); err != nil {
		fail("%v", err)
	}
}

func fail(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "fleetbench: "+format+"\n", args...)
	os.Exit(1)
}

// options are fleetbench's flags.
type options struct {
	runs, workers              int
	out, profile, caretakerMem string
	extra                      []string
}

func run(sizes []int, o options) error {
	ctx := context.Background()
	dirs, err := controlplane.Locate()
	if err != nil {
		return err
	}
	if err := controlplane.Build(dirs, os.Stderr); err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "fleetbench")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	cp, err := controlplane.Start(ctx, dirs.Bin, dir)
	if err != nil {
		return err
	}
	defer cp.Stop()
	kubeconfig := filepath.Join(dir, "admin.kubeconfig")
	if err := cp.WriteKubeconfig(kubeconfig, cp.AdminToken); err != nil {
		return err
	}
	rc := cp.Config(cp.AdminToken)
	rc.QPS, rc.Burst = -1, 0 // the API server's own limits are the limit
	rc.ContentType = "application/vnd.kubernetes.protobuf"
	client, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "kube-apiserver at %s; %d cores (GOMAXPROCS), %s\n", cp.URL, runtime.GOMAXPROCS(0), runtime.Version())

	// plugd caretaker, as the chart runs it, keeping the fleet summary
	// in the namespace plugd; --stale-after 24h, so that it marks
	// nothing: creating 65,000 Nodes takes longer than plugd's heartbeat
	// bound, and its marks would be writes of its own during the runs.
	if _, err := client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "plugd"}}, metav1.CreateOptions{}); err != nil {
		return err
	}
	caretaker, err := startCaretaker(filepath.Join(dirs.Bin, "plugd"), kubeconfig, filepath.Join(dir, "caretaker.log"), o.caretakerMem)
	if err != nil {
		return err
	}
	defer func() {
		caretaker.Process.Kill()
		caretaker.Wait()
	}()

	var results []Result
	have := 0
	for _, n := range sizes {
		start := time.Now()
		if err := create(ctx, client, have, n, o.workers); err != nil {
			return err
		}
		fmt.Fprintf(os.Stderr, "created nodes %d to %d in %s\n", have, n, time.Since(start).Round(time.Millisecond))
		have = n
		r, err := measureSize(ctx, bench{cp: cp, client: client, runs: o.runs}, dirs.Bin, kubeconfig, n, o.profile, o.extra)
		if err != nil {
			return err
		}
		results = append(results, r)
	}
	rss, cpu, err := processCost(caretaker.Process.Pid)
	if err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "plugd caretaker: peak RSS %.0f MB, CPU %.1f s in all\n", rss, cpu)
	return report(results, o.runs, o.out, map[string]any{"peakRSSMB": rss, "cpuSeconds": cpu, "gomemlimit": o.caretakerMem})
}

// report prints the medians as a Markdown table, and writes every run to
// out as JSON if out is set, with the caretaker's cost.
func report(results []Result, runs int, out string, caretaker map[string]any) error {
	fmt.Printf("| nodes | read | time (median of %d) | its CPU time | peak RSS | the API server's CPU time |\n|---:|---|---:|---:|---:|---:|\n", runs)
	for _, r := range results {
		for _, m := range []struct {
			way string
			m   Measures
		}{{"every Node (--source=nodes)", r.List}, {"the summary (--source=summary)", r.Summary}} {
			fmt.Printf("| %d | %s | %.2f s | %.2f s | %.0f MB | %.2f s |\n", r.Nodes, m.way, median(m.m.Seconds), median(m.m.CPUSeconds), median(m.m.PeakRSSMB), median(m.m.APIServerCPUSeconds))
		}
	}
	if out != "" {
		b, err := json.MarshalIndent(map[string]any{"goVersion": runtime.Version(), "cores": runtime.NumCPU(), "results": results,
			"caretaker": caretaker}, "", "  ")
		if err != nil {
			return err
		}
		return os.WriteFile(out, append(b, '\n'), 0o644)
	}
	return nil
}

// measureSize measures both ways of reading at n nodes: every Node, and
// the summary once plugd caretaker counts them all.
func measureSize(ctx context.Context, b bench, binDir, kubeconfig string, n int, profile string, extra []string) (Result, error) {
	last, _ := node(n - 1)
	served, err := b.client.CoreV1().RESTClient().Get().AbsPath("/api/v1/nodes", last.Name).SetHeader("Accept", "application/json").DoRaw(ctx)
	if err != nil {
		return Result{}, err
	}
	r := Result{Nodes: n, NodeBytes: len(served)}
	bin := filepath.Join(binDir, "kubectl-plugd")
	if profile != "" {
		b.profile = filepath.Join(profile, fmt.Sprintf("apiserver-%d.pprof", n))
	}
	if r.List, err = b.measure(ctx, bin, append([]string{"cluster", "--kubeconfig", kubeconfig, "--source=nodes", "-o", "json"}, extra...), checkList(n)); err != nil {
		return r, err
	}
	if r.SummaryBytes, err = waitSummary(ctx, b.client, n); err != nil {
		return r, err
	}
	if r.ListPages, r.ListBytes, err = listSize(ctx, b.client); err != nil {
		return r, err
	}
	b.profile = ""
	if r.Summary, err = b.measure(ctx, bin, []string{"cluster", "--kubeconfig", kubeconfig, "--source=summary"}, checkSummary(n)); err != nil {
		return r, err
	}
	for _, m := range []struct {
		way string
		m   Measures
	}{{"list", r.List}, {"summary", r.Summary}} {
		fmt.Fprintf(os.Stderr, "%6d nodes of %d bytes, %s: %s s (CPU %s s; the API server's %s s), peak RSS %s MB; ready %d of %d\n", n, r.NodeBytes, m.way,
			floats(m.m.Seconds, 2), floats(m.m.CPUSeconds, 2), floats(m.m.APIServerCPUSeconds, 2), floats(m.m.PeakRSSMB, 0), m.m.Ready, m.m.Expected)
	}
	return r, nil
}

// bench measures runs of kubectl plugd cluster against cp.
type bench struct {
	cp      *controlplane.ControlPlane
	client  kubernetes.Interface
	runs    int
	profile string // where the API server's CPU profile of the last run goes; "": none
}

// measure runs bin with args b.runs times, each checked by check, which
// returns what it counted for the first plugin.
func (b bench) measure(ctx context.Context, bin string, args []string, check func(stdout string) (ready, expected int, err error)) (Measures, error) {
	var m Measures
	for i := range b.runs {
		var prof chan error
		if b.profile != "" && i == b.runs-1 && i > 0 {
			prof = make(chan error, 1)
			go func() { prof <- apiServerProfile(ctx, b.client, b.profile, median(m.Seconds)) }()
		}
		apiBefore, err := cpuTime(b.cp.APIServerPID())
		if err != nil {
			return m, err
		}
		secs, cpu, rss, stdout, err := run1(bin, args)
		if err != nil {
			return m, err
		}
		apiAfter, err := cpuTime(b.cp.APIServerPID())
		if err != nil {
			return m, err
		}
		if prof != nil {
			if err := <-prof; err != nil {
				return m, err
			}
		}
		m.Seconds, m.CPUSeconds, m.PeakRSSMB = append(m.Seconds, secs), append(m.CPUSeconds, cpu), append(m.PeakRSSMB, rss)
		m.APIServerCPUSeconds = append(m.APIServerCPUSeconds, apiAfter-apiBefore)
		if m.Ready, m.Expected, err = check(stdout); err != nil {
			return m, fmt.Errorf("kubectl %s: %w", strings.Join(args, " "), err)
		}
	}
	return m, nil
}

// run1 runs bin with args once, through a runner (runCommand, in a
// process of its own): its wall time, its CPU time, its peak RSS in MB,
// and what it printed.
//
// The runner is there for the peak RSS. The kernel's maxrss of a child
// starts from its parent's peak (the memory the forked child shares until
// it execs counts as its own: a process of 300 MB that runs a command of
// 30 MB reads 300 MB in the command's rusage), and fleetbench grows to
// hundreds of MB creating 65,000 Nodes. The runner is small when it
// starts the command, as a shell is.
func run1(bin string, args []string) (float64, float64, float64, string, error) {
	self, err := os.Executable()
	if err != nil {
		return 0, 0, 0, "", err
	}
	usage := filepath.Join(os.TempDir(), fmt.Sprintf("fleetbench-usage-%d.json", os.Getpid()))
	defer os.Remove(usage)
	cmd := exec.Command(self, append([]string{bin}, args...)...)
	cmd.Env = append(os.Environ(), runnerEnv+"="+usage)
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return 0, 0, 0, "", fmt.Errorf("kubectl plugd %s: %v: %s", strings.Join(args, " "), err, stderr.String())
	}
	b, err := os.ReadFile(usage)
	if err != nil {
		return 0, 0, 0, "", err
	}
	var u runUsage
	if err := json.Unmarshal(b, &u); err != nil {
		return 0, 0, 0, "", err
	}
	return u.Seconds, u.CPUSeconds, u.PeakRSSMB, stdout.String(), nil
}

// runnerEnv, set, makes fleetbench the runner of one command (os.Args[1:])
// that writes its runUsage to the file the variable names.
const runnerEnv = "FLEETBENCH_USAGE"

// runUsage is what the runner measured of its command.
type runUsage struct {
	Seconds, CPUSeconds, PeakRSSMB float64
}

// runCommand is the runner: it runs os.Args[1:], its output fleetbench's,
// and writes its wall time, CPU time and peak RSS to usagePath.
func runCommand(usagePath string) error {
	cmd := exec.Command(os.Args[1], os.Args[2:]...)
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	start := time.Now()
	if err := cmd.Run(); err != nil {
		return err
	}
	ru := cmd.ProcessState.SysUsage().(*syscall.Rusage)
	b, err := json.Marshal(runUsage{
		Seconds:    time.Since(start).Seconds(),
		CPUSeconds: time.Duration(ru.Utime.Nano() + ru.Stime.Nano()).Seconds(),
		PeakRSSMB:  float64(ru.Maxrss) / 1024, // KB on Linux
	})
	if err != nil {
		return err
	}
	return os.WriteFile(usagePath, b, 0o644)
}

// checkList checks a view of n nodes read from every Node (-o json): each
// node expects the CSI driver; it is ready but where it is not as created
// (every 97th node, SocketMissing) or where plugd's write is older than
// nodecond.MaxHeartbeatAge (NotMaintained: creating 65,000 Nodes takes
// longer than that, and nothing here heartbeats).
func checkList(n int) func(string) (int, int, error) {
	return func(stdout string) (int, int, error) {
		var v nodecond.ClusterView
		if err := json.Unmarshal([]byte(stdout), &v); err != nil {
			return 0, 0, err
		}
		if len(v.Plugins) == 0 || v.Source != "nodes" {
			return 0, 0, fmt.Errorf("no plugin, or not read from the Nodes: %.200s", stdout)
		}
		p := v.Plugins[0]
		missing, oldMissing := 0, 0
		for _, nr := range p.NotReady {
			switch nr.Reason {
			case "SocketMissing":
				missing++
			case nodecond.ReasonNotMaintained:
				if index(nr.Node)%97 == 0 {
					oldMissing++
				}
			default:
				return 0, 0, fmt.Errorf("node %s: not ready, %s", nr.Node, nr.Reason)
			}
		}
		if v.Nodes != n || p.Expected != n || p.Ready+len(p.NotReady) != n || missing+oldMissing != notReady(n) {
			return 0, 0, fmt.Errorf("%d nodes, %s ready on %d of %d, not ready on %d (%d SocketMissing, %d more of those NotMaintained); want %d nodes, %d SocketMissing",
				v.Nodes, p.Name, p.Ready, p.Expected, len(p.NotReady), missing, oldMissing, n, notReady(n))
		}
		return p.Ready, p.Expected, nil
	}
}

// summaryLine is the table's count of nodes when it is plugd caretaker's.
var summaryLine = regexp.MustCompile(`(?m)^(\d+) nodes, \d+ with plugd's conditions, as plugd caretaker counted them`)

// checkSummary checks the table of a summary of n nodes: n nodes, each
// expecting the CSI driver (its readiness is checkList's).
func checkSummary(n int) func(string) (int, int, error) {
	return func(stdout string) (int, int, error) {
		m := summaryLine.FindStringSubmatch(stdout)
		var ready, expected int
		for line := range strings.SplitSeq(stdout, "\n") {
			if f := strings.Fields(line); len(f) == 5 && f[1] == plugins[0].name {
				ready, _ = strconv.Atoi(f[2])
				expected, _ = strconv.Atoi(f[3])
			}
		}
		if m == nil || m[1] != strconv.Itoa(n) || expected != n {
			return 0, 0, fmt.Errorf("not a summary of %d nodes: %s", n, stdout)
		}
		return ready, expected, nil
	}
}

// index is the number of the node name, as node names it.
func index(name string) int {
	var a, b, c int
	fmt.Sscanf(name, "ip-10-%d-%d-%d.", &a, &b, &c)
	return a*65536 + b*256 + c
}

// startCaretaker starts plugd caretaker with the fleet summary in the
// namespace plugd, its log in logPath.
func startCaretaker(bin, kubeconfig, logPath, memLimit string) (*exec.Cmd, error) {
	f, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, "caretaker", "--kubeconfig", kubeconfig, "--summary-namespace", "plugd", "--stale-after", "24h")
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if memLimit != "" {
		cmd.Env = append(os.Environ(), "GOMEMLIMIT="+memLimit)
	}
	return cmd, cmd.Start()
}

// waitSummary waits until plugd caretaker's summary counts n nodes, and
// returns the size of its ConfigMap as protobuf.
func waitSummary(ctx context.Context, client kubernetes.Interface, n int) (int, error) {
	deadline := time.Now().Add(5 * time.Minute)
	for {
		cm, err := client.CoreV1().ConfigMaps("plugd").Get(ctx, nodecond.SummaryName, metav1.GetOptions{})
		if err == nil {
			s, err := nodecond.DecodeSummary([]byte(cm.Data[nodecond.SummaryKey]))
			if err == nil && s.View.Nodes == n {
				return cm.Size(), nil
			}
		}
		if time.Now().After(deadline) {
			return 0, fmt.Errorf("plugd caretaker's summary does not count %d nodes within 5 minutes (%v)", n, err)
		}
		time.Sleep(time.Second) // a poll of another process's writes
	}
}

// listSize lists every Node as kubectl plugd cluster does (500 a page, as
// protobuf) and counts the pages and their bytes.
func listSize(ctx context.Context, client kubernetes.Interface) (pages, bytes int, err error) {
	cont := ""
	for {
		res := client.CoreV1().RESTClient().Get().Resource("nodes").Param("limit", "500").Param("continue", cont).
			SetHeader("Accept", "application/vnd.kubernetes.protobuf").Do(ctx)
		body, err := res.Raw()
		if err != nil {
			return pages, bytes, err
		}
		pages, bytes = pages+1, bytes+len(body)
		var l corev1.NodeList
		if err := res.Into(&l); err != nil {
			return pages, bytes, err
		}
		if cont = l.Continue; cont == "" {
			return pages, bytes, nil
		}
	}
}

// processCost is process pid's peak RSS in MB (VmHWM) and CPU time so far.
func processCost(pid int) (float64, float64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, 0, err
	}
	var kb float64
	for line := range strings.SplitSeq(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kb, _ = strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 64)
		}
	}
	cpu, err := cpuTime(pid)
	return kb / 1024, cpu, err
}

// cpuTime is the CPU time (user and system) process pid has used, in
// seconds, from /proc/PID/stat.
func cpuTime(pid int) (float64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The fields after the command's name, which is in parentheses and
	// may hold spaces: utime and stime are the 14th and 15th of the line.
	_, rest, ok := strings.Cut(string(b), ") ")
	f := strings.Fields(rest)
	if !ok || len(f) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: unexpected %q", pid, b)
	}
	utime, err1 := strconv.ParseFloat(f[11], 64)
	stime, err2 := strconv.ParseFloat(f[12], 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("/proc/%d/stat: unexpected %q", pid, b)
	}
	return (utime + stime) / 100, nil // USER_HZ, 100 on Linux
}

// apiServerProfile writes the API server's CPU profile of the next
// seconds (rounded up, plus one) to path.
func apiServerProfile(ctx context.Context, client kubernetes.Interface, path string, seconds float64) error {
	b, err := client.CoreV1().RESTClient().Get().AbsPath("/debug/pprof/profile").
		Param("seconds", strconv.Itoa(int(seconds)+2)).DoRaw(ctx)
	if err != nil {
		return fmt.Errorf("the API server's CPU profile: %w", err)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	return os.WriteFile(path, b, 0o644)
}

// create creates nodes from..to-1, workers at a time.
func create(ctx context.Context, client kubernetes.Interface, from, to, workers int) error {
	var next atomic.Int64
	next.Store(int64(from))
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for range workers {
		wg.Go(func() {
			for {
				i := int(next.Add(1) - 1)
				if i >= to {
					return
				}
				n, plugds := node(i)
				if _, err := client.CoreV1().Nodes().Create(ctx, n, metav1.CreateOptions{}); err != nil {
					errs <- fmt.Errorf("creating node %d: %w", i, err)
					return
				}
				// plugd's conditions as plugd writes them, so that the
				// managedFields say they are plugd's: readers count no
				// other (nodecond.Conditions).
				patch, err := json.Marshal(map[string]any{"status": map[string]any{"conditions": plugds}})
				if err == nil {
					_, err = client.CoreV1().Nodes().Patch(ctx, n.Name, types.StrategicMergePatchType, patch,
						metav1.PatchOptions{FieldManager: nodecond.FieldManager}, "status")
				}
				if err != nil {
					errs <- fmt.Errorf("writing plugd's conditions of node %d: %w", i, err)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	return <-errs
}

// notReady is how many of the first n nodes have the CSI driver not
// ready: every 97th.
func notReady(n int) int { return (n + 96) / 97 }

// The plugins every node expects, as a plugd with this expect list writes
// their conditions.
var plugins = []struct{ typ, name, cond string }{
	{"CSIPlugin", "csi.example.com", "csi.example.com/CSIPluginReady"},
	{"DevicePlugin", "vendor.example/gpu", "vendor.example/gpu-DevicePluginReady"},
	{"DRAPlugin", "gpu.example.com", "gpu.example.com/DRAPluginReady"},
}

// node is the i-th Node, as a kubelet of today registers and reports it,
// and plugd's conditions on it.
func node(i int) (*corev1.Node, []corev1.NodeCondition) {
	name := fmt.Sprintf("ip-10-%d-%d-%d.eu-west-1.compute.internal", i/65536%256, i/256%256, i%256)
	zone := []string{"a", "b", "c"}[i%3]
	t0 := metav1.NewTime(time.Date(2026, 11, 1, 8, 0, 0, 0, time.UTC).Add(time.Duration(i) * time.Second))
	// Heartbeats are recent, as on a live fleet: plugd writes its
	// conditions at least every 5 minutes, and readers count one older
	// than nodecond.MaxHeartbeatAge as not maintained.
	now := metav1.NewTime(time.Now().Truncate(time.Second))
	cond := func(typ corev1.NodeConditionType, st corev1.ConditionStatus, reason, msg string) corev1.NodeCondition {
		return corev1.NodeCondition{Type: typ, Status: st, Reason: reason, Message: msg, LastHeartbeatTime: now, LastTransitionTime: t0}
	}
	conds := []corev1.NodeCondition{
		cond(corev1.NodeMemoryPressure, corev1.ConditionFalse, "KubeletHasSufficientMemory", "kubelet has sufficient memory available"),
		cond(corev1.NodeDiskPressure, corev1.ConditionFalse, "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
		cond(corev1.NodePIDPressure, corev1.ConditionFalse, "KubeletHasSufficientPID", "kubelet has sufficient PID available"),
		cond(corev1.NodeReady, corev1.ConditionTrue, "KubeletReady", "kubelet is posting ready status"),
		cond("KernelDeadlock", corev1.ConditionFalse, "KernelHasNoDeadlock", "kernel has no deadlock"),
		cond("ReadonlyFilesystem", corev1.ConditionFalse, "FilesystemIsNotReadOnly", "Filesystem is not read-only"),
	}
	var plugds []corev1.NodeCondition
	for j, p := range plugins {
		c := cond(corev1.NodeConditionType(p.cond), corev1.ConditionTrue, "PluginReady", nodecond.Message(p.typ, p.name, "registered, answering, and registered by the kubelet"))
		if j == 0 && i%97 == 0 {
			c = cond(corev1.NodeConditionType(p.cond), corev1.ConditionFalse, "SocketMissing", nodecond.Message(p.typ, p.name, "no registration socket of it in /var/lib/kubelet/plugins_registry"))
		}
		plugds = append(plugds, c)
	}
	var images []corev1.ContainerImage
	for j := range 50 {
		repo := fmt.Sprintf("registry.example.com/team-%02d/service-%02d", j%12, j)
		digest := fmt.Sprintf("sha256:%064x", uint64(j)*0x9e3779b97f4a7c15+uint64(i%7))
		mirror := strings.Replace(repo, "registry.example.com", "123456789012.dkr.ecr.eu-west-1.amazonaws.com", 1)
		images = append(images, corev1.ContainerImage{Names: []string{repo + "@" + digest, mirror + "@" + digest, fmt.Sprintf("%s:v1.%d.%d", repo, j%9, i%5)},
			SizeBytes: int64(20_000_000 + j*1_234_567)})
	}
	q := resource.MustParse
	return &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{
			Name: name,
			Labels: map[string]string{
				"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
				"beta.kubernetes.io/os": "linux", "beta.kubernetes.io/arch": "amd64", "beta.kubernetes.io/instance-type": "m7i.4xlarge",
				"node.kubernetes.io/instance-type": "m7i.4xlarge", "topology.kubernetes.io/region": "eu-west-1",
				"topology.kubernetes.io/zone": "eu-west-1" + zone, "failure-domain.beta.kubernetes.io/zone": "eu-west-1" + zone,
				"topology.ebs.csi.aws.com/zone": "eu-west-1" + zone, "eks.amazonaws.com/nodegroup": fmt.Sprintf("workers-%d", i%20),
				"eks.amazonaws.com/capacityType": "ON_DEMAND", "storage.example.com/csi": "true",
			},
			Annotations: map[string]string{
				"node.alpha.kubernetes.io/ttl": "0", "volumes.kubernetes.io/controller-managed-attach-detach": "true",
				"csi.volume.kubernetes.io/nodeid":      fmt.Sprintf(`{"csi.example.com":"i-%017x"}`, i),
				"alpha.kubernetes.io/provided-node-ip": fmt.Sprintf("10.%d.%d.%d", i/65536%256, i/256%256, i%256),
			},
		},
		Spec: corev1.NodeSpec{PodCIDR: fmt.Sprintf("100.%d.%d.0/24", i/256%256, i%256), ProviderID: fmt.Sprintf("aws:///eu-west-1%s/i-%017x", zone, i)},
		Status: corev1.NodeStatus{
			Capacity: corev1.ResourceList{"cpu": q("16"), "memory": q("65023604Ki"), "ephemeral-storage": q("209702892Ki"), "pods": q("234"),
				"hugepages-1Gi": q("0"), "hugepages-2Mi": q("0"), "vendor.example/gpu": q("4")},
			Allocatable: corev1.ResourceList{"cpu": q("15890m"), "memory": q("64006772Ki"), "ephemeral-storage": q("192188443124"), "pods": q("234"),
				"hugepages-1Gi": q("0"), "hugepages-2Mi": q("0"), "vendor.example/gpu": q("4")},
			Conditions: conds,
			Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: fmt.Sprintf("10.%d.%d.%d", i/65536%256, i/256%256, i%256)},
				{Type: corev1.NodeHostName, Address: name}, {Type: corev1.NodeInternalDNS, Address: name}},
			DaemonEndpoints: corev1.NodeDaemonEndpoints{KubeletEndpoint: corev1.DaemonEndpoint{Port: 10250}},
			NodeInfo: corev1.NodeSystemInfo{MachineID: fmt.Sprintf("ec2%029x", i), SystemUUID: fmt.Sprintf("ec2%05x-0000-4000-8000-%012x", i%0xfffff, i),
				BootID: fmt.Sprintf("%08x-1111-4222-8333-%012x", i, i), KernelVersion: "6.1.112-122.189.amzn2023.x86_64", OSImage: "Amazon Linux 2023.6.20241010",
				ContainerRuntimeVersion: "containerd://1.7.22", KubeletVersion: "v1.37.2", KubeProxyVersion: "", OperatingSystem: "linux", Architecture: "amd64"},
			Images: images,
		},
	}, plugds
}

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[len(s)/2]
}

func floats(xs []float64, prec int) string {
	var parts []string
	for _, x := range xs {
		parts = append(parts, strconv.FormatFloat(x, 'f', prec, 64))
	}
	return strings.Join(parts, " ")
}
