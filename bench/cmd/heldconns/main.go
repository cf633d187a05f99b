// Command heldconns measures what holding one connection per plugin costs
// the manager's process, for each transport plugd could hold them with
// (issue 12): unaryconn held idle and unwatched (the floor), unaryconn with
// Watch (on Linux one epoll set for all, what plugd does there), unaryconn
// with Watch and a goroutine per connection (what plugd does on other
// platforms), the
// standard library's HTTP/2 client (one http.Transport,
// Transport.NewClientConn per plugin), and a grpc-go ClientConn per plugin.
//
//	cd bench && go run ./cmd/heldconns                  # 1000 and 5000 connections, 3 runs
//	cd bench && go run ./cmd/heldconns -n 100 -runs 1   # a smoke test (CI)
//
// A grpc-go server of the registration service runs in a child process;
// each measurement is a fresh client process that dials n connections to it,
// makes one GetInfo on each, keeps them all open, waits for things to
// settle (-settle), collects garbage, and reports its resident memory
// (VmRSS), heap and stacks in use, and goroutines. The same with n = 0 is
// the process's own base, which the per-connection figures leave out. The
// table shows medians over runs.
package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"

	"github.com/plugd/plugd/internal/unaryconn"
)

// The transports measured.
const (
	unaryHeld   = "unaryconn"
	unaryWatch  = "unaryconn+Watch"
	unaryWatchG = "unaryconn+Watch, goroutine each"
	stdHTTP2    = "net/http HTTP/2"
	grpcGo      = "grpc-go"
)

var transports = []string{unaryHeld, unaryWatch, unaryWatchG, stdHTTP2, grpcGo}

const getInfo = "/pluginregistration.Registration/GetInfo"

// sample is what one client process reports.
type sample struct {
	Transport  string  `json:"transport"`
	N          int     `json:"n"`
	RSSMiB     float64 `json:"rss_mib"`
	HeapMiB    float64 `json:"heap_inuse_mib"`
	StackMiB   float64 `json:"stack_inuse_mib"`
	Goroutines int     `json:"goroutines"`
}

func main() {
	serve := flag.String("serve", "", "(internal) serve the registration service on this socket")
	client := flag.String("client", "", "(internal) hold connections with this transport and report")
	sock := flag.String("sock", "", "(internal) the server's socket")
	counts := flag.String("n", "1000,5000", "connection counts, comma-separated")
	runs := flag.Int("runs", 3, "runs of every measurement; the table shows medians")
	settle := flag.Duration("settle", 2*time.Second, "how long a client waits, its connections held, before it measures")
	jsonPath := flag.String("json", "", "also write every sample and the medians to this file")
	flag.Parse()
	var err error
	switch {
	case *serve != "":
		err = runServer(*serve)
	case *client != "":
		n, _ := strconv.Atoi(flag.Arg(0))
		err = runClient(*client, *sock, n, *settle)
	default:
		err = run(*counts, *runs, *settle, *jsonPath)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "heldconns:", err)
		os.Exit(1)
	}
}

type registration struct {
	registerapi.UnimplementedRegistrationServer
}

func (registration) GetInfo(context.Context, *registerapi.InfoRequest) (*registerapi.PluginInfo, error) {
	return &registerapi.PluginInfo{Type: "CSIPlugin", Name: "held.example.com", SupportedVersions: []string{"1.0.0"}}, nil
}

func runServer(sock string) error {
	l, err := net.Listen("unix", sock)
	if err != nil {
		return err
	}
	s := grpc.NewServer()
	registerapi.RegisterRegistrationServer(s, registration{})
	return s.Serve(l)
}

