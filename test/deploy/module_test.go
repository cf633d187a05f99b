package deploy

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// Before a release, the module proxy has no github.com/plugd/plugd: a
// module of one's own uses a clone, with a replace (go mod edit ...; go
// mod tidy) or a workspace (go work init), as docs/library.md and
// docs/writing-plugins.md say. Both ways build the library's example from
// docs/library.md and the example plugin (examples/plugin) in a module of
// their own. go mod tidy reaches the module proxy for plugd's
// dependencies, as the user's would.
func TestModuleFromClone(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join(repo, "docs", "library.md"))
	if err != nil {
		t.Fatal(err)
	}
	replace := "go mod edit -require=github.com/plugd/plugd@v0.0.0 -replace=github.com/plugd/plugd=../plugd"
	for _, f := range []string{"library.md", "writing-plugins.md"} {
		b, err := os.ReadFile(filepath.Join(repo, "docs", f))
		if err != nil {
			t.Fatal(err)
		}
		for _, want := range []string{replace, "go mod tidy", "go work init . ../plugd", "Once v0.1.0 is published (not yet)"} {
			if !strings.Contains(string(b), want) {
				t.Errorf("docs/%s does not say %q", f, want)
			}
		}
	}
	snippet := regexp.MustCompile("(?s)```go\nimport \"github.com/plugd/plugd/pluginmanager\"\n(.*?)```").FindSubmatch(doc)
	if snippet == nil {
		t.Fatal("docs/library.md has no first example importing pluginmanager")
	}
	example, err := os.ReadFile(filepath.Join(repo, "examples", "plugin", "main.go"))
	if err != nil {
		t.Fatal(err)
	}
	// The library's example, as written, in a function that returns an
	// error (it ends with return m.Run(ctx)).
	agent := `package main

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"

	"github.com/plugd/plugd/pluginmanager"
	"github.com/prometheus/client_golang/prometheus"
)

func run(ctx context.Context) error {
` + string(snippet[1]) + `}

func main() { _ = run(context.Background()) }
`
	write := func(dir string) {
		for name, b := range map[string][]byte{"agent/main.go": []byte(agent), "plugin/main.go": example} {
			p := filepath.Join(dir, name)
			if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(p, b, 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}

	t.Run("replace", func(t *testing.T) {
		dir := t.TempDir()
		write(dir)
		goCmd(t, dir, "GOWORK=off", "mod", "init", "example.com/agent")
		goCmd(t, dir, "GOWORK=off", "mod", "edit", "-require=github.com/plugd/plugd@v0.0.0", "-replace=github.com/plugd/plugd="+repo)
		goCmd(t, dir, "GOWORK=off", "mod", "tidy")
		goCmd(t, dir, "GOWORK=off", "build", "./...")
	})
	t.Run("workspace", func(t *testing.T) {
		dir := t.TempDir()
		write(dir)
		goCmd(t, dir, "GOWORK=", "mod", "init", "example.com/agent")
		goCmd(t, dir, "GOWORK=", "work", "init", ".", repo)
		goCmd(t, dir, "GOWORK=", "build", "./...")
	})
}

// goCmd runs go with args in dir, with env (one VAR=VALUE) added and
// GOFLAGS cleared, and fails the test with its output on an error.
func goCmd(t *testing.T, dir, env string, args ...string) {
	t.Helper()
	cmd := exec.Command("go", args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GOFLAGS=", env)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}
