package daemon

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/plugd/plugd/api"
	"github.com/plugd/plugd/cmd/internal/version"
	"github.com/plugd/plugd/cmd/plugd/internal/doctor"
	"github.com/plugd/plugd/cmd/plugd/internal/kubenode"
	"github.com/plugd/plugd/pluginmanager"
)

// Bounds on the event streams, which anyone who can reach the status API can
// open: each holds a buffer of events, so their number and size are capped.
const (
	maxReplay  = 1000 // ?replay= at most; plugd keeps 1024 recent events
	maxStreams = 64   // event streams open at once
	// maxClientStreams is how many of them one client may hold: a uid on
	// the unix socket, an address over TCP.
	maxClientStreams = 16
	// reservedStreams are kept for clients that hold none: a client's
	// second and later streams are refused once no more than these are
	// free, so the last 16 streams go to 16 different clients. Clients
	// that open streams and never read them need 19 uids (or addresses)
	// between them to take every stream, where 4 were enough.
	reservedStreams = 16
	streamBuffer    = 256 // events a stream may fall behind before it is told it lost some
	writeDeadline   = 10 * time.Second
	maxDoctors      = 2                // doctor runs (GET /v1/findings) at once; each dials sockets
	doctorTimeout   = 10 * time.Second // bound on one doctor run
	// answerWait is how long an answer may wait for its turn to be built
	// (see bounded) before it is a 503.
	answerWait = 2 * time.Second
)

// Handler is the status API (see package api for the endpoints).
func (d *Daemon) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/plugins", d.bounded(d.listPlugins))
	mux.HandleFunc("GET /v1/plugins/{id...}", d.bounded(d.getPlugin))
	mux.HandleFunc("GET /v1/events", d.streamEvents)
	mux.HandleFunc("GET /v1/findings", d.findings)
	mux.HandleFunc("GET /v1/version", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, api.Version{Version: version.String(), GoVersion: runtime.Version(), RegistryDir: d.Config().RegistryDir})
	})
	// Uncompressed: a gzip writer costs most of a megabyte while a slow
	// client reads, and the metrics are a few kilobytes on a node.
	mux.HandleFunc("GET /metrics", d.bounded(promhttp.HandlerFor(d.metrics,
		promhttp.HandlerOpts{ErrorLog: slogPrinter{d}, DisableCompression: true}).ServeHTTP))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-d.m.Synced():
			writeJSON(w, http.StatusOK, map[string]string{"status": "ready"})
		default:
			writeError(w, http.StatusServiceUnavailable, "not ready: the registry directory has not been scanned yet")
		}
	})
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			// Every endpoint is read-only; a known path gets a 405, not a 404.
			if _, pattern := mux.Handler(&http.Request{Method: http.MethodGet, URL: r.URL, Host: r.Host}); pattern != "/" {
				w.Header().Set("Allow", "GET, HEAD")
				writeError(w, http.StatusMethodNotAllowed, fmt.Sprintf("%s %s: the status API is read-only; use GET", r.Method, r.URL.Path))
				return
			}
		}
		writeError(w, http.StatusNotFound, fmt.Sprintf("no such endpoint: %s %s; see /v1/plugins, /v1/events, /v1/findings, /v1/version, /metrics, /healthz, /readyz", r.Method, r.URL.Path))
	})
	return mux
}

func (d *Daemon) listPlugins(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	typ, name, state := q.Get("type"), q.Get("name"), q.Get("state")
	if state != "" && !slices.Contains(api.States(), state) {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("state %q is not one of %v", state, api.States()))
		return
	}
	dir := d.Config().RegistryDir
	list := api.PluginList{Plugins: []api.Plugin{}}
	for _, s := range d.m.Plugins() {
		if (typ == "" || s.Type == typ) && (name == "" || s.Name == name) && (state == "" || string(s.State) == state) {
			p := toAPI(dir, s)
			p.Details = d.details(s.Plugin)
			p.Kubelet, p.Holds = d.kubeletView(s), d.holds(s)
			list.Plugins = append(list.Plugins, p)
		}
	}
	writeJSON(w, http.StatusOK, list)
}

