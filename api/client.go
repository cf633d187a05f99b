package api

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
	"unicode"
)

// Client talks to plugd's status API. Its zero value talks to the daemon on
// DefaultSocket. It is safe for concurrent use.
//
// It does not trust the other end: it reads at most MaxAnswerSize of an
// answer and MaxEventSize of an event, 64 KiB of headers, and refuses a
// compressed answer (it never asks for one).
type Client struct {
	// Socket is the unix socket of the status API. Zero means DefaultSocket(),
	// unless Address is set.
	Socket string
	// Address is the base URL of a status API served over TCP, such as
	// "http://127.0.0.1:9090". It takes precedence over Socket.
	Address string
	// HTTPClient, if set, is used for every request (and its transport must
	// know how to reach the daemon).
	HTTPClient *http.Client
}

var (
	// ErrNotFound is returned, wrapped, for a plugin that plugd does not know.
	ErrNotFound = errors.New("not found")
	// ErrNotReady is returned, wrapped, by Ready while plugd has not yet
	// scanned its registry directory.
	ErrNotReady = errors.New("not ready")
	// ErrBusy is returned, wrapped, when plugd turned the request away for
	// now because one of its limits was reached (event streams, answers
	// being written to slow clients), after the client retried a few times.
	ErrBusy = errors.New("busy")
)

// busyRetries are the pauses before asking again when plugd says it is busy
// (HTTP 503 or 429 with Retry-After): plugd's own limits free up within
// moments unless it is flooded.
var busyRetries = []time.Duration{100 * time.Millisecond, 300 * time.Millisecond, 900 * time.Millisecond}

// Filter selects plugins; an empty field matches every plugin.
type Filter struct {
	Type, Name, State string
}

// Plugins lists the plugins that match f.
func (c *Client) Plugins(ctx context.Context, f Filter) ([]Plugin, error) {
	q := url.Values{}
	for k, v := range map[string]string{"type": f.Type, "name": f.Name, "state": f.State} {
		if v != "" {
			q.Set(k, v)
		}
	}
	path := "/v1/plugins"
	if len(q) > 0 {
		path += "?" + q.Encode()
	}
	var list PluginList
	if err := c.get(ctx, path, &list); err != nil {
		return nil, err
	}
	return list.Plugins, nil
}

// Plugin returns the plugin with the given ID (its socket path inside the
// registry directory).
func (c *Client) Plugin(ctx context.Context, id string) (Plugin, error) {
	var p Plugin
	err := c.get(ctx, "/v1/plugins/"+escapePath(id), &p)
	return p, err
}

// Findings runs plugd's checks of its plugins and node (plugctl doctor) and
// returns what they found, most serious first. It takes as long as the
// checks do: a few seconds at most.
func (c *Client) Findings(ctx context.Context) ([]Finding, error) {
	var list FindingList
	if err := c.get(ctx, "/v1/findings", &list); err != nil {
		return nil, err
	}
	return list.Findings, nil
}

// Version asks the daemon what it is.
func (c *Client) Version(ctx context.Context) (Version, error) {
	var v Version
	err := c.get(ctx, "/v1/version", &v)
	return v, err
}

// Ready reports nil once the daemon has scanned its registry directory.
func (c *Client) Ready(ctx context.Context) error {
	return c.get(ctx, "/readyz", nil)
}

// EventStream is a stream of events from Client.Events.
type EventStream struct {
	body  io.ReadCloser
	lines *bufio.Scanner
}

// Next blocks until the next event arrives. It returns io.EOF when the
// daemon ends the stream, and an error when the stream's context is done or
// the daemon sends something that is not an event (or an event longer than
// MaxEventSize).
func (s *EventStream) Next() (Event, error) {
	for s.lines.Scan() {
		line := s.lines.Bytes()
		if len(bytes.TrimSpace(line)) == 0 {
			continue
		}
		var ev Event
		if err := json.Unmarshal(line, &ev); err != nil {
			return Event{}, fmt.Errorf("plugd sent an event that is not valid JSON: %w", err)
		}
		return ev, nil
	}
	switch err := s.lines.Err(); {
	case errors.Is(err, bufio.ErrTooLong):
		return Event{}, fmt.Errorf("plugd sent an event longer than %d KiB, the most a client reads", MaxEventSize>>10)
	case err != nil:
		return Event{}, err
	}
	return Event{}, io.EOF
}

// scanEvents splits the event stream into lines, and drops a last line the
// daemon did not finish (it stopped mid-event).
func scanEvents(data []byte, atEOF bool) (int, []byte, error) {
	if i := bytes.IndexByte(data, '\n'); i >= 0 {
		return i + 1, data[:i], nil
	}
	return 0, nil, nil
}

// Close ends the stream.
func (s *EventStream) Close() error { return s.body.Close() }

// Events opens the event stream, starting with up to replay recent events.
// The stream lasts until ctx is done or Close is called.
func (c *Client) Events(ctx context.Context, replay int) (*EventStream, error) {
	resp, err := c.do(ctx, fmt.Sprintf("/v1/events?replay=%d", replay))
	if err != nil {
		return nil, err
	}
	lines := bufio.NewScanner(resp.Body)
	lines.Buffer(make([]byte, 0, 4<<10), MaxEventSize)
	lines.Split(scanEvents)
	return &EventStream{body: resp.Body, lines: lines}, nil
}

// What a Client reads of an answer, at most: it does not trust the other end
// to be plugd, or plugd to be sane. A plugd with 20,000 plugins answers
// /v1/plugins in about 10 MiB; an event is one plugin, without details.
const (
	MaxAnswerSize = 32 << 20
	MaxEventSize  = 1 << 20
)