// run starts the server and a client process per measurement.
func run(counts string, runs int, settle time.Duration, jsonPath string) error {
	ns := []int{0}
	for f := range strings.SplitSeq(counts, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n <= 0 {
			return fmt.Errorf("-n: %q is not a positive count", f)
		}
		ns = append(ns, n)
	}
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "heldconns")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	sock := filepath.Join(dir, "registration.sock")
	srv := exec.Command(exe, "-serve", sock)
	srv.Stderr = os.Stderr
	srv.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := srv.Start(); err != nil {
		return err
	}
	defer func() {
		srv.Process.Kill()
		srv.Wait()
	}()
	if err := waitForSocket(sock); err != nil {
		return err
	}

	fmt.Printf("%d CPUs, %s; %d runs, settle %v\n", runtime.NumCPU(), runtime.Version(), runs, settle)
	var samples []sample
	for r := range runs {
		for _, n := range ns {
			order := slices.Clone(transports)
			if r%2 == 1 {
				slices.Reverse(order) // a drift of the shared machine falls on all
			}
			for _, tr := range order {
				if n == 0 && tr != transports[0] {
					continue // the base is the same process, whatever it would have held
				}
				s, err := measure(exe, tr, sock, n, settle)
				if err != nil {
					return fmt.Errorf("run %d, %s, %d connections: %w", r+1, tr, n, err)
				}
				fmt.Fprintf(os.Stderr, "run %d: %-16s n=%-5d rss %6.1f MiB  heap %6.1f MiB  stacks %5.1f MiB  goroutines %d\n",
					r+1, tr, n, s.RSSMiB, s.HeapMiB, s.StackMiB, s.Goroutines)
				samples = append(samples, s)
			}
		}
	}
	rows := report(samples, ns[1:])
	if jsonPath != "" {
		b, _ := json.MarshalIndent(map[string]any{"samples": samples, "medians": rows}, "", "  ")
		return os.WriteFile(jsonPath, append(b, '\n'), 0o644)
	}
	return nil
}

