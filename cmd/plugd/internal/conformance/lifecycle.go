package conformance

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"time"
)

// refusal is the error the kit sends with NotifyRegistrationStatus(false).
const refusal = "plugd conformance: registration refused on purpose, to see what the plugin does"

// lifecycle runs the checks that stop and start the plugin: SIGTERM, a
// start over a stale socket, a refused registration.
func (r *runner) lifecycle(ctx context.Context, first PluginInfo) {
	began := time.Now()
	if !r.check(checkSIGTERM, r.sigterm(ctx, first.Socket), "the plugin exited on SIGTERM and removed "+first.Socket, began) {
		r.skipWhy = "not run: the plugin did not stop cleanly on SIGTERM"
		return
	}
	began = time.Now()
	c, err := r.startOverStale(ctx, first)
	if !r.check(checkStale, err, "started over a dead socket at "+first.Socket+", the plugin replaced it and registered again", began) {
		r.skipWhy = "not run: the plugin did not come back over a stale socket"
		return
	}
	defer c.close()
	began = time.Now()
	r.check(checkRefused, r.refuse(ctx, c, first), r.refusedSeen(first.Type), began)
}

// sigterm stops the plugin with SIGTERM and checks its socket is gone.
func (r *runner) sigterm(ctx context.Context, socket string) error {
	wctx, cancel := withDeadline(ctx, r.cfg.Timeout, "the plugin to exit on SIGTERM")
	defer cancel()
	if !r.target.terminate(wctx) {
		return fmt.Errorf("%w; it was killed", context.Cause(wctx))
	}
	if _, err := os.Lstat(socket); !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("the plugin exited (%v) and left its registration socket %s behind: a kubelet keeps trying it", r.target.exitedErr(), socket)
	}
	return nil
}

// startOverStale leaves a dead socket at the plugin's path, starts the
// plugin again, and waits for it to register with the same answers. It
// returns the connection it registered on.
func (r *runner) startOverStale(ctx context.Context, first PluginInfo) (*regConn, error) {
	dead, err := deadSocket(first.Socket)
	if err != nil {
		return nil, fmt.Errorf("making a dead socket at %s: %w", first.Socket, err)
	}
	if err := r.target.start(); err != nil {
		return nil, err
	}
	wctx, cancel := withDeadline(ctx, r.cfg.Timeout, "a new registration socket in place of the dead one")
	defer cancel()
	path, _, err := waitSocket(wctx, r.cfg.RegistryDir, dead, r.target.exitedChan(), nil)
	if err != nil {
		return nil, err
	}
	if path != first.Socket {
		return nil, fmt.Errorf("the plugin made its socket at %s and left the dead one at %s", path, first.Socket)
	}
	c, err := r.dialAgain(ctx, path)
	if err != nil {
		return nil, err
	}
	if err := r.registerOn(ctx, c, first); err != nil {
		c.close()
		return nil, err
	}
	return c, nil
}

// deadSocket makes a unix socket at path that nobody listens on, as a
// crashed plugin leaves behind, and returns its identity.
func deadSocket(path string) (fs.FileInfo, error) {
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		return nil, err
	}
	l.SetUnlinkOnClose(false)
	if err := l.Close(); err != nil {
		return nil, err
	}
	return os.Lstat(path)
}

// retryDelay is the kubelet's first delay before it tries a refused
// registration again (its executor's backoff starts at 500 ms): a plugin
// that is to keep serving must still be there then.
const retryDelay = 500 * time.Millisecond

// refuse plays a refused registration on c (GetInfo, then
// NotifyRegistrationStatus(false)) and checks what the plugin's ecosystem
// expects: a CSI registrar exits; other plugins are still there for the
// kubelet's next attempt.
func (r *runner) refuse(ctx context.Context, c *regConn, first PluginInfo) error {
	if _, _, err := c.getInfo(ctx, first.Socket, r.cfg.Timeout); err != nil {
		return err
	}
	// The plugin may answer with an error, or exit before it answers (a
	// registrar does): the kubelet only logs what it answered.
	_ = c.notify(ctx, false, refusal)
	exited := r.target.exitedChan()
	if first.Type == typeCSI {
		wctx, cancel := withDeadline(ctx, r.cfg.Timeout, "the registrar to exit after NotifyRegistrationStatus(false)")
		defer cancel()
		select {
		case <-exited:
			return nil
		case <-wctx.Done():
			return fmt.Errorf("%w: node-driver-registrar exits when its registration is refused, so that its restart tries again", context.Cause(wctx))
		}
	}
	retry := time.NewTimer(retryDelay)
	defer retry.Stop()
	select {
	case <-exited:
		return fmt.Errorf("after NotifyRegistrationStatus(false), %w; the kubelet tries again after %s", r.target.exitedErr(), retryDelay)
	case <-retry.C:
	}
	if _, _, err := c.getInfo(ctx, first.Socket, r.cfg.Timeout); err != nil {
		return fmt.Errorf("%s after NotifyRegistrationStatus(false), when the kubelet tries again: %w", retryDelay, err)
	}
	return nil
}

func (r *runner) refusedSeen(typ string) string {
	if typ == typeCSI {
		return "the registrar exited when told its registration was refused"
	}
	return "the plugin kept serving after it was told its registration was refused"
}