func (d *Daemon) getPlugin(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	dir := d.Config().RegistryDir
	for _, s := range d.m.Plugins() {
		if p := toAPI(dir, s); p.ID == id {
			p.Details = d.details(s.Plugin)
			p.Kubelet, p.Holds = d.kubeletView(s), d.holds(s)
			writeJSON(w, http.StatusOK, p)
			return
		}
	}
	writeError(w, http.StatusNotFound, fmt.Sprintf("no plugin %q: an ID is a socket's path inside %s, as GET /v1/plugins lists them", id, dir))
}

// findings runs the doctor's checks of the plugins and the node.
func (d *Daemon) findings(w http.ResponseWriter, r *http.Request) {
	select {
	case d.doctors <- struct{}{}:
		defer func() { <-d.doctors }()
	default:
		writeError(w, http.StatusServiceUnavailable, fmt.Sprintf("%d doctor runs are under way; retry when one is done", maxDoctors))
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), doctorTimeout)
	defer cancel()
	cfg := d.Config()
	in := doctor.Input{RegistryDir: cfg.RegistryDir, KubeletRoots: cfg.Doctor.KubeletRoots,
		Observe: cfg.Mode == "observe", AllowWritableDir: cfg.Policy.AllowWritableRegistryDir}
	if cfg.Doctor.ProcDir != "none" {
		in.ProcDir = cfg.Doctor.ProcDir
	}
	for _, e := range cfg.Expect {
		x := doctor.Expected{Type: e.Type, Name: e.Name}
		if len(e.AnyOf) > 0 {
			x.Type = kubenode.TypeAnyOf
			for _, a := range e.AnyOf {
				x.AnyOf = append(x.AnyOf, doctor.Expected{Type: a.Type, Name: a.Name})
			}
		}
		if d.kube != nil {
			x.Condition = e.Condition // only written with Kubernetes
		}
		in.Expect = append(in.Expect, x)
	}
	for _, s := range d.m.Plugins() {
		kubelet := d.kubeletView(s)
		s, remembered := identify(s)
		in.Plugins = append(in.Plugins, doctor.Target{Socket: s.Socket, Type: s.Type, Name: s.Name, Endpoint: s.Endpoint,
			Versions: s.Versions, State: string(s.State), Reason: string(s.Reason), LastError: s.LastError, Created: s.Created,
			Answering: answering(s), Remembered: remembered, Kubelet: kubelet})
	}
	if d.kube != nil {
		for _, p := range d.kube.Problems() {
			in.Kubernetes = append(in.Kubernetes, doctor.KubernetesProblem{Operation: p.Operation, Reason: p.Reason,
				Message: p.Message, Permission: p.Permission, Since: p.Since})
		}
		in.Kubelet, in.Conditions, in.StaleCSINode = d.kubeletTruth()
		if k := cfg.Kubernetes; k != nil {
			in.NodeName = k.NodeName
		}
		select {
		case <-d.m.Synced():
			// Slices are held against the sockets: only once every socket
			// of the registry directory is known.
			in.DRASlices, _ = d.kube.DriverSlices() // a read problem is among Problems
		default:
		}
		if cf := d.kube.Confinement(ctx); cf.Known {
			in.Confinement = &doctor.Confinement{Confined: cf.Confined, NoClaim: cf.NoClaim, Message: cf.Message, At: cf.At}
		}
	}
	list := api.FindingList{Findings: doctor.Check(ctx, in)}
	if list.Findings == nil {
		list.Findings = []api.Finding{}
	}
	writeJSON(w, http.StatusOK, list)
}

