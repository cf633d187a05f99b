package conformance

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	deviceapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// envPluginPID is set, for --health-command, to the process id of the
// plugin the kit started.
const envPluginPID = "PLUGD_CONFORMANCE_PLUGIN_PID"

// streamWatch is how long the kit watches a ListAndWatch stream after the
// inventory for its end (deviceplugin/stream-open).
const streamWatch = time.Second

// devicePluginSuite checks a device plugin's options and its ListAndWatch
// stream: the inventory at once, a stream that stays open, a health change
// reaching it, and a second stream answered as the first.
func (r *runner) devicePluginSuite(ctx context.Context, ep *grpc.ClientConn) {
	began := time.Now()
	c := deviceapi.NewDevicePluginClient(ep)
	cctx, cancel := r.call(ctx, "GetDevicePluginOptions")
	opts, err := c.GetDevicePluginOptions(cctx, &deviceapi.Empty{})
	cancel()
	if err != nil {
		err = fmt.Errorf("GetDevicePluginOptions: %w", err)
	}
	r.check(checkDPOptions, err, fmt.Sprintf("options: pre-start required %t, preferred allocation %t",
		opts.GetPreStartRequired(), opts.GetGetPreferredAllocationAvailable()), began)

	began = time.Now()
	ls, err := openList(ctx, c)
	var last *deviceapi.ListAndWatchResponse
	if err == nil {
		last, err = ls.first(ctx)
	}
	if !r.check(checkDPListAndWatch, err, fmt.Sprintf("ListAndWatch sent %d device(s) in %s", len(last.GetDevices()), time.Since(began).Round(time.Millisecond)), began) {
		if ls != nil {
			ls.stop()
		}
		for _, id := range []string{checkDPStreamOpen, checkDPHealth, checkDPListAgain} {
			r.skip(id, "not run: ListAndWatch sent no inventory")
		}
		return
	}
	began = time.Now()
	last, err = ls.staysOpen(ctx, last)
	if r.check(checkDPStreamOpen, err, fmt.Sprintf("the stream was still open %s after the inventory", streamWatch), began) {
		last = r.checkHealthChange(ctx, ls, last)
	} else {
		r.skip(checkDPHealth, "not run: the ListAndWatch stream ended")
	}
	ls.stop()
	began = time.Now()
	r.check(checkDPListAgain, listAgain(ctx, c, last), "a second ListAndWatch sent the same devices at once", began)
}

// listStream is a ListAndWatch stream read by a goroutine of its own, so
// that each wait on it has a deadline of its own.
type listStream struct {
	answers chan *deviceapi.ListAndWatchResponse
	ended   chan error // the stream's end, once
	cancel  context.CancelFunc
	done    chan struct{} // closed when the reader has returned
}

func openList(ctx context.Context, c deviceapi.DevicePluginClient) (*listStream, error) {
	sctx, cancel := context.WithCancel(ctx)
	s, err := c.ListAndWatch(sctx, &deviceapi.Empty{})
	if err != nil {
		cancel()
		return nil, fmt.Errorf("ListAndWatch: %w", err)
	}
	ls := &listStream{answers: make(chan *deviceapi.ListAndWatchResponse), ended: make(chan error, 1), cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(ls.done)
		for {
			resp, err := s.Recv()
			if err != nil {
				ls.ended <- err
				return
			}
			select {
			case ls.answers <- resp:
			case <-sctx.Done():
				return
			}
		}
	}()
	return ls, nil
}

// stop ends the stream, as a kubelet whose connection goes does, and
// waits for its reader.
func (ls *listStream) stop() {
	ls.cancel()
	<-ls.done
}

// next waits until ctx ends for the next answer, and judges it.
func (ls *listStream) next(ctx context.Context) (*deviceapi.ListAndWatchResponse, error) {
	select {
	case resp := <-ls.answers:
		return resp, judgeDevices(resp)
	case err := <-ls.ended:
		if errors.Is(err, io.EOF) || status.Code(err) == codes.OK {
			return nil, errStreamEnded
		}
		return nil, fmt.Errorf("%w: %w", errStreamEnded, err)
	case <-ctx.Done():
		return nil, context.Cause(ctx)
	}
}

var errStreamEnded = errors.New("ListAndWatch ended")

// first waits firstAnswer for the inventory.
func (ls *listStream) first(ctx context.Context) (*deviceapi.ListAndWatchResponse, error) {
	ctx, cancel := withDeadline(ctx, firstAnswer, "ListAndWatch's first answer (the kubelet reports no capacity until then)")
	defer cancel()
	return ls.next(ctx)
}

