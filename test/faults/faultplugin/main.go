// Command faultplugin is a plugin that misbehaves on purpose, for plugd's
// fault suite (test/faults). It serves the kubelet's plugin registration
// service on a unix socket in -dir and misbehaves as -mode says:
//
//	ok                 a normal plugin (also the one to SIGKILL)
//	hang-getinfo       GetInfo blocks until the client gives up
//	hang-notify        NotifyRegistrationStatus blocks until the client gives up
//	silent             accepts connections on the socket and never says a word (no gRPC)
//	huge-name          GetInfo answers with a 1 MiB name
//	nul-name           GetInfo answers with NUL bytes in the name
//	many-versions      GetInfo answers with 10,000 supported versions
//	relative-endpoint  GetInfo answers with the endpoint "plugin.sock"
//
// Like the plugin SDK, it listens on a dot-name (which managers ignore) and
// renames the socket into place, so the manager never sees a socket that is
// not accepting yet. It prints "ready" on stdout once the socket is in place,
// logs every call it gets and every status it is told on stderr, one line
// each, and on SIGTERM removes its socket (if it is still its own) and exits 0.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"log"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"google.golang.org/grpc"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
)

func main() {
	log.SetFlags(0)
	log.SetPrefix("faultplugin: ")
	if err := run(); err != nil {
		log.Print(err)
		os.Exit(1)
	}
}

func run() error {
	mode := flag.String("mode", "ok", "how to misbehave: ok, hang-getinfo, hang-notify, silent, huge-name, nul-name, many-versions, relative-endpoint")
	dir := flag.String("dir", "", "registry directory to put the socket in (required)")
	typ := flag.String("type", "example.com/Fault", "plugin type sent in GetInfo")
	name := flag.String("name", "fault", "plugin name sent in GetInfo (modes that break the name start from it)")
	socket := flag.String("socket", "", "file name of the socket in -dir; empty means -name + \".sock\"")
	endpoint := flag.String("endpoint", "", "endpoint sent in GetInfo by the modes that keep it (ok, hang-*); empty means the socket")
	flag.Parse()
	if *dir == "" {
		return errors.New("-dir is required")
	}
	if *socket == "" {
		*socket = *name + ".sock"
	}
	info, err := infoFor(*mode, *typ, *name, *endpoint)
	if err != nil {
		return err
	}

	path := filepath.Join(*dir, *socket)
	tmp := filepath.Join(*dir, "."+*socket+".tmp")
	_ = os.Remove(tmp)
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: tmp, Net: "unix"})
	if err != nil {
		return err
	}
	// The socket is renamed and removed by path below; closing the listener
	// must not remove whatever is at the temporary name by then.
	l.SetUnlinkOnClose(false)
	if err := os.Rename(tmp, path); err != nil {
		l.Close()
		_ = os.Remove(tmp)
		return err
	}
	mine, err := os.Lstat(path)
	if err != nil {
		l.Close()
		return err
	}

	var stop func()
	if *mode == "silent" {
		stop = serveSilently(l)
	} else {
		srv := grpc.NewServer()
		registerapi.RegisterRegistrationServer(srv, &registration{mode: *mode, info: info})
		served := make(chan struct{})
		go func() {
			defer close(served)
			if err := srv.Serve(l); err != nil {
				log.Printf("serve: %v", err)
			}
		}()
		stop = func() {
			srv.Stop() // cancels hanging calls, closes every connection
			<-served
		}
	}

	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, os.Interrupt)
	fmt.Println("ready")
	<-sig

	// Remove the socket first, and only if it is still ours: the manager then
	// sees the plugin go, and a successor's socket at the same path is left alone.
	if fi, err := os.Lstat(path); err == nil && os.SameFile(fi, mine) {
		if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
			log.Printf("removing socket: %v", err)
		}
	}
	stop()
	log.Print("stopped")
	return nil
}

// infoFor is what GetInfo answers in mode.
func infoFor(mode, typ, name, endpoint string) (*registerapi.PluginInfo, error) {
	info := &registerapi.PluginInfo{Type: typ, Name: name, Endpoint: endpoint, SupportedVersions: []string{"1.0.0"}}
	switch mode {
	case "ok", "hang-getinfo", "hang-notify", "silent":
	case "huge-name":
		info.Name = strings.Repeat("n", 1<<20)
	case "nul-name":
		info.Name = name + "\x00\x00evil"
	case "many-versions":
		// Distinct and short (base 36, at most 3 characters), so that the
		// answer (about 49 KB) stays under a 64 KiB message cap and it is the
		// count that breaks a rule, not the size.
		info.SupportedVersions = make([]string, 10000)
		for i := range info.SupportedVersions {
			info.SupportedVersions[i] = strconv.FormatInt(int64(i), 36)
		}
	case "relative-endpoint":
		info.Endpoint = "plugin.sock"
	default:
		return nil, fmt.Errorf("unknown -mode %q", mode)
	}
	return info, nil
}

// registration serves the Registration service for every mode but silent.
type registration struct {
	registerapi.UnimplementedRegistrationServer
	mode string
	info *registerapi.PluginInfo
}

func (r *registration) GetInfo(ctx context.Context, _ *registerapi.InfoRequest) (*registerapi.PluginInfo, error) {
	if r.mode == "hang-getinfo" {
		log.Print("GetInfo: hanging")
		<-ctx.Done()
		log.Printf("GetInfo: the client gave up: %v", ctx.Err())
		return nil, ctx.Err()
	}
	log.Print("GetInfo: answered")
	return r.info, nil
}

func (r *registration) NotifyRegistrationStatus(ctx context.Context, st *registerapi.RegistrationStatus) (*registerapi.RegistrationStatusResponse, error) {
	// %q keeps a reason on one line whatever it holds.
	log.Printf("notified registered=%v error=%q", st.GetPluginRegistered(), st.GetError())
	if r.mode == "hang-notify" {
		log.Print("NotifyRegistrationStatus: hanging")
		<-ctx.Done()
		log.Printf("NotifyRegistrationStatus: the client gave up: %v", ctx.Err())
		return nil, ctx.Err()
	}
	return &registerapi.RegistrationStatusResponse{}, nil
}

// serveSilently accepts connections on l and never writes a byte: to a gRPC
// client it is a server that never finishes the HTTP/2 handshake. Each
// connection is read (and the bytes dropped) until the client closes it. The
// function returned closes the listener and every connection still open.
func serveSilently(l net.Listener) (stop func()) {
	var (
		mu    sync.Mutex
		conns = map[net.Conn]bool{}
		wg    sync.WaitGroup
	)
	wg.Go(func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			log.Print("silent: accepted a connection")
			mu.Lock()
			conns[c] = true
			mu.Unlock()
			wg.Go(func() {
				_, _ = io.Copy(io.Discard, c)
				c.Close()
				mu.Lock()
				delete(conns, c)
				mu.Unlock()
				log.Print("silent: the client closed its connection")
			})
		}
	})
	return func() {
		l.Close()
		mu.Lock()
		for c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	}
}