func (c *Client) get(ctx context.Context, path string, into any) error {
	resp, err := c.do(ctx, path)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if into == nil {
		return nil
	}
	tooLarge := func() error {
		return fmt.Errorf("plugd's answer to %s is larger than %d MiB, the most a client reads; ask for less (a filter such as --type or --name)", path, MaxAnswerSize>>20)
	}
	if resp.ContentLength > MaxAnswerSize {
		return tooLarge()
	}
	if err := json.NewDecoder(http.MaxBytesReader(nil, resp.Body, MaxAnswerSize)).Decode(into); err != nil {
		if _, ok := errors.AsType[*http.MaxBytesError](err); ok {
			return tooLarge()
		}
		return fmt.Errorf("plugd sent an answer to %s that is not valid JSON: %w", path, err)
	}
	return nil
}

// do sends a GET, asks again while plugd says it is busy, and turns every
// failure into an error that says what to do.
func (c *Client) do(ctx context.Context, path string) (*http.Response, error) {
	for _, pause := range busyRetries {
		resp, err := c.doOnce(ctx, path)
		if !errors.Is(err, ErrBusy) {
			return resp, err
		}
		select {
		case <-time.After(pause):
		case <-ctx.Done():
			return nil, err
		}
	}
	return c.doOnce(ctx, path)
}

func (c *Client) doOnce(ctx context.Context, path string) (*http.Response, error) {
	base, hc := c.transport()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+path, nil)
	if err != nil {
		return nil, err
	}
	resp, err := hc.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		if errors.Is(err, fs.ErrPermission) {
			return nil, fmt.Errorf("cannot reach plugd at %s: %w; the status socket is only for its owner and group: run as them (e.g. with sudo)", c.where(), unwrapURLError(err))
		}
		return nil, fmt.Errorf("cannot reach plugd at %s: %w; is plugd running? Start it with 'plugd', or point --socket (or --address) at the status API it serves", c.where(), unwrapURLError(err))
	}
	if enc := resp.Header.Get("Content-Encoding"); enc != "" && enc != "identity" {
		// Never asked for (DisableCompression): a compressed answer could be
		// a bomb of gigabytes once inflated.
		resp.Body.Close()
		return nil, fmt.Errorf("the answer from %s is compressed (Content-Encoding %q), which plugd never does and this client does not read; is it plugd?", c.where(), printable(enc, 64))
	}
	if resp.StatusCode/100 == 2 {
		return resp, nil
	}
	defer resp.Body.Close()
	var e Error
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if json.Unmarshal(body, &e) != nil || e.Message == "" {
		e.Message = strings.TrimSpace(string(body))
	}
	e.Message = printable(e.Message, 4<<10) // it goes to a terminal
	err = fmt.Errorf("plugd: %s (HTTP %d)", e.Message, resp.StatusCode)
	busy := resp.Header.Get("Retry-After") != ""
	switch {
	case resp.StatusCode == http.StatusNotFound:
		err = fmt.Errorf("%w: %w", ErrNotFound, err)
	case busy && (resp.StatusCode == http.StatusServiceUnavailable || resp.StatusCode == http.StatusTooManyRequests):
		err = fmt.Errorf("%w: %w", ErrBusy, err)
	case resp.StatusCode == http.StatusServiceUnavailable:
		err = fmt.Errorf("%w: %w", ErrNotReady, err)
	}
	return nil, err
}

func (c *Client) where() string {
	if c.Address != "" {
		return c.Address
	}
	return c.socket()
}

func (c *Client) socket() string {
	if c.Socket != "" {
		return c.Socket
	}
	return DefaultSocket()
}

// transport returns the base URL and the HTTP client to reach the daemon.
// Connections are not kept alive: the daemon is local, a connection costs
// little, and a Client then holds no goroutine or socket between calls.
func (c *Client) transport() (string, *http.Client) {
	base := strings.TrimSuffix(c.Address, "/")
	if c.HTTPClient != nil {
		if base == "" {
			base = "http://plugd"
		}
		return base, c.HTTPClient
	}
	tr := &http.Transport{DisableKeepAlives: true, DisableCompression: true, MaxResponseHeaderBytes: 64 << 10}
	if base == "" {
		socket := c.socket()
		tr.DialContext = func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", socket)
		}
		base = "http://plugd"
	}
	return base, &http.Client{Transport: tr}
}

func unwrapURLError(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err
	}
	return err
}

// escapePath escapes each segment of an ID, keeping its slashes.
func escapePath(id string) string {
	parts := strings.Split(id, "/")
	for i, p := range parts {
		parts[i] = url.PathEscape(p)
	}
	return strings.Join(parts, "/")
}

// printable is s with every character a terminal would act on (escape
// sequences, newlines, bidi controls) written as a Go escape, invalid UTF-8
// dropped, cut to at most max bytes at a character boundary: what the server
// says ends up on a person's terminal. It is internal/textsafe's rule, kept
// here so that api, which other programs import, needs only the standard
// library (TestPrintableIsTextsafes keeps the two the same).
func printable(s string, max int) string {
	s = strings.ToValidUTF8(s, "")
	if strings.IndexFunc(s, needsEscape) >= 0 {
		var b strings.Builder
		for _, r := range s {
			if needsEscape(r) {
				q := strconv.QuoteRune(r)
				b.WriteString(q[1 : len(q)-1])
			} else {
				b.WriteRune(r)
			}
		}
		s = b.String()
	}
	if len(s) > max {
		s = strings.ToValidUTF8(s[:max], "")
	}
	return s
}

func needsEscape(r rune) bool { return !unicode.IsPrint(r) && r != ' ' }
