package hook

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/plugd/plugd/api"
	"github.com/plugd/plugd/pluginmanager"
)

// The events a hook can run on, as Config.Events names them.
const (
	eventValidate   = "validate"
	eventRegister   = "register"
	eventDeregister = "deregister"
)

// The results of a run, as Run.Result and the metrics' result label give them.
const (
	resultAccepted = "accepted"
	resultRefused  = "refused"
	resultError    = "error"
	resultTimeout  = "timeout"
)

const (
	defaultTimeout = 10 * time.Second
	// exitRefuseForGood is the exit status with which a register hook refuses
	// a plugin until its socket changes, rather than until the next retry.
	exitRefuseForGood = 3
	// maxRecords bounds how many plugins' last runs are kept. A plugin that
	// was refused and then went away is never deregistered, so its record is
	// only dropped once this many are kept.
	maxRecords = 1024
)

// Config says what a hook runs and when. Exactly one of Command and URL is set.
type Config struct {
	// Command is the program to run and its arguments, without a shell. A
	// program name without a slash is looked up in PATH when New is called.
	Command []string
	// URL is an http or https endpoint that receives a POST for each event.
	URL string
	// Timeout bounds each run. Zero means 10s. A run is always also bounded by
	// the deadline of the manager's call.
	Timeout time.Duration
	// Events are the calls that run the hook: "validate", "register" and
	// "deregister". Empty means register and deregister. A call whose event is
	// not listed accepts the plugin without running anything.
	Events []string
	// Env is extra environment for Command, as KEY=VALUE; it may override PATH
	// and HOME, but not the PLUGD_ variables. Empty means none.
	Env []string
}

// Options connect the handler to the rest of plugd. The zero value works.
type Options struct {
	// Logger receives a debug line for every run and a warning for every
	// deregister hook that does not accept. Nil discards them.
	Logger *slog.Logger
	// Registerer, if set, receives the handler's metrics.
	Registerer prometheus.Registerer
	// HTTPClient posts to Config.URL. Nil means http.DefaultClient. Its
	// Timeout, if any, applies as well as Config.Timeout.
	HTTPClient *http.Client
}

// Handler runs a hook for the events of one plugin type. Create it with New;
// its methods are safe for concurrent use, as pluginmanager.Handler requires.
type Handler struct {
	// Set by New, then only read.
	command []string // Command, with its program as the user wrote it
	program string   // Command[0] as found in PATH
	env     []string // PATH, HOME and Config.Env
	url     string
	client  *http.Client
	timeout time.Duration
	events  map[string]bool
	log     *slog.Logger
	metrics *metrics

	mu      sync.Mutex
	records map[string]*record // by socket path
}

var _ pluginmanager.Handler = (*Handler)(nil)

// record is what the handler keeps about one socket.
type record struct {
	last *Run // never nil
	// validateErr is set when the validate hook could not give an answer; the
	// Register that follows in the same attempt returns it, so that the
	// attempt is retried (see Validate).
	validateErr error
}

// Run is the record of one run of a hook, as Details returns it (plugd's
// status API type).
type Run = api.HookRun

// New returns a Handler for cfg, or an error naming the field of cfg that is
// wrong. Nothing runs until the manager calls the handler.
func New(cfg Config, opts Options) (*Handler, error) {
	h := &Handler{
		url:     cfg.URL,
		client:  opts.HTTPClient,
		timeout: cfg.Timeout,
		events:  make(map[string]bool),
		log:     opts.Logger,
		records: make(map[string]*record),
	}
	if err := h.setTarget(cfg); err != nil {
		return nil, err
	}
	if cfg.Timeout < 0 {
		return nil, fmt.Errorf("hook: timeout %s is negative", cfg.Timeout)
	}
	if h.timeout == 0 {
		h.timeout = defaultTimeout
	}
	events := cfg.Events
	if len(events) == 0 {
		events = []string{eventRegister, eventDeregister}
	}
	for i, ev := range events {
		switch ev {
		case eventValidate, eventRegister, eventDeregister:
			h.events[ev] = true
		default:
			return nil, fmt.Errorf("hook: events[%d]: unknown event %q; want validate, register or deregister", i, ev)
		}
	}
	for i, kv := range cfg.Env {
		// The value may be a secret: the error names the entry, not its text.
		if k, _, ok := strings.Cut(kv, "="); !ok || k == "" {
			return nil, fmt.Errorf("hook: env[%d] is not KEY=VALUE", i)
		}
	}
	for _, k := range []string{"PATH", "HOME"} {
		if v, ok := os.LookupEnv(k); ok {
			h.env = append(h.env, k+"="+v)
		}
	}
	h.env = append(h.env, cfg.Env...)
	if h.client == nil {
		h.client = http.DefaultClient
	}
	if h.log == nil {
		h.log = slog.New(slog.DiscardHandler)
	}
	var configured []string
	for _, ev := range []string{eventValidate, eventRegister, eventDeregister} {
		if h.events[ev] {
			configured = append(configured, ev)
		}
	}
	m, err := newMetrics(opts.Registerer, configured)
	if err != nil {
		return nil, fmt.Errorf("hook: metrics: %w", err)
	}
	h.metrics = m
	return h, nil
}

