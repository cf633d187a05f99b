// Package docs is plugd's manual. Its test keeps what the manual says of
// the code's layout true; docs/reference.md's configuration table is held
// to the code by cmd/plugd/internal/daemon's TestConfigReference.
package docs

import (
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/plugd/plugd/internal/testenv"
)

// Issue 26: architecture.md's "Packages" section lists every package of the
// main module, one line each, and no other: a package added, moved or
// removed without its line fails here, saying which and what to do.
func TestPackageList(t *testing.T) {
	root := testenv.Root()
	// go test caches a passing result by the files the test opened; the
	// directories go list reads are not among them. Opening each directory
	// of the module makes a package added or removed a new result.
	if err := openModuleDirs(root, false); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("go", "list", "-f", "{{.ImportPath}}", "./...")
	cmd.Dir = root
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list ./...: %v", err)
	}
	cmd = exec.Command("go", "list", "-m")
	cmd.Dir = root
	mod, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list -m: %v", err)
	}
	prefix := strings.TrimSpace(string(mod)) + "/"
	var pkgs []string
	for _, p := range strings.Fields(string(out)) {
		pkgs = append(pkgs, strings.TrimPrefix(p, prefix))
	}

	const file = "docs/architecture.md"
	b, err := os.ReadFile(filepath.Join(root, file))
	if err != nil {
		t.Fatal(err)
	}
	listed, err := packageList(string(b))
	if err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	for _, p := range pkgs {
		if !slices.Contains(listed, p) {
			t.Errorf("package %s is not in %s's package list: add a line \"- `%s` — what it is\" under \"## Packages\", on its floor", p, file, p)
		}
	}
	for _, p := range listed {
		if !slices.Contains(pkgs, p) {
			t.Errorf("%s lists %s, which go list ./... does not know: remove its line from \"## Packages\" (or fix its path if it moved)", file, p)
		}
	}
	for i, p := range listed {
		if slices.Contains(listed[:i], p) {
			t.Errorf("%s lists %s twice", file, p)
		}
	}
}

// Issues 26 and 36: the floors of architecture.md hold. Every import of
// the module's own packages goes down a floor (floors_test.go has the
// floors, and the few named exceptions); api, which plugd and plugctl
// share and any Go program may import, needs the standard library only;
// and plugctl and kubectl plugd, which read Node conditions but watch
// nothing, link none of client-go's informer machinery. Each failure names
// the package and the import that broke the rule.
func TestLayout(t *testing.T) {
	root := testenv.Root()
	if err := openModuleDirs(root, true); err != nil {
		t.Fatal(err)
	}
	mod := strings.TrimSpace(goList(t, root, "-m"))

	t.Run("every import goes down a floor", func(t *testing.T) { testFloors(t, root, mod) })

	t.Run("api imports the standard library only", func(t *testing.T) {
		out := goList(t, root, "-deps", "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}", "./api")
		for _, p := range strings.Fields(out) {
			if p != mod+"/api" {
				t.Errorf("api depends on %s: it may import the standard library only (every user of the status API's client links what it imports)", p)
			}
		}
	})

	t.Run("plugctl links no informers", func(t *testing.T) {
		for _, prog := range []string{"./cmd/plugctl", "./cmd/kubectl-plugd"} {
			var informers []string
			for _, p := range strings.Fields(goList(t, root, "-deps", prog)) {
				if strings.HasPrefix(p, "k8s.io/client-go/informers") || strings.HasPrefix(p, "k8s.io/client-go/tools/cache") {
					informers = append(informers, p)
				}
			}
			if len(informers) > 0 {
				t.Errorf("%s links %d packages of client-go's informers (%s, ...): it reads the Node conditions' form from internal/nodecond and lists once, it needs no informer (go list -deps %s)", prog, len(informers), informers[0], prog)
			}
		}
	})
}

// goList runs go list with args in the module's root and returns its
// output.
func goList(t *testing.T, root string, args ...string) string {
	t.Helper()
	cmd := exec.Command("go", append([]string{"list"}, args...)...)
	cmd.Dir = root
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list %s: %v", strings.Join(args, " "), err)
	}
	return string(out)
}

// packageList is the packages named at the start of the list items in the
// "## Packages" section: "- `path` — what it is".
func packageList(doc string) ([]string, error) {
	_, section, ok := strings.Cut(doc, "\n## Packages\n")
	if !ok {
		return nil, errors.New(`no "## Packages" section`)
	}
	if end := strings.Index(section, "\n## "); end >= 0 {
		section = section[:end]
	}
	var out []string
	for _, m := range regexp.MustCompile("(?m)^- `([^`]+)`").FindAllStringSubmatch(section, -1) {
		out = append(out, m[1])
	}
	return out, nil
}

// openModuleDirs reads every directory of the main module, as go list ./...
// does: not those of other modules (a go.mod of their own), nor testdata,
// node_modules, or names starting with . or _. With files, it also opens
// every Go file and go.mod and go.sum in them, so that a changed import
// is a new result too.
func openModuleDirs(root string, files bool) error {
	return filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil || path == root {
			return err
		}
		name := d.Name()
		if !d.IsDir() {
			if files && (strings.HasSuffix(name, ".go") || name == "go.mod" || name == "go.sum") {
				f, err := os.Open(path)
				if err != nil {
					return err
				}
				return f.Close()
			}
			return nil
		}
		if skipDir(path, name) {
			return filepath.SkipDir
		}
		return nil
	})
}

// skipDir reports whether the directory at path, named name, is not one
// of the main module's packages nor holds any: testdata, node_modules,
// names starting with . or _, and another module (a go.mod of its own).
func skipDir(path, name string) bool {
	if name == "testdata" || name == "node_modules" || strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_") {
		return true
	}
	_, err := os.Stat(filepath.Join(path, "go.mod"))
	return err == nil
}
