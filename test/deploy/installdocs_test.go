package deploy

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// unpublished are the install commands that need a release: the chart on
// ghcr.io, the plugin on krew, the module on the proxy. None exists until
// v0.1.0 is published.
var unpublished = regexp.MustCompile(`oci://ghcr\.io/plugd/charts|krew\s+install\s+plugd|go\s+install\s+github\.com/plugd/plugd|go\s+get\s+github\.com/plugd/plugd`)

// markedUnpublished is how the docs say that a command needs the release.
var markedUnpublished = regexp.MustCompile(`(?i)once\s+v0\.1\.0\s+is\s+published|no\s+release\s+is\s+published\s+yet|has\s+no\s+release\s+yet`)

// The install docs show what works from a checkout today, and mark every
// command that needs a published release as such: each paragraph (or code
// block) naming the chart on ghcr.io, krew, go install or go get of the
// module says so, or follows one that does. The commands for today are
// the ones TestRelease, TestImage, TestImageInContainerd and
// TestReleasePublish run.
func TestInstallDocsMarkUnpublished(t *testing.T) {
	for _, f := range []string{"README.md", "docs/cluster.md", "docs/kubernetes.md", "docs/getting-started.md", "docs/library.md",
		"docs/writing-plugins.md", "deploy/README.md", "charts/plugd/README.md", "charts/plugd/templates/NOTES.txt"} {
		b, err := os.ReadFile(filepath.Join(repo, filepath.FromSlash(f)))
		if err != nil {
			t.Fatal(err)
		}
		if f == "README.md" || f == "docs/cluster.md" {
			for _, want := range []string{"release/package.sh", "release/image.sh", "kind load image-archive dist/image/plugd-image.tar",
				"helm install plugd charts/plugd", "image.tag=v0.0.0-dev", "go build ./cmd/kubectl-plugd"} {
				if !strings.Contains(string(b), want) {
					t.Errorf("%s does not show how to install from a checkout today: no %q", f, want)
				}
			}
		}
		paragraphs := strings.Split(string(b), "\n\n")
		for i, p := range paragraphs {
			if !unpublished.MatchString(p) {
				continue
			}
			if markedUnpublished.MatchString(p) || (i > 0 && markedUnpublished.MatchString(paragraphs[i-1])) {
				continue
			}
			t.Errorf("%s: %q needs a published release, and this paragraph does not say so (%q):\n%s",
				f, unpublished.FindString(p), markedUnpublished.String(), p)
		}
	}
}
