//go:build linux

package kube

import (
	"bufio"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The release as a user installs it (issue 37): test/deploy's
// TestReleasePublish builds the image without Docker (release/image.sh),
// pushes it and the packaged chart to a registry on loopback that it
// starts, pulls the chart back with Helm's library and installs it from
// there with helm install --dry-run=server against this package's real
// kube-apiserver, and checks that every image its pods run resolves in
// that registry. It runs as go test in test/deploy, a process of its own,
// so that neither module requires the other's tree (Helm's and
// go-containerregistry's here; k8s.io/kubernetes, whose kube-apiserver is
// built from this module, there). Here: Helm did ask this server about the
// release's objects and created none of them, and the manifest it
// rendered is accepted by this server, every object applied server-side,
// dry run, with strict field validation.
func TestReleaseFromRegistry(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	kubeconfig, manifest := filepath.Join(dir, "admin.kubeconfig"), filepath.Join(dir, "release.yaml")
	if err := cp.WriteKubeconfig(kubeconfig, cp.AdminToken); err != nil {
		t.Fatal(err)
	}
	// A namespace of its own, absent when Helm installs: a dry run creates
	// nothing, and finds nothing of another test's to take over.
	// A release name of its own too: the cluster-scoped objects other
	// tests applied (ClusterRole plugd-caretaker...) are not Helm's, and
	// Helm refuses to take them over.
	const ns, name = "plugd-release", "plugd-dryrun"
	from := time.Now()
	// -race: CI has just run test/deploy's tests so, and the test binary
	// comes from the build cache.
	cmd := exec.CommandContext(ctx, "go", "test", "-race", "-count=1", "-v", "-run", "^TestReleasePublish$", ".")
	cmd.Dir = filepath.Join(dirs.Repo, "test", "deploy")
	cmd.Env = append(os.Environ(), "PLUGD_KUBECONFIG="+kubeconfig, "PLUGD_RELEASE_NAMESPACE="+ns, "PLUGD_RELEASE_NAME="+name, "PLUGD_RELEASE_MANIFEST="+manifest)
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "--- PASS: TestReleasePublish") {
		t.Fatalf("test/deploy's TestReleasePublish against this API server: %v\n%s", err, out)
	}
	t.Logf("test/deploy's TestReleasePublish: %s", lastLine(string(out)))

	// Helm looked for the release's objects on this server (a DaemonSet
	// plugd there would be taken over, or refused), and made none.
	looked, err := auditRequests(from, "/namespaces/"+ns+"/daemonsets/"+name)
	if err != nil {
		t.Fatal(err)
	}
	if len(looked) == 0 {
		t.Errorf("Helm never asked this API server about the release's DaemonSet")
	}
	for _, r := range looked {
		if !strings.HasPrefix(r, "get ") {
			t.Errorf("Helm's dry run wrote: %s", r)
		}
	}
	if _, err := admin.AppsV1().DaemonSets(ns).Get(ctx, name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("after a dry run, the DaemonSet: %v", err)
	}

	// The manifest Helm rendered, into its namespace, made for real.
	b, err := os.ReadFile(manifest)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), "image: 127.0.0.1:") {
		t.Errorf("the release's pods do not run the image of the registry on loopback:\n%s", b)
	}
	if _, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if n := newServerDryRun(t).apply(ctx, t, "the release's manifest", b); n < 5 {
		t.Errorf("only %d objects in the release's manifest", n)
	}
}

// auditRequests are the requests (verb and URI) the API server received
// since from whose URI has path in it, from its audit log.
func auditRequests(from time.Time, path string) ([]string, error) {
	f, err := os.Open(cp.AuditLog)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	seen := map[string]bool{}
	var out []string
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var ev struct {
			AuditID  string    `json:"auditID"`
			Verb     string    `json:"verb"`
			Received time.Time `json:"requestReceivedTimestamp"`
			URI      string    `json:"requestURI"`
		}
		if json.Unmarshal(sc.Bytes(), &ev) != nil || seen[ev.AuditID] || ev.Received.Before(from) || !strings.Contains(ev.URI, path) {
			continue
		}
		seen[ev.AuditID] = true
		out = append(out, ev.Verb+" "+ev.URI)
	}
	return out, sc.Err()
}

// lastLine is the last line of s that is not empty.
func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}
