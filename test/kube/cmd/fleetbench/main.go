//go:build linux

// Command fleetbench measures kubectl plugd cluster on a large cluster: it
// starts the real etcd and kube-apiserver of package controlplane, creates
// Nodes as large as real ones (the kubelet's conditions, addresses, node
// info, capacity, some 50 images with their digests, labels, and plugd's
// conditions for three expected plugins; about 20 KB each as JSON), and
// at each size (-nodes, growing) runs kubectl-plugd cluster -o json
// -runs times, recording its wall time and its peak resident memory (the
// kernel's maxrss of the process). Nodes are created once and kept as the
// fleet grows.
//
//	cd test/kube && go run ./cmd/fleetbench                      # 100, 1000, 5000, 15000 nodes
//	cd test/kube && go run ./cmd/fleetbench -nodes 200 -runs 1   # the smoke run CI makes
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
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

// Result is one size's measurements.
type Result struct {
	Nodes     int       `json:"nodes"`
	NodeBytes int       `json:"nodeBytes"` // one Node as JSON, as the API server serves it (managedFields included)
	Seconds   []float64 `json:"seconds"`
	PeakRSSMB []float64 `json:"peakRSSMB"`
	// CPUSeconds is the command's own CPU time (user and system): the
	// rest of its wall time it waits for the API server.
	CPUSeconds []float64 `json:"cpuSeconds"`
	// Ready and Expected are what the command counted for the first
	// expected plugin, checked against what was created.
	Ready, Expected int
}

func main() {
	sizes := flag.String("nodes", "100,1000,5000,15000", "fleet sizes to measure, growing")
	runs := flag.Int("runs", 3, "runs of kubectl plugd cluster at each size")
	workers := flag.Int("workers", 8, "Nodes created at once")
	out := flag.String("json", "", "write the results as JSON to this file")
	extra := flag.String("flags", "", "more flags for kubectl plugd cluster, e.g. --disable-compression")
	flag.Parse()
	var ns []int
	for s := range strings.SplitSeq(*sizes, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n <= 0 || len(ns) > 0 && n < ns[len(ns)-1] {
			fail("-nodes %q: give growing counts, such as 100,1000", *sizes)
		}
		ns = append(ns, n)
	}
	if err := run(ns, *runs, *workers, *out, strings.Fields(*extra)); err != nil {
		fail("%v", err)
	}
}

func fail(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "fleetbench: "+format+"\n", args...)
	os.Exit(1)
}

func run(sizes []int, runs, workers int, out string, extra []string) error {
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

	var results []Result
	have := 0
	for _, n := range sizes {
		start := time.Now()
		if err := create(ctx, client, have, n, workers); err != nil {
			return err
		}
		fmt.Fprintf(os.Stderr, "created nodes %d to %d in %s\n", have, n, time.Since(start).Round(time.Millisecond))
		last, _ := node(n - 1)
		served, err := client.CoreV1().RESTClient().Get().AbsPath("/api/v1/nodes", last.Name).SetHeader("Accept", "application/json").DoRaw(ctx)
		if err != nil {
			return err
		}
		nodeBytes := len(served)
		have = n
		r := Result{Nodes: n, NodeBytes: nodeBytes}
		for range runs {
			secs, cpu, rss, v, err := measure(filepath.Join(dirs.Bin, "kubectl-plugd"), kubeconfig, extra)
			if err != nil {
				return err
			}
			r.Seconds = append(r.Seconds, secs)
			r.PeakRSSMB = append(r.PeakRSSMB, rss)
			r.CPUSeconds = append(r.CPUSeconds, cpu)
			r.Ready, r.Expected = v.Plugins[0].Ready, v.Plugins[0].Expected
			if v.Nodes != n || r.Expected != n || r.Ready != n-notReady(n) {
				return fmt.Errorf("at %d nodes kubectl plugd cluster counted %d nodes, %s ready on %d of %d; want %d of %d",
					n, v.Nodes, v.Plugins[0].Name, r.Ready, r.Expected, n-notReady(n), n)
			}
		}
		fmt.Fprintf(os.Stderr, "%6d nodes of %d bytes: %s s (CPU %s s), peak RSS %s MB\n", n, nodeBytes, floats(r.Seconds, 2), floats(r.CPUSeconds, 2), floats(r.PeakRSSMB, 0))
		results = append(results, r)
	}
	fmt.Printf("| nodes | kubectl plugd cluster: time (median of %d) | its CPU time | peak RSS |\n|---:|---:|---:|---:|\n", runs)
	for _, r := range results {
		fmt.Printf("| %d | %.2f s | %.2f s | %.0f MB |\n", r.Nodes, median(r.Seconds), median(r.CPUSeconds), median(r.PeakRSSMB))
	}
	if out != "" {
		b, err := json.MarshalIndent(map[string]any{"goVersion": runtime.Version(), "cores": runtime.NumCPU(), "results": results}, "", "  ")
		if err != nil {
			return err
		}
		return os.WriteFile(out, append(b, '\n'), 0o644)
	}
	return nil
}

// measure runs kubectl plugd cluster -o json once: its wall time, its CPU
// time, its peak RSS in MB, and what it printed.
func measure(bin, kubeconfig string, extra []string) (float64, float64, float64, nodecond.ClusterView, error) {
	var v nodecond.ClusterView
	cmd := exec.Command(bin, append([]string{"cluster", "--kubeconfig", kubeconfig, "-o", "json"}, extra...)...)
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	start := time.Now()
	if err := cmd.Run(); err != nil {
		return 0, 0, 0, v, fmt.Errorf("kubectl plugd cluster: %v: %s", err, stderr.String())
	}
	secs := time.Since(start).Seconds()
	ru := cmd.ProcessState.SysUsage().(*syscall.Rusage)
	rss := float64(ru.Maxrss) / 1024 // KB on Linux
	cpu := time.Duration(ru.Utime.Nano() + ru.Stime.Nano()).Seconds()
	if err := json.Unmarshal([]byte(stdout.String()), &v); err != nil {
		return 0, 0, 0, v, err
	}
	if len(v.Plugins) == 0 {
		return 0, 0, 0, v, fmt.Errorf("kubectl plugd cluster found no plugin: %s", stdout.String())
	}
	return secs, cpu, rss, v, nil
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
