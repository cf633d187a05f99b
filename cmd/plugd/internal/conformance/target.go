package conformance

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/fsnotify/fsnotify"
)

// Environment variables the kit sets for a plugin it starts, and the
// placeholders it replaces in the plugin's arguments.
const (
	envRegistryDir         = "PLUGD_CONFORMANCE_REGISTRY_DIR"
	envEndpointDir         = "PLUGD_CONFORMANCE_ENDPOINT_DIR"
	placeholderRegistryDir = "{registry-dir}"
	placeholderEndpointDir = "{endpoint-dir}"
)

// target is the plugin under test when the kit starts it: its command line,
// and the process of the current run.
type target struct {
	argv   []string
	env    []string
	output io.Writer // the plugin's standard output and error

	proc    *exec.Cmd
	exited  chan struct{} // closed once proc has exited
	exitErr error         // proc's Wait, set before exited is closed
}

// newTarget is a target for the command line argv, with the directories
// passed in its arguments' placeholders, in the kit's environment variables
// and in the variables the user named.
func newTarget(argv []string, cfg *Config) *target {
	r := strings.NewReplacer(placeholderRegistryDir, cfg.RegistryDir, placeholderEndpointDir, cfg.EndpointDir)
	t := &target{output: cfg.PluginOutput}
	for _, a := range argv {
		t.argv = append(t.argv, r.Replace(a))
	}
	t.env = append(os.Environ(), envRegistryDir+"="+cfg.RegistryDir, envEndpointDir+"="+cfg.EndpointDir)
	for _, name := range cfg.RegistryEnv {
		t.env = append(t.env, name+"="+cfg.RegistryDir)
	}
	for _, name := range cfg.EndpointEnv {
		t.env = append(t.env, name+"="+cfg.EndpointDir)
	}
	return t
}

// start starts a new process of the plugin.
func (t *target) start() error {
	cmd := exec.Command(t.argv[0], t.argv[1:]...)
	cmd.Env = t.env
	cmd.Stdout, cmd.Stderr = t.output, t.output
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("starting the plugin: %w", err)
	}
	t.proc, t.exited = cmd, make(chan struct{})
	go func(exited chan struct{}) {
		t.exitErr = cmd.Wait()
		close(exited)
	}(t.exited)
	return nil
}

// exitedErr says how the process ended, once exited is closed.
func (t *target) exitedErr() error {
	if t.exitErr == nil {
		return errors.New("the plugin exited with status 0")
	}
	return fmt.Errorf("the plugin exited: %w", t.exitErr)
}

// terminate sends SIGTERM and waits for the process to exit until ctx ends;
// then it kills it, and waits for that. It reports whether the process
// exited of itself.
func (t *target) terminate(ctx context.Context) bool {
	if t.proc == nil {
		return true
	}
	select {
	case <-t.exited:
		return true
	default:
	}
	if err := t.proc.Process.Signal(syscall.SIGTERM); err != nil {
		_ = t.proc.Process.Kill() // Windows has no SIGTERM
	}
	select {
	case <-t.exited:
		return true
	case <-ctx.Done():
		_ = t.proc.Process.Kill()
		<-t.exited
		return false
	}
}

// exitedChan is closed once the current process has exited; nil (never)
// when the kit attached to a plugin it did not start.
func (t *target) exitedChan() <-chan struct{} {
	if t == nil || t.proc == nil {
		return nil
	}
	return t.exited
}

// errRegisteredByCall is waitSocket's error when the plugin called Register
// on the device manager's kubelet.sock instead.
var errRegisteredByCall = errors.New("the plugin called Register on kubelet.sock")

// waitSocket waits until a unix socket whose name does not start with '.'
// is in dir or a directory below it (as the kubelet's watcher finds them),
// other than old (nil: any), until ctx ends, exited is closed, or
// registered is (errRegisteredByCall). It watches the tree with fsnotify
// and looks again at every event.
func waitSocket(ctx context.Context, dir string, old fs.FileInfo, exited, registered <-chan struct{}) (string, fs.FileInfo, error) {
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return "", nil, fmt.Errorf("watching %s: %w", dir, err)
	}
	defer w.Close()
	watched := map[string]bool{}
	for dir != "" { // no registry directory: wait for the other ends only
		path, fi, err := findSocket(dir, old, func(d string) {
			if !watched[d] && w.Add(d) == nil {
				watched[d] = true
			}
		})
		if path != "" || err != nil {
			return path, fi, err
		}
		select {
		case <-w.Events:
		case err := <-w.Errors:
			return "", nil, fmt.Errorf("watching %s: %w", dir, err)
		case <-exited:
			return "", nil, errors.New("the plugin exited before its registration socket appeared")
		case <-registered:
			return "", nil, errRegisteredByCall
		case <-ctx.Done():
			return "", nil, context.Cause(ctx)
		}
	}
	select {
	case <-exited:
		return "", nil, errors.New("the plugin exited before it registered")
	case <-registered:
		return "", nil, errRegisteredByCall
	case <-ctx.Done():
		return "", nil, context.Cause(ctx)
	}
}

// findSocket walks dir for a socket as waitSocket wants one, calling watch
// for every directory before it reads it, so that no socket made after the
// read goes unseen.
func findSocket(dir string, old fs.FileInfo, watch func(string)) (string, fs.FileInfo, error) {
	var found string
	var info fs.FileInfo
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			if path == dir {
				return err
			}
			return nil // gone since it was listed
		}
		if path != dir && strings.HasPrefix(d.Name(), ".") {
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		if d.IsDir() {
			watch(path)
			return nil
		}
		fi, err := os.Lstat(path)
		if err != nil || fi.Mode().Type() != fs.ModeSocket || sameSocket(fi, old) {
			return nil
		}
		found, info = path, fi
		return filepath.SkipAll
	})
	if err != nil {
		return "", nil, fmt.Errorf("reading the registry directory: %w", err)
	}
	return found, info, nil
}

// sameSocket says whether fi is the socket file old (nil: none). The inode
// number alone does not tell: a file system reuses the number of a file
// removed for the next one made, so the time it was made is compared too.
func sameSocket(fi, old fs.FileInfo) bool {
	return old != nil && os.SameFile(fi, old) && fi.ModTime().Equal(old.ModTime())
}

// withDeadline is ctx with a deadline d away whose cause says what was
// waited for.
func withDeadline(ctx context.Context, d time.Duration, what string) (context.Context, context.CancelFunc) {
	return context.WithTimeoutCause(ctx, d, fmt.Errorf("waited %s for %s", d, what))
}
