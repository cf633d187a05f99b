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

// maxFuncLines is the longest a function in pluginmanager may be, from its
// func line to its closing brace: a function longer than a screen holds
// more than one decision, and reads as a list of branches.
const maxFuncLines = 80

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

// No function in pluginmanager, tests included, is longer than
// maxFuncLines.
func TestFunctionsAreShort(t *testing.T) {
	fset, files := parseTree(t)
	for path, f := range files {
		ast.Inspect(f, func(n ast.Node) bool {
			var name string
			var body *ast.BlockStmt
			switch fn := n.(type) {
			case *ast.FuncDecl:
				name, body = fn.Name.Name, fn.Body
			case *ast.FuncLit:
				name, body = "a function literal", fn.Body
			default:
				return true
			}
			if body == nil {
				return true
			}
			from, to := fset.Position(n.Pos()).Line, fset.Position(body.Rbrace).Line
			if lines := to - from + 1; lines > maxFuncLines {
				t.Errorf("%s:%d: %s is %d lines long, more than %d: split it", path, from, name, lines, maxFuncLines)
			}
			return true
		})
	}
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
