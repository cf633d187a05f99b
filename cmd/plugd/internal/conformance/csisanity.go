package conformance

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/plugd/plugd/pluginmanager"
)

// sanityFocus is the ginkgo focus the kit gives csi-sanity: its node
// tests, what a node plugin behind a registrar serves.
const sanityFocus = "Node Service"

// sanityWait bounds a csi-sanity run: its node tests take seconds.
func (r *runner) sanityWait() time.Duration { return 6 * r.cfg.Timeout }

// checkCSISanity runs csi-sanity (--csi-sanity) against the CSI driver's
// endpoint, its node tests only, and records its verdict.
func (r *runner) checkCSISanity(ctx context.Context, info PluginInfo) {
	if r.cfg.CSISanity == "" {
		r.skip(checkCSISanity, "give --csi-sanity, the path of a csi-sanity binary (github.com/kubernetes-csi/csi-test/v5/cmd/csi-sanity), to run this check")
		return
	}
	began := time.Now()
	path := info.Socket
	if info.Endpoint != "" {
		path, _ = pluginmanager.EndpointPath(info.Endpoint) // checked by registration/endpoint
	}
	out, err := r.runSanity(ctx, path)
	if err != nil {
		r.fail(checkCSISanity, sanityFailure(err, out), began)
		return
	}
	r.pass(checkCSISanity, "csi-sanity's node tests passed: "+sanityLine(out, "Ran "), began)
}

// runSanity runs csi-sanity's node tests against the endpoint at path,
// with mount and staging directories of its own, and returns its output.
func (r *runner) runSanity(ctx context.Context, path string) ([]byte, error) {
	dir, err := os.MkdirTemp("", "plugd-csi-sanity-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	cctx, cancel := withDeadline(ctx, r.sanityWait(), "csi-sanity's node tests to finish")
	defer cancel()
	args := append([]string{"--csi.endpoint=" + path, "--csi.mountdir=" + filepath.Join(dir, "mount"),
		"--csi.stagingdir=" + filepath.Join(dir, "staging"), "--ginkgo.focus=" + sanityFocus, "--ginkgo.no-color"}, r.cfg.CSISanityFlags...)
	cmd := exec.CommandContext(cctx, r.cfg.CSISanity, args...)
	var out bytes.Buffer
	cmd.Stdout = io.MultiWriter(&out, r.cfg.PluginOutput)
	cmd.Stderr = cmd.Stdout
	cmd.WaitDelay = outputGrace
	err = cmd.Run()
	if cctx.Err() != nil {
		err = context.Cause(cctx)
	}
	return out.Bytes(), err
}

// sanityFailure says why csi-sanity failed: the specs it names as failed,
// or the end of its output.
func sanityFailure(err error, out []byte) string {
	var failed []string
	seen := map[string]bool{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		spec, ok := strings.CutPrefix(strings.TrimSpace(sc.Text()), "[FAIL] ")
		if ok && !seen[spec] {
			seen[spec] = true
			failed = append(failed, spec)
		}
	}
	why := fmt.Sprintf("csi-sanity: %v", err)
	if len(failed) > 0 {
		return quote(why + "; failed: " + strings.Join(failed, "; "))
	}
	if tail := strings.TrimSpace(string(out)); tail != "" {
		return quote(why + "; its output ends: " + tail[max(0, len(tail)-maxSeen/2):])
	}
	return why
}

// sanityLine is the first line of out that begins with prefix, or "".
func sanityLine(out []byte, prefix string) string {
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		if line := strings.TrimSpace(sc.Text()); strings.HasPrefix(line, prefix) {
			return quote(line)
		}
	}
	return ""
}
