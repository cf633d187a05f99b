package docs

import (
	"fmt"
	"path"
	"slices"
	"strings"
	"testing"
)

// floors are the main module's floors, lowest first, as
// docs/architecture.md's "Floors" has them. A package is on the floor of
// the longest pattern that matches the start of its path, segment by
// segment (path.Match for each). It imports packages on lower floors only,
// or on its own floor where peers says that its packages import one
// another.
var floors = []struct {
	name     string
	patterns []string
	peers    bool
}{
	{"the basement", []string{"internal"}, true},
	{"the leaves others import", []string{"api", "plugin"}, false},
	{"the engine's own leaves", []string{"pluginmanager/internal"}, true},
	{"the engine", []string{"pluginmanager"}, false},
	{"what the handlers share", []string{"handlers/internal"}, true},
	{"what is built on the engine", []string{"handlers", "plugintest"}, false},
	{"what the programs share", []string{"cmd/internal"}, true},
	{"a program's own packages", []string{"cmd/*/internal"}, true},
	{"the programs", []string{"cmd", "examples"}, false},
	{"the suites", []string{"test", "docs"}, true},
}

// upstairs are the imports allowed to go up, or across a floor, each with
// its reason: importer, imported (module-relative; "*" any package).
var upstairs = []struct{ from, to, why string }{
	{"internal/testenv", "plugin", "the tests' helpers start plugins with the SDK; testenv is linked into tests and suites, never into a program"},
}

// testKits are what any package's tests may import, whatever its floor:
// no program links them.
var testKits = []string{"internal/testenv", "plugintest"}

// floorOf is the index in floors of the floor pkg (module-relative) is on,
// or -1.
func floorOf(pkg string) int {
	segs := strings.Split(pkg, "/")
	best, bestLen := -1, 0
	for i, f := range floors {
		for _, p := range f.patterns {
			ps := strings.Split(p, "/")
			if len(ps) <= bestLen || len(ps) > len(segs) {
				continue
			}
			match := true
			for j, s := range ps {
				if ok, _ := path.Match(s, segs[j]); !ok {
					match = false
					break
				}
			}
			if match {
				best, bestLen = i, len(ps)
			}
		}
	}
	return best
}

// floorProblem says what is wrong with pkg importing imp (module-relative
// paths; test says the import is from pkg's tests), or "".
func floorProblem(pkg, imp string, test bool) string {
	from, to := floorOf(pkg), floorOf(imp)
	switch {
	case from < 0:
		return fmt.Sprintf("%s is on no floor: add its path to the floors of docs/floors_test.go and to docs/architecture.md", pkg)
	case to < 0:
		return fmt.Sprintf("%s is on no floor: add its path to the floors of docs/floors_test.go and to docs/architecture.md", imp)
	case pkg == imp, to < from, to == from && floors[from].peers:
		return ""
	case test && slices.Contains(testKits, imp):
		return ""
	}
	for _, u := range upstairs {
		if u.from == pkg && (u.to == imp || u.to == "*") {
			return ""
		}
	}
	where := "a floor above"
	if to == from {
		where = "its own floor, whose packages do not import one another"
	}
	return fmt.Sprintf("%s (%s) imports %s (%s): %s. Move what both need down a floor; or, if it must stay, name the exception and its reason in upstairs (docs/floors_test.go)",
		pkg, floors[from].name, imp, floors[to].name, where)
}

// testFloors fails every import of the main module's packages, and of
// their tests, that does not go down a floor.
func testFloors(t *testing.T, root, mod string) {
	out := goList(t, root, "-f", "{{.ImportPath}}\t{{join .Imports \" \"}}\t{{join .TestImports \" \"}} {{join .XTestImports \" \"}}", "./...")
	n := 0
	for line := range strings.Lines(out) {
		f := strings.Split(strings.TrimSuffix(line, "\n"), "\t")
		pkg := rel(mod, f[0])
		for i, imps := range f[1:] {
			for _, imp := range strings.Fields(imps) {
				if imp != mod && !strings.HasPrefix(imp, mod+"/") {
					continue
				}
				n++
				if p := floorProblem(pkg, rel(mod, imp), i == 1); p != "" {
					t.Error(p)
				}
			}
		}
	}
	if n == 0 {
		t.Fatal("no import of the module's own packages found: is go list's output what the test reads?")
	}
}

// rel is pkg's path in module mod.
func rel(mod, pkg string) string {
	return strings.TrimPrefix(strings.TrimPrefix(pkg, mod), "/")
}

// The floors are as architecture.md has them: a package's floor comes from
// its path.
func TestFloorOf(t *testing.T) {
	for pkg, want := range map[string]string{
		"internal/kubeconfig":              "the basement",
		"api":                              "the leaves others import",
		"plugin":                           "the leaves others import",
		"pluginmanager/internal/queue":     "the engine's own leaves",
		"pluginmanager":                    "the engine",
		"handlers/internal/pacing":         "what the handlers share",
		"handlers/hook":                    "what is built on the engine",
		"plugintest":                       "what is built on the engine",
		"cmd/internal/fleet":               "what the programs share",
		"cmd/plugd/internal/kubenode":      "a program's own packages",
		"cmd/plugd/internal/kubenode/more": "a program's own packages",
		"cmd/plugd":                        "the programs",
		"examples/plugin":                  "the programs",
		"test/interop/cmd/rawh2-server":    "the suites",
		"docs":                             "the suites",
	} {
		if i := floorOf(pkg); i < 0 || floors[i].name != want {
			t.Errorf("floorOf(%s) = %d, want %q", pkg, i, want)
		}
	}
	if p := floorProblem("internal/kubeconfig", "handlers/hook", false); p == "" {
		t.Error("the basement importing a handler: no problem found")
	}
}