// staysOpen watches the stream for streamWatch after the inventory: more
// answers are fine, an end is not. It returns the last answer seen.
func (ls *listStream) staysOpen(ctx context.Context, last *deviceapi.ListAndWatchResponse) (*deviceapi.ListAndWatchResponse, error) {
	wctx, cancel := withDeadline(ctx, streamWatch, "the ListAndWatch stream to end")
	defer cancel()
	for {
		resp, err := ls.next(wctx)
		switch {
		case errors.Is(err, errStreamEnded):
			return last, fmt.Errorf("%w after the inventory: the kubelet takes the plugin as gone, marks its devices unhealthy and drops them after 5 m unless it registers again", err)
		case err != nil && wctx.Err() != nil && ctx.Err() == nil:
			return last, nil // open all along
		case err != nil:
			return last, err
		}
		last = resp
	}
}

// judgeDevices says what the kubelet cannot take in an answer.
func judgeDevices(resp *deviceapi.ListAndWatchResponse) error {
	for _, d := range resp.GetDevices() {
		if d.GetID() == "" {
			return errors.New("ListAndWatch sent a device without an ID")
		}
		if h := d.GetHealth(); h != deviceapi.Healthy && h != deviceapi.Unhealthy {
			return fmt.Errorf("device %q has health %q; the kubelet knows %q and %q", quote(d.GetID()), quote(h), deviceapi.Healthy, deviceapi.Unhealthy)
		}
	}
	return nil
}

// health is an answer's devices' health by ID.
func health(resp *deviceapi.ListAndWatchResponse) map[string]string {
	m := map[string]string{}
	for _, d := range resp.GetDevices() {
		m[d.GetID()] = d.GetHealth()
	}
	return m
}

// healthChanges says which devices of after have another health than in
// before, as "ID: old -> new".
func healthChanges(before, after map[string]string) []string {
	var changed []string
	for _, id := range slices.Sorted(maps.Keys(after)) {
		if old, ok := before[id]; ok && old != after[id] {
			changed = append(changed, fmt.Sprintf("%s: %s -> %s", quote(id), old, after[id]))
		}
	}
	return changed
}

// checkHealthChange runs --health-command and waits for an answer on ls
// in which a device's health changed. It returns the last answer seen.
func (r *runner) checkHealthChange(ctx context.Context, ls *listStream, last *deviceapi.ListAndWatchResponse) *deviceapi.ListAndWatchResponse {
	if r.cfg.HealthCommand == "" {
		r.skip(checkDPHealth, "give --health-command, a command that makes one of the plugin's devices change health, to run this check")
		return last
	}
	began := time.Now()
	before := health(last)
	if err := r.runHealthCommand(ctx); err != nil {
		r.fail(checkDPHealth, err.Error(), began)
		return last
	}
	wctx, cancel := withDeadline(ctx, r.cfg.Timeout, "a ListAndWatch answer with a device's health changed, after --health-command ran")
	defer cancel()
	for {
		resp, err := ls.next(wctx)
		if err != nil {
			r.fail(checkDPHealth, err.Error(), began)
			return last
		}
		last = resp
		if changed := healthChanges(before, health(resp)); len(changed) > 0 {
			r.pass(checkDPHealth, fmt.Sprintf("%s, %s after --health-command began", strings.Join(changed, ", "), time.Since(began).Round(time.Millisecond)), began)
			return last
		}
	}
}

// runHealthCommand runs --health-command with /bin/sh, bounded by the
// kit's timeout: in a started plugin's environment, with its process id;
// attached, in the kit's, with the directories it was given.
func (r *runner) runHealthCommand(ctx context.Context) error {
	cctx, cancel := withDeadline(ctx, r.cfg.Timeout, "--health-command to finish")
	defer cancel()
	cmd := exec.CommandContext(cctx, "/bin/sh", "-c", r.cfg.HealthCommand)
	cmd.Env = append(os.Environ(), envRegistryDir+"="+r.cfg.RegistryDir, envEndpointDir+"="+r.cfg.EndpointDir)
	if r.target != nil && r.target.proc != nil {
		// The started plugin's environment, --registry-env and
		// --endpoint-env included.
		cmd.Env = append(slices.Clone(r.target.env), envPluginPID+"="+strconv.Itoa(r.target.proc.Process.Pid))
	}
	cmd.Stdout, cmd.Stderr = r.cfg.PluginOutput, r.cfg.PluginOutput
	cmd.WaitDelay = outputGrace
	if err := cmd.Run(); err != nil {
		if cctx.Err() != nil {
			err = context.Cause(cctx)
		}
		return fmt.Errorf("--health-command %q: %w", r.cfg.HealthCommand, err)
	}
	return nil
}

// listAgain opens a second ListAndWatch, the first one ended, and checks
// that it sends the devices last seen at once.
func listAgain(ctx context.Context, c deviceapi.DevicePluginClient, last *deviceapi.ListAndWatchResponse) error {
	ls, err := openList(ctx, c)
	if err != nil {
		return err
	}
	defer ls.stop()
	resp, err := ls.first(ctx)
	if err != nil {
		return fmt.Errorf("the second stream: %w", err)
	}
	want, got := slices.Sorted(maps.Keys(health(last))), slices.Sorted(maps.Keys(health(resp)))
	if !slices.Equal(want, got) {
		return fmt.Errorf("the second stream sent devices %q; the first %q", got, want)
	}
	return nil
}
