package docs

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"strings"
	"testing"

	"github.com/plugd/plugd/internal/testenv"
)

// maxFuncLines is the longest a function of the main module may be, from
// its func line to its closing brace: a function longer than a screen holds
// more than one decision, and reads as a list of branches.
// (pluginmanager's own TestFunctionsAreShort holds its tests to it too.)
const maxFuncLines = 80

// longFuncs are the functions longer than maxFuncLines when the rule came
// (issue 36), by file and name, with their length then. Each is to go from
// this list when it is split; none is to be added, and one that grows
// fails.
var longFuncs = map[string]int{}

// Issue 36: no function of the main module's code (its tests aside) is
// longer than maxFuncLines, but those listed in longFuncs, which may not
// grow.
func TestFunctionsAreShort(t *testing.T) {
	root := testenv.Root()
	if err := openModuleDirs(root, true); err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	seen := map[string]bool{}
	err := walkModuleGo(root, func(path string) error {
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		for name, lines := range funcLengths(fset, f) {
			key := filepath.ToSlash(rel) + " " + name
			allowed, listed := longFuncs[key]
			seen[key] = listed
			switch {
			case lines <= maxFuncLines:
				if listed {
					t.Errorf("%s is %d lines now: remove it from longFuncs (docs/funclen_test.go)", key, lines)
				}
			case !listed:
				t.Errorf("%s is %d lines long, more than %d: split it (by job: gather, decide, act)", key, lines, maxFuncLines)
			case lines > allowed:
				t.Errorf("%s grew to %d lines, from %d: it is over %d already; split it, and remove it from longFuncs", key, lines, allowed, maxFuncLines)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for key := range longFuncs {
		if !seen[key] {
			t.Errorf("longFuncs lists %s, which is gone: remove its line", key)
		}
	}
}

// funcLengths is the length in lines of each function declared in f, by
// name (Type.Method for a method), from its func line to its closing brace.
func funcLengths(fset *token.FileSet, f *ast.File) map[string]int {
	out := map[string]int{}
	for _, d := range f.Decls {
		fn, ok := d.(*ast.FuncDecl)
		if !ok || fn.Body == nil {
			continue
		}
		name := fn.Name.Name
		if fn.Recv != nil && len(fn.Recv.List) == 1 {
			name = recvName(fn.Recv.List[0].Type) + "." + name
		}
		out[name] = fset.Position(fn.Body.Rbrace).Line - fset.Position(fn.Pos()).Line + 1
	}
	return out
}

// recvName is the type name of a method's receiver.
func recvName(e ast.Expr) string {
	switch e := e.(type) {
	case *ast.StarExpr:
		return recvName(e.X)
	case *ast.IndexExpr:
		return recvName(e.X)
	case *ast.IndexListExpr:
		return recvName(e.X)
	case *ast.Ident:
		return e.Name
	}
	return fmt.Sprintf("%T", e)
}

// walkModuleGo calls fn with every Go file of the main module that is not a
// test, as go list ./... has them (openModuleDirs says which directories).
func walkModuleGo(root string, fn func(path string) error) error {
	return filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if path == root {
				return nil
			}
			if skipDir(path, d.Name()) {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		return fn(path)
	})
}