// streamEvents writes events as JSON lines until the client goes away or
// plugd stops. ?replay=N starts with up to N recent events.
func (d *Daemon) streamEvents(w http.ResponseWriter, r *http.Request) {
	replay := 0
	if v := r.URL.Query().Get("replay"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 || n > maxReplay {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("replay %q must be a number from 0 to %d", v, maxReplay))
			return
		}
		replay = n
	}
	peer := "local"
	if c := connOf(r); c != nil {
		peer = c.peer
	}
	if status, msg := d.openStream(peer); status != 0 {
		w.Header().Set("Retry-After", "1")
		writeError(w, status, msg)
		return
	}
	defer d.closeStream(peer)
	sub := d.m.SubscribeWithReplay(replay)
	defer sub.Close()
	dir := d.Config().RegistryDir
	rc := http.NewResponseController(w)
	// A reader that stops reading must not hold a write (and so shutdown)
	// up: every write has a deadline, and the end of the request cuts the
	// one under way.
	cut := make(chan struct{})
	stop := context.AfterFunc(r.Context(), func() { rc.SetWriteDeadline(time.Now()); close(cut) })
	defer stop()
	// end lets the stream end as a stream does (net/http writes the last
	// chunk after we return), so that a client reading it sees plugd end
	// it, not a broken answer: the cut above, if it came, is over, and the
	// last chunk gets a moment of its own.
	end := func() {
		if !stop() {
			<-cut
		}
		rc.SetWriteDeadline(time.Now().Add(time.Second))
	}
	rc.SetWriteDeadline(time.Now().Add(writeDeadline))
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.WriteHeader(http.StatusOK)
	if err := rc.Flush(); err != nil {
		return
	}
	enc := json.NewEncoder(w)
	for {
		select {
		case <-r.Context().Done():
			end()
			return
		case ev, ok := <-sub.Events():
			if !ok {
				end()
				return // the manager stopped
			}
			out := api.Event{Seq: ev.Seq, Time: ev.Time, Type: string(ev.Type), Missed: ev.Missed}
			if ev.Type != pluginmanager.EventLost {
				out.Plugin = toAPI(dir, pluginmanager.PluginStatus{Plugin: ev.Plugin, State: ev.State, Reason: ev.Reason,
					LastError: ev.Error, Attempts: ev.Attempt, NextRetry: ev.NextRetry})
			}
			rc.SetWriteDeadline(time.Now().Add(writeDeadline))
			if enc.Encode(out) != nil || rc.Flush() != nil {
				return
			}
		}
	}
}

// bounded serves h's answer from memory, so that what clients that do not
// read can make plugd hold is bounded: per listener, one answer is built at
// a time, and the answers being written share a budget of answerBudget
// bytes; each write has writeDeadline. When the budget has no room for an
// answer of the size h's last one had, the client is told at once (503),
// without building it: a flood is turned away as fast as it comes, and
// what does not use the budget (/healthz, /readyz) is answered meanwhile.
func (d *Daemon) bounded(h http.HandlerFunc) http.HandlerFunc {
	var last atomic.Int64 // the size of h's last answer
	return func(w http.ResponseWriter, r *http.Request) {
		a := d.answers
		if c := connOf(r); c != nil {
			a = c.l.answers
		}
		if !a.budget.fits(int(last.Load())) {
			writeBusy(w)
			return
		}
		ctx, cancel := context.WithTimeout(r.Context(), answerWait)
		defer cancel()
		select {
		case a.building <- struct{}{}:
		case <-ctx.Done():
			writeBusy(w)
			return
		}
		ans := &heldAnswer{header: w.Header(), status: http.StatusOK}
		ans.body.Grow(int(last.Load()))
		h(ans, r)
		body := ans.body.Bytes()
		if cap(body) > len(body)+len(body)/8 {
			body = bytes.Clone(body) // what the budget counts is what is held
		}
		ans.body = bytes.Buffer{}
		last.Store(int64(len(body)))
		release, ok := a.budget.take(cap(body))
		<-a.building
		if !ok {
			writeBusy(w)
			return
		}
		defer release()
		http.NewResponseController(w).SetWriteDeadline(time.Now().Add(writeDeadline))
		w.Header().Set("Content-Length", strconv.Itoa(len(body)))
		w.WriteHeader(ans.status)
		w.Write(body)
	}
}

func writeBusy(w http.ResponseWriter) {
	w.Header().Set("Retry-After", "1")
	writeError(w, http.StatusServiceUnavailable, fmt.Sprintf(
		"the status API is busy: answers to clients that read them slowly or not at all hold its %d MiB; retry in a moment", answerBudget>>20))
}

// heldAnswer is an answer kept in memory until bounded writes it.
type heldAnswer struct {
	header http.Header
	status int
	body   bytes.Buffer
}

func (a *heldAnswer) Header() http.Header         { return a.header }
func (a *heldAnswer) WriteHeader(status int)      { a.status = status }
func (a *heldAnswer) Write(b []byte) (int, error) { return a.body.Write(b) }

