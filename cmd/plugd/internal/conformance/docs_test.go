package conformance

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/plugd/plugd/internal/testenv"
)

// docs/writing-plugins.md has a row for every check, with its rule: the
// kubelet's, or a recommendation.
func TestDocsNameEveryCheck(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join(testenv.Root(), "docs", "writing-plugins.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range catalogue {
		row := "| `" + c.ID + "` | " + c.rule()
		if !strings.Contains(string(doc), row) {
			t.Errorf("docs/writing-plugins.md has no row %q...: add the check to its table of checks", row)
		}
	}
}
