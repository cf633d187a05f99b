package pluginmanager

import (
	"go/ast"
	"go/parser"
	gotoken "go/token"
	"io/fs"
	"path/filepath"
	"strings"
	"testing"
)

// parseTree parses every Go file of the package and the packages below it.
func parseTree(t *testing.T) (*gotoken.FileSet, map[string]*ast.File) {
	t.Helper()
	fset := gotoken.NewFileSet()
	files := make(map[string]*ast.File)
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && d.Name() == "testdata" {
			return fs.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, 0)
		if err != nil {
			return err
		}
		files[path] = f
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return fset, files
}

// The registry's lock is taken and let go only by registry.lock and
// unlock, which keep the lines said under it for after it (registry.go):
// nothing reaches registry.mu otherwise. lockrule_test.go checks the rest.
func TestRegistryLockTakenOnlyByLockAndUnlock(t *testing.T) {
	fset, files := parseTree(t)
	for _, f := range files {
		for _, d := range f.Decls {
			fn, ok := d.(*ast.FuncDecl)
			if !ok || fn.Body == nil {
				continue
			}
			onRegistry := false
			if fn.Recv != nil {
				if star, ok := fn.Recv.List[0].Type.(*ast.StarExpr); ok {
					id, _ := star.X.(*ast.Ident)
					onRegistry = id != nil && id.Name == "registry"
				}
			}
			if onRegistry && (fn.Name.Name == "lock" || fn.Name.Name == "unlock") {
				continue
			}
			ast.Inspect(fn.Body, func(n ast.Node) bool {
				sel, ok := n.(*ast.SelectorExpr)
				if !ok || sel.Sel.Name != "mu" {
					return true
				}
				// x.reg.mu anywhere, or r.mu in a method of the registry.
				inner, isSel := sel.X.(*ast.SelectorExpr)
				if isSel && inner.Sel.Name == "reg" || onRegistry {
					t.Errorf("%s: %s reaches the registry's mutex: take it with registry.lock and unlock", fset.Position(sel.Pos()), fn.Name.Name)
				}
				return true
			})
		}
	}
}