func waitForSocket(path string) error {
	for range 200 {
		if c, err := net.Dial("unix", path); err == nil {
			c.Close()
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("the server did not listen on %s within 10s", path)
}

// measure runs one client process.
func measure(exe, transport, sock string, n int, settle time.Duration) (sample, error) {
	cmd := exec.Command(exe, "-client", transport, "-sock", sock, "-settle", settle.String(), strconv.Itoa(n))
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	out, err := cmd.Output()
	if err != nil {
		return sample{}, fmt.Errorf("%v: %s", err, bytes.TrimSpace(stderr.Bytes()))
	}
	var s sample
	if err := json.Unmarshal(out, &s); err != nil {
		return sample{}, fmt.Errorf("the client's report %q: %v", out, err)
	}
	return s, nil
}

// row is a transport's medians at one count.
type row struct {
	Transport        string  `json:"transport"`
	N                int     `json:"n"`
	RSSMiB           float64 `json:"rss_mib"`
	Goroutines       int     `json:"goroutines"`
	RSSPerConnKiB    float64 `json:"rss_per_conn_kib"`
	HeapPerConnKiB   float64 `json:"heap_per_conn_kib"`
	StackPerConnKiB  float64 `json:"stack_per_conn_kib"`
	GoroutinesPerCon float64 `json:"goroutines_per_conn"`
}

func report(samples []sample, ns []int) []row {
	med := func(tr string, n int, f func(sample) float64) float64 {
		var v []float64
		for _, s := range samples {
			if s.N == n && (s.Transport == tr || n == 0) {
				v = append(v, f(s))
			}
		}
		slices.Sort(v)
		if len(v) == 0 {
			return 0
		}
		if len(v)%2 == 1 {
			return v[len(v)/2]
		}
		return (v[len(v)/2-1] + v[len(v)/2]) / 2
	}
	rss := func(s sample) float64 { return s.RSSMiB }
	heap := func(s sample) float64 { return s.HeapMiB }
	stack := func(s sample) float64 { return s.StackMiB }
	gor := func(s sample) float64 { return float64(s.Goroutines) }
	base := map[string]float64{"rss": med("", 0, rss), "heap": med("", 0, heap), "stack": med("", 0, stack), "g": med("", 0, gor)}
	fmt.Printf("\nbase (no connection): RSS %.1f MiB, heap %.1f MiB, stacks %.2f MiB, %v goroutines\n\n", base["rss"], base["heap"], base["stack"], base["g"])
	fmt.Println("| transport | connections | RSS (MiB) | goroutines | RSS per conn (KiB) | heap per conn (KiB) | stack per conn (KiB) |")
	fmt.Println("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
	var rows []row
	for _, n := range ns {
		for _, tr := range transports {
			perConn := func(f func(sample) float64, b float64) float64 { return (med(tr, n, f) - b) * 1024 / float64(n) }
			r := row{
				Transport: tr, N: n, RSSMiB: med(tr, n, rss), Goroutines: int(med(tr, n, gor)),
				RSSPerConnKiB:    perConn(rss, base["rss"]),
				HeapPerConnKiB:   perConn(heap, base["heap"]),
				StackPerConnKiB:  perConn(stack, base["stack"]),
				GoroutinesPerCon: (med(tr, n, gor) - base["g"]) / float64(n),
			}
			rows = append(rows, r)
			fmt.Printf("| %s | %d | %.1f | %d | %.1f | %.1f | %.2f |\n", r.Transport, n, r.RSSMiB, r.Goroutines, r.RSSPerConnKiB, r.HeapPerConnKiB, r.StackPerConnKiB)
		}
	}
	return rows
}

// runClient holds n connections with transport, then reports a sample as
// JSON on stdout.
func runClient(transport, sock string, n int, settle time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	held, err := hold(ctx, transport, sock, n)
	if err != nil {
		return err
	}
	time.Sleep(settle)
	runtime.GC()
	runtime.GC() // and what the first one's finalizers freed
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	s := sample{
		Transport: transport, N: n,
		RSSMiB:     rssMiB(),
		HeapMiB:    float64(ms.HeapInuse) / (1 << 20),
		StackMiB:   float64(ms.StackInuse) / (1 << 20),
		Goroutines: runtime.NumGoroutine(),
	}
	runtime.KeepAlive(held)
	return json.NewEncoder(os.Stdout).Encode(s)
}

// hold opens n connections with transport, each with one GetInfo made.
func hold(ctx context.Context, transport, sock string, n int) ([]any, error) {
	held := make([]any, 0, n)
	tr := &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", sock)
	}}
	tr.Protocols = new(http.Protocols)
	tr.Protocols.SetUnencryptedHTTP2(true)
	// Held as long as the process lives: never closed.
	poller := unaryconn.NewPoller(unaryconn.PollerOptions{Goroutines: transport == unaryWatchG})
	for range n {
		switch transport {
		case unaryHeld, unaryWatch, unaryWatchG:
			c, err := unaryconn.Dial(ctx, sock)
			if err != nil {
				return nil, err
			}
			if err := c.Invoke(ctx, getInfo, &registerapi.InfoRequest{}, &registerapi.PluginInfo{}, 1<<16); err != nil {
				return nil, err
			}
			if transport != unaryHeld {
				if err := c.Watch(poller, func(err error) { fmt.Fprintln(os.Stderr, "hang-up:", err) }); err != nil {
					return nil, err
				}
			}
			held = append(held, c)
		case stdHTTP2:
			cc, err := tr.NewClientConn(ctx, "http", "plugin:80")
			if err != nil {
				return nil, err
			}
			if err := stdGetInfo(ctx, cc); err != nil {
				return nil, err
			}
			held = append(held, cc)
		case grpcGo:
			cc, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				return nil, err
			}
			if _, err := registerapi.NewRegistrationClient(cc).GetInfo(ctx, &registerapi.InfoRequest{}); err != nil {
				return nil, err
			}
			held = append(held, cc)
		default:
			return nil, fmt.Errorf("unknown transport %q", transport)
		}
	}
	return held, nil
}

// stdGetInfo is GetInfo over the standard library's HTTP/2 client, as a
// gRPC implementation on top of it would make it (connectrpc, say).
func stdGetInfo(ctx context.Context, cc *http.ClientConn) error {
	body, _ := proto.Marshal(&registerapi.InfoRequest{})
	msg := append(binary.BigEndian.AppendUint32([]byte{0}, uint32(len(body))), body...)
	req, _ := http.NewRequestWithContext(ctx, "POST", "http://plugin"+getInfo, bytes.NewReader(msg))
	req.Header.Set("content-type", "application/grpc")
	req.Header.Set("te", "trailers")
	resp, err := cc.RoundTrip(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if _, err := io.Copy(io.Discard, resp.Body); err != nil {
		return err
	}
	if st := resp.Trailer.Get("grpc-status"); st != "0" {
		return errors.New("GetInfo: grpc-status " + st)
	}
	return nil
}

func rssMiB() float64 {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			kb, _ := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 64)
			return kb / 1024
		}
	}
	return 0
}