// openStream counts a stream of peer's, or returns why it may not open
// one, with the HTTP status that says so: 429 when peer has its share, 503
// when every stream is taken. A client may hold maxClientStreams, and its
// second and later streams only while more than reservedStreams are free.
func (d *Daemon) openStream(peer string) (status int, msg string) {
	d.streamsMu.Lock()
	defer d.streamsMu.Unlock()
	held, free := d.streamsBy[peer], maxStreams-d.streamsOpen
	switch {
	case held >= maxClientStreams:
		return http.StatusTooManyRequests, fmt.Sprintf("this client (%s) has %d event streams open, the most one client may have; close one and retry", peer, maxClientStreams)
	case free <= 0:
		return http.StatusServiceUnavailable, fmt.Sprintf("too many event streams open (%d); close one and retry", maxStreams)
	case held > 0 && free <= reservedStreams:
		return http.StatusTooManyRequests, fmt.Sprintf("this client (%s) has %d event streams open, and the last %d of plugd's %d are kept for clients that have none; close one and retry", peer, held, reservedStreams, maxStreams)
	}
	d.streamsBy[peer]++
	d.streamsOpen++
	return 0, ""
}

func (d *Daemon) closeStream(peer string) {
	d.streamsMu.Lock()
	defer d.streamsMu.Unlock()
	d.streamsOpen--
	if d.streamsBy[peer]--; d.streamsBy[peer] <= 0 {
		delete(d.streamsBy, peer)
	}
}

// toAPI is a socket's status as the API shows it.
func toAPI(dir string, s pluginmanager.PluginStatus) api.Plugin {
	id, err := filepath.Rel(dir, s.Socket)
	if err != nil {
		id = s.Socket
	}
	return api.Plugin{
		ID: id, Type: s.Type, Name: s.Name, Endpoint: s.Endpoint, Versions: s.Versions, Socket: s.Socket,
		State: string(s.State), Reason: string(s.Reason), LastError: s.LastError, Attempts: s.Attempts,
		NextRetry: s.NextRetry, Discovered: s.Discovered, RegisteredSince: s.RegisteredSince, Newest: s.Newest,
		Created: s.Created, UnhealthySince: s.UnhealthySince,
	}
}

// writeJSON writes v as indented JSON, within writeDeadline: a client that
// does not read its answer does not hold it (and its connection) for longer.
func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	http.NewResponseController(w).SetWriteDeadline(time.Now().Add(writeDeadline))
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.Encode(v)
}

// writeError is every error answer: a JSON api.Error with the status code.
func writeError(w http.ResponseWriter, status int, msg string) {
	writeJSON(w, status, api.Error{Message: msg})
}

// slogPrinter lets promhttp report errors through the daemon's logger.
type slogPrinter struct{ d *Daemon }

func (p slogPrinter) Println(v ...any) { p.d.log.Warn("serving metrics", "err", fmt.Sprint(v...)) }

// kubeletTruth is what the node agent knows of the running kubelet, the
// Node's conditions and CSINode's stale entries, for the doctor.
func (d *Daemon) kubeletTruth() (*doctor.KubeletAccess, []doctor.Condition, []doctor.StaleEntry) {
	k := d.kube.Kubelet()
	ka := &doctor.KubeletAccess{Address: k.Address, Live: k.Live, Started: k.Started, Restarted: k.Restarted, Version: k.Version}
	if p := k.Problem; p != nil {
		ka.Reason, ka.Message, ka.Permission, ka.Since = p.Reason, p.Message, p.Permission, p.Since
	}
	var conds []doctor.Condition
	for _, c := range d.kube.Conditions() {
		dc := doctor.Condition{Type: c.Expectation.Type, Name: c.Expectation.Name, Condition: c.Expectation.Condition, Pending: c.Pending}
		if a := c.Actual; a != nil {
			dc.Status, dc.Reason, dc.Message = string(a.Status), a.Reason, a.Message
			dc.Heartbeat, dc.Transition = a.LastHeartbeatTime.Time, a.LastTransitionTime.Time
		}
		if w := c.Want; w != nil {
			dc.WantStatus, dc.WantReason, dc.WantMessage = string(w.Status), w.Reason, w.Message
		}
		conds = append(conds, dc)
	}
	var stale []doctor.StaleEntry
	entries, more := d.kube.StaleCSINodeEntries()
	for _, e := range entries {
		stale = append(stale, doctor.StaleEntry{Driver: e.Driver, NodeID: e.NodeID, Remedy: e.Remedy})
	}
	if more > 0 {
		stale = append(stale, doctor.StaleEntry{More: more})
	}
	return ka, conds, stale
}
