package pluginmanager

import (
	"fmt"
	"go/ast"
	"go/parser"
	gotoken "go/token"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// The rule of the registry's lock (registry.go): it is never held across a
// log write or a system call on a file or a socket, since every worker
// takes it. This file checks the rule on the source, for every path
// through the code, not only the ones the tests run:
//
//   - The lock is taken by registry.lock (or registry.mu.Lock inside the
//     registry's own methods) and let go by unlock; a defer of unlock
//     holds it to the end of the function.
//   - Each function is followed statement by statement, knowing whether
//     the lock is held; a branch that may end with it held counts as held.
//   - A function called while the lock is held is followed again as entered
//     with it held (by name: a method call reaches every method of that
//     name), until nothing changes: a helper that stats a file, called
//     under the lock, is caught where it stats.
//   - What is caught: a call of a logger's writing methods (loggers are
//     named log in this package) or of a handler's Handle, and a call that
//     reaches the system: the os, syscall, unix, windows, net, dirtrust and
//     fsnotify packages, filepath's walks and symlink resolution,
//     confine.ResolveExisting, peercred.Of, unaryconn's dials and calls, and
//     the methods that dial, call or close (Dial, Socket, Invoke, Close,
//     Watch, Unwatch, Reopen, a watch's Add and Remove).
//   - A function literal is followed as entered without the lock: it runs
//     elsewhere (a goroutine, a callback).
//
// TestLockRuleCatches runs it on testdata/lockrule, which breaks the rule
// each way, and holds the report to what is there.

// TestNoSystemCallOrLogUnderRegistryLock checks the package's code.
func TestNoSystemCallOrLogUnderRegistryLock(t *testing.T) {
	for _, p := range checkLockRule(t, ".") {
		t.Error(p)
	}
}

// TestLockRuleCatches shows the check finds what breaks the rule, and only
// that.
func TestLockRuleCatches(t *testing.T) {
	got := checkLockRule(t, filepath.Join("testdata", "lockrule"))
	want := []string{
		"bad.go:24: w.log.Info, a log write",
		"bad.go:30: os.Lstat, a system call", // in stat, called under the lock at line 55
		"bad.go:37: os.Remove, a system call",
		"bad.go:43: conn.Close, a system call",
		"bad.go:77: os.Lstat, a system call",
	}
	for i := range got {
		got[i] = got[i][:strings.Index(got[i], " while")] // the place and the call
	}
	slices.Sort(got)
	if !slices.Equal(got, want) {
		t.Errorf("the check reports\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// checkLockRule follows the non-test Go files of dir, and returns a line
// for each log write or system call it finds made with the registry's lock
// held.
func checkLockRule(t *testing.T, dir string) []string {
	t.Helper()
	c := &lockCheck{fset: gotoken.NewFileSet(), funcs: map[string][]*ast.FuncDecl{}, entered: map[*ast.FuncDecl]bool{},
		imports: map[*ast.FuncDecl]map[string]bool{}}
	files, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil {
		t.Fatal(err)
	}
	for _, path := range files {
		if strings.HasSuffix(path, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(c.fset, path, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		imports := map[string]bool{}
		for _, im := range f.Imports {
			p, _ := strconv.Unquote(im.Path.Value)
			name := filepath.Base(p)
			if im.Name != nil {
				name = im.Name.Name
			}
			imports[name] = true
		}
		for _, d := range f.Decls {
			if fn, ok := d.(*ast.FuncDecl); ok && fn.Body != nil {
				c.funcs[fn.Name.Name] = append(c.funcs[fn.Name.Name], fn)
				c.imports[fn] = imports
			}
		}
	}
	if len(c.funcs) == 0 {
		t.Fatalf("no Go files in %s", dir)
	}
	// Follow every function until no call made under the lock reaches a
	// function not yet followed as entered with it held.
	for changed := true; changed; {
		changed = false
		c.problems = nil
		for _, fns := range c.funcs {
			for _, fn := range fns {
				changed = c.follow(fn) || changed
			}
		}
	}
	return c.problems
}

// lockCheck is the state of checkLockRule.
type lockCheck struct {
	fset     *gotoken.FileSet
	funcs    map[string][]*ast.FuncDecl        // by name, methods and functions
	entered  map[*ast.FuncDecl]bool            // called with the lock held somewhere
	imports  map[*ast.FuncDecl]map[string]bool // the package names its file imports
	problems []string

	fn      *ast.FuncDecl // the function followed
	changed bool          // a function is newly found entered with the lock held
}

// follow follows fn, and reports whether that found a function entered
// with the lock held that was not known to be.
func (c *lockCheck) follow(fn *ast.FuncDecl) bool {
	c.fn, c.changed = fn, false
	c.stmts(fn.Body.List, c.entered[fn] || strings.HasSuffix(fn.Name.Name, "Locked"))
	return c.changed
}

// stmts follows a list of statements entered with the lock held or not,
// and returns whether it may be held after them, and whether they end the
// function (no statement after them runs).
func (c *lockCheck) stmts(list []ast.Stmt, held bool) (after, ends bool) {
	for _, s := range list {
		if held, ends = c.stmt(s, held); ends {
			return held, true
		}
	}
	return held, false
}

func (c *lockCheck) stmt(s ast.Stmt, held bool) (after, ends bool) {
	switch s := s.(type) {
	case *ast.BlockStmt:
		return c.stmts(s.List, held)
	case *ast.LabeledStmt:
		return c.stmt(s.Stmt, held)
	case *ast.ReturnStmt:
		for _, r := range s.Results {
			held = c.expr(r, held)
		}
		return held, true
	case *ast.DeferStmt:
		if c.lockOp(s.Call) == "unlock" {
			return held, false // held to the end of the function
		}
		return c.expr(s.Call, held), false
	case *ast.GoStmt:
		return held, false // runs on its own goroutine
	case *ast.IfStmt:
		if s.Init != nil {
			held, _ = c.stmt(s.Init, held)
		}
		held = c.expr(s.Cond, held)
		thenHeld, thenEnds := c.stmts(s.Body.List, held)
		elseHeld, elseEnds := held, false
		if s.Else != nil {
			elseHeld, elseEnds = c.stmt(s.Else, held)
		}
		return joinBranches([]bool{thenHeld, elseHeld}, []bool{thenEnds, elseEnds})
	case *ast.SwitchStmt:
		if s.Init != nil {
			held, _ = c.stmt(s.Init, held)
		}
		if s.Tag != nil {
			held = c.expr(s.Tag, held)
		}
		return c.clauses(s.Body, held)
	case *ast.TypeSwitchStmt:
		if s.Init != nil {
			held, _ = c.stmt(s.Init, held)
		}
		held, _ = c.stmt(s.Assign, held)
		return c.clauses(s.Body, held)
	case *ast.SelectStmt:
		return c.clauses(s.Body, held)
	case *ast.ForStmt:
		if s.Init != nil {
			held, _ = c.stmt(s.Init, held)
		}
		return c.loop(s.Cond, s.Post, s.Body, held)
	case *ast.RangeStmt:
		held = c.expr(s.X, held)
		return c.loop(nil, nil, s.Body, held)
	case *ast.ExprStmt:
		return c.expr(s.X, held), isPanic(s.X)
	case *ast.AssignStmt:
		for _, e := range s.Rhs {
			held = c.expr(e, held)
		}
		return held, false
	case *ast.DeclStmt, *ast.IncDecStmt, *ast.SendStmt, *ast.BranchStmt, *ast.EmptyStmt:
		ast.Inspect(s, func(n ast.Node) bool {
			if e, ok := n.(ast.Expr); ok {
				held = c.expr(e, held)
				return false
			}
			return true
		})
		return held, false
	}
	panic(fmt.Sprintf("lockrule: %T not followed", s))
}

// clauses follows the clauses of a switch or select: each is entered as
// the statement was; after it, the lock may be held if it may be after any
// clause that does not end the function, or if no clause ran.
func (c *lockCheck) clauses(body *ast.BlockStmt, held bool) (after, ends bool) {
	var helds, endings []bool
	hasDefault := false
	for _, cl := range body.List {
		var list []ast.Stmt
		switch cl := cl.(type) {
		case *ast.CaseClause:
			hasDefault = hasDefault || cl.List == nil
			for _, e := range cl.List {
				held = c.expr(e, held)
			}
			list = cl.Body
		case *ast.CommClause:
			hasDefault = hasDefault || cl.Comm == nil
			if cl.Comm != nil {
				held, _ = c.stmt(cl.Comm, held)
			}
			list = cl.Body
		}
		h, e := c.stmts(list, held)
		helds, endings = append(helds, h), append(endings, e)
	}
	if !hasDefault {
		helds, endings = append(helds, held), append(endings, false)
	}
	return joinBranches(helds, endings)
}

// loop follows a loop's body twice, the second time entered as the first
// left it too.
func (c *lockCheck) loop(cond ast.Expr, post ast.Stmt, body *ast.BlockStmt, held bool) (after, ends bool) {
	for range 2 {
		if cond != nil {
			held = c.expr(cond, held)
		}
		h, e := c.stmts(body.List, held)
		if !e {
			held = held || h
		}
		if post != nil {
			held, _ = c.stmt(post, held)
		}
	}
	return held, false // a loop may always be left (break) or not entered
}

// joinBranches is what follows branches: the lock may be held if it may be
// after any branch that does not end the function; they end it if all do.
func joinBranches(helds, endings []bool) (after, ends bool) {
	ends = true
	for i := range helds {
		if !endings[i] {
			ends = false
			after = after || helds[i]
		}
	}
	return after, ends
}

// expr follows the calls in e in the order they run, checking each made
// with the lock held, and returns whether it is held after e.
func (c *lockCheck) expr(e ast.Expr, held bool) bool {
	ast.Inspect(e, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.FuncLit:
			return false // runs elsewhere; followed as its own function would be, without the lock
		case *ast.CallExpr:
			for _, a := range n.Args {
				held = c.expr(a, held)
			}
			if sel, ok := n.Fun.(*ast.SelectorExpr); ok {
				held = c.expr(sel.X, held)
			}
			switch c.lockOp(n) {
			case "lock":
				held = true
			case "unlock":
				held = false
			default:
				if held {
					c.call(n)
				}
			}
			return false
		}
		return true
	})
	return held
}

// lockOp says whether call takes or lets go of the registry's lock.
func (c *lockCheck) lockOp(call *ast.CallExpr) string {
	sel, ok := call.Fun.(*ast.SelectorExpr)
	if !ok || len(call.Args) != 0 {
		return ""
	}
	name := sel.Sel.Name
	switch x := sel.X.(type) {
	case *ast.Ident:
		if x.Name == "reg" || x.Name == recvName(c.fn, "registry") {
			return map[string]string{"lock": "lock", "unlock": "unlock"}[name]
		}
	case *ast.SelectorExpr:
		if in, ok := x.X.(*ast.SelectorExpr); ok && x.Sel.Name == "mu" && in.Sel.Name == "reg" {
			return map[string]string{"Lock": "lock", "Unlock": "unlock"}[name] // x.reg.mu.Lock, which registry.lock is for
		}
		if x.Sel.Name == "reg" {
			return map[string]string{"lock": "lock", "unlock": "unlock"}[name]
		}
		if id, ok := x.X.(*ast.Ident); ok && x.Sel.Name == "mu" && id.Name == recvName(c.fn, "registry") {
			return map[string]string{"Lock": "lock", "Unlock": "unlock"}[name]
		}
	}
	return ""
}

// recvName is the name of fn's receiver if fn is a method of *typ.
func recvName(fn *ast.FuncDecl, typ string) string {
	if fn.Recv == nil || len(fn.Recv.List) == 0 || len(fn.Recv.List[0].Names) == 0 {
		return ""
	}
	star, ok := fn.Recv.List[0].Type.(*ast.StarExpr)
	if id, isID := star.X.(*ast.Ident); !ok || !isID || id.Name != typ {
		return ""
	}
	return fn.Recv.List[0].Names[0].Name
}

// call checks a call made with the lock held: a log write or a system call
// is a problem; a function of the package is followed as entered with the
// lock held.
func (c *lockCheck) call(call *ast.CallExpr) {
	if what := c.effect(call); what != "" {
		pos := c.fset.Position(call.Pos())
		p := fmt.Sprintf("%s:%d: %s while the registry's lock is held (in %s)", filepath.Base(pos.Filename), pos.Line, what, c.fn.Name.Name)
		if !slices.Contains(c.problems, p) { // a loop is followed twice
			c.problems = append(c.problems, p)
		}
		return
	}
	var name string
	switch f := call.Fun.(type) {
	case *ast.Ident:
		name = f.Name
	case *ast.SelectorExpr:
		if id, ok := f.X.(*ast.Ident); ok && c.imports[c.fn][id.Name] {
			return // another package's function, not a system call (effect)
		}
		name = f.Sel.Name
	}
	for _, fn := range c.funcs[name] {
		if !c.entered[fn] {
			c.entered[fn], c.changed = true, true
		}
	}
}

// The calls that reach the system: every function of these packages, or
// the ones named, and methods of these names on anything.
var (
	systemPackages = map[string]bool{"os": true, "syscall": true, "unix": true, "windows": true, "net": true, "dirtrust": true, "fsnotify": true}
	systemFuncs    = map[string]bool{"filepath.Walk": true, "filepath.WalkDir": true, "filepath.EvalSymlinks": true, "filepath.Abs": true,
		"confine.ResolveExisting": true, "peercred.Of": true, "unaryconn.NewConn": true, "unaryconn.InvokeGRPCWith": true}
	systemMethods = map[string]bool{"Dial": true, "DialContext": true, "Socket": true, "Invoke": true, "Close": true, "Watch": true,
		"Unwatch": true, "Reopen": true, "Readdirnames": true}
	logMethods = map[string]bool{"Debug": true, "Info": true, "Warn": true, "Error": true, "Log": true, "LogAttrs": true,
		"DebugContext": true, "InfoContext": true, "WarnContext": true, "ErrorContext": true}
)

// effect names what call does if it is a log write or a system call.
func (c *lockCheck) effect(call *ast.CallExpr) string {
	sel, ok := call.Fun.(*ast.SelectorExpr)
	if !ok {
		return ""
	}
	name, x := sel.Sel.Name, exprString(sel.X)
	if id, ok := sel.X.(*ast.Ident); ok && c.imports[c.fn][id.Name] {
		if systemPackages[id.Name] && !strings.HasPrefix(name, "Get") || systemFuncs[id.Name+"."+name] {
			return x + "." + name + ", a system call"
		}
		return ""
	}
	last := x[strings.LastIndex(x, ".")+1:]
	switch {
	case logMethods[name] && last == "log", name == "Handle" && strings.HasSuffix(x, "Handler()"):
		return x + "." + name + ", a log write"
	case systemMethods[name], last == "fs" && (name == "Add" || name == "Remove"):
		return x + "." + name + ", a system call"
	}
	return ""
}

// exprString is e written out, for the report and the checks above.
func exprString(e ast.Expr) string {
	switch e := e.(type) {
	case *ast.Ident:
		return e.Name
	case *ast.SelectorExpr:
		return exprString(e.X) + "." + e.Sel.Name
	case *ast.CallExpr:
		return exprString(e.Fun) + "()"
	case *ast.StarExpr:
		return exprString(e.X)
	case *ast.ParenExpr:
		return exprString(e.X)
	case *ast.IndexExpr:
		return exprString(e.X) + "[]"
	}
	return "?"
}

// isPanic reports whether e is a call of panic: nothing after it runs.
func isPanic(e ast.Expr) bool {
	call, ok := e.(*ast.CallExpr)
	if !ok {
		return false
	}
	id, ok := call.Fun.(*ast.Ident)
	return ok && id.Name == "panic"
}