// setTarget sets what the hook runs, cfg's command or its URL, or returns
// an error naming the field that is wrong.
func (h *Handler) setTarget(cfg Config) error {
	if (len(cfg.Command) == 0) == (cfg.URL == "") {
		return errors.New("hook: set exactly one of command or url")
	}
	if len(cfg.Command) > 0 {
		if cfg.Command[0] == "" {
			return errors.New("hook: command[0] is empty; it is the program to run")
		}
		program, err := exec.LookPath(cfg.Command[0])
		if err != nil {
			return fmt.Errorf("hook: command[0]: %w", err)
		}
		h.command = slices.Clone(cfg.Command)
		h.program = program
	} else {
		// The URL may carry a token: errors say what is wrong, not what it is.
		u, err := url.Parse(cfg.URL)
		if err != nil {
			return errors.New("hook: url does not parse")
		}
		if u.Scheme != "http" && u.Scheme != "https" {
			return errors.New("hook: url must be http or https")
		}
		if u.Host == "" {
			return errors.New("hook: url has no host")
		}
		if len(cfg.Env) > 0 {
			return errors.New("hook: env is for a command; this hook has a url")
		}
	}
	return nil
}

// Validate runs the validate hook, if Config.Events has it. A refusal rejects
// the plugin. A hook that gives no answer (it fails, or runs out of time) lets
// the plugin through to Register, which returns that failure so that the
// manager retries: an error from Validate would reject the plugin for good.
// It blocks until the hook is done, at most Config.Timeout. An endpoint that
// breaks the manager's rule (pluginmanager.EndpointPath) is refused before
// any hook runs, as the manager and the other handlers refuse it.
func (h *Handler) Validate(ctx context.Context, p pluginmanager.Plugin) error {
	ep, err := pluginmanager.EndpointPath(p.Endpoint)
	if err != nil {
		return err
	}
	p.Endpoint = ep
	h.mu.Lock()
	if r := h.records[p.Socket]; r != nil {
		r.validateErr = nil // a new attempt
	}
	h.mu.Unlock()
	if !h.events[eventValidate] {
		return nil
	}
	o := h.run(ctx, eventValidate, p)
	if o.result == resultError || o.result == resultTimeout {
		h.mu.Lock()
		if r := h.records[p.Socket]; r != nil {
			r.validateErr = o.err
		}
		h.mu.Unlock()
		return nil
	}
	return o.err
}

// Register runs the register hook, if Config.Events has it. A refusal is
// retried with backoff, unless it is for good (exit status 3, HTTP 4xx); so is
// a hook that gives no answer. It blocks until the hook is done, at most
// Config.Timeout.
func (h *Handler) Register(ctx context.Context, p pluginmanager.Plugin) error {
	h.mu.Lock()
	var verr error
	if r := h.records[p.Socket]; r != nil {
		verr, r.validateErr = r.validateErr, nil
	}
	h.mu.Unlock()
	if verr != nil {
		return verr
	}
	if !h.events[eventRegister] {
		return nil
	}
	o := h.run(ctx, eventRegister, p)
	if o.final {
		return pluginmanager.TerminalError(o.err)
	}
	return o.err
}

// Deregister runs the deregister hook, if Config.Events has it, and forgets
// the plugin's last run. The plugin is let go whatever the hook answers; an
// answer other than accepted is logged and counted. It blocks until the hook
// is done, at most Config.Timeout.
func (h *Handler) Deregister(ctx context.Context, p pluginmanager.Plugin) {
	if h.events[eventDeregister] {
		if o := h.run(ctx, eventDeregister, p); o.err != nil {
			h.log.Warn("deregister hook did not accept", "socket", p.Socket, "type", p.Type, "name", p.Name, "result", o.result, "err", o.err)
		}
	}
	h.mu.Lock()
	delete(h.records, p.Socket)
	h.mu.Unlock()
}

var _ pluginmanager.Detailer = (*Handler)(nil)

// Details returns the last run of the hook for p's socket, as a Run, or nil if
// the hook has not run for it, or the plugin was deregistered since. It is
// meant for the details of a plugin's status, and is safe to call at any time
// from any goroutine.
func (h *Handler) Details(p pluginmanager.Plugin) any {
	h.mu.Lock()
	defer h.mu.Unlock()
	if r := h.records[p.Socket]; r != nil && r.last != nil {
		return *r.last
	}
	return nil
}

// outcome is what one run decided.
type outcome struct {
	result string // accepted, refused, error or timeout
	final  bool   // refused until the socket changes (register: exit 3, HTTP 4xx)
	err    error  // nil if accepted
}

// message is what a hook is given on stdin or as the POST body.
type message struct {
	Event  string               `json:"event"`
	Plugin pluginmanager.Plugin `json:"plugin"`
}

// run runs the hook once for event, bounded by h.timeout and ctx, and records
// the run.
func (h *Handler) run(ctx context.Context, event string, p pluginmanager.Plugin) outcome {
	outOfTime := fmt.Errorf("%s hook did not finish within %s", event, h.timeout)
	ctx, cancel := context.WithTimeoutCause(ctx, h.timeout, outOfTime)
	defer cancel()

	msg := message{Event: event, Plugin: p}
	if msg.Plugin.Versions == nil {
		msg.Plugin.Versions = []string{} // [] rather than null, for the hook's sake
	}
	payload, err := json.Marshal(msg)
	if err != nil {
		panic(err) // strings only: cannot happen
	}

	run := Run{Event: event, Start: time.Now()}
	var o outcome
	if h.url != "" {
		o = h.post(ctx, outOfTime, &run, payload)
	} else {
		o = h.exec(ctx, outOfTime, &run, p, payload)
	}
	d := time.Since(run.Start)
	run.DurationSeconds = d.Seconds()
	run.Result = o.result
	if o.err != nil {
		run.Error = o.err.Error()
	}

	h.metrics.runs.WithLabelValues(event, o.result).Inc()
	h.metrics.duration.WithLabelValues(event).Observe(d.Seconds())
	h.log.Debug("hook ran", "event", event, "socket", p.Socket, "type", p.Type, "name", p.Name,
		"result", o.result, "duration", d, "err", o.err)
	h.keep(p.Socket, &run)
	return o
}

// keep makes run the last one for socket, dropping the oldest record if there
// are too many.
func (h *Handler) keep(socket string, run *Run) {
	h.mu.Lock()
	defer h.mu.Unlock()
	r := h.records[socket]
	if r == nil {
		if len(h.records) >= maxRecords {
			h.dropOldestLocked()
		}
		r = &record{}
		h.records[socket] = r
	}
	r.last = run
}

func (h *Handler) dropOldestLocked() {
	var oldest string
	var at time.Time
	for socket, r := range h.records {
		if oldest == "" || r.last.Start.Before(at) {
			oldest, at = socket, r.last.Start
		}
	}
	delete(h.records, oldest)
}

// stopped is the outcome of a run cut short by its context: by its own
// timeout, by the manager's deadline, or by the manager shutting down.
func stopped(ctx context.Context, event string, outOfTime error, killed bool, output string) outcome {
	cause := context.Cause(ctx)
	o := outcome{result: resultError}
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		o.result = resultTimeout
	}
	msg := fmt.Sprintf("%s hook stopped: %v", event, cause)
	if cause == outOfTime {
		msg = cause.Error()
	}
	if killed {
		msg += "; it was killed"
	}
	o.err = withOutput(msg, output)
	return o
}

// withOutput is an error of msg followed by output, if there is any.
func withOutput(msg, output string) error {
	if output == "" {
		return errors.New(msg)
	}
	return errors.New(msg + ": " + output)
}
