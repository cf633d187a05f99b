package testenv

import (
	"fmt"
	"os/exec"
	"path/filepath"
	"runtime"
)

// Build builds the main packages pkgs, each a directory from the
// repository's root such as "cmd/plugd", into dir, named after the
// directory's last element. A package in a module of its own
// (test/interop/grpc127, test/kube's commands) is built in that module.
// Call it once from TestMain (test/kube: controlplane.Build): the go
// command's build cache makes later runs relink only.
//
// The binaries are built without -race, even under go test -race: they are
// the peers of the code under test, or the code under test run as a user
// runs it, and they start faster so.
func Build(dir string, pkgs ...string) error {
	for _, pkg := range pkgs {
		cmd := exec.Command("go", "build", "-o", filepath.Join(dir, filepath.Base(pkg)), ".")
		cmd.Dir = filepath.Join(Root(), filepath.FromSlash(pkg))
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("building %s: %v\n%s", pkg, err, out)
		}
	}
	return nil
}

// Root is the repository's root directory, found from this file's place in
// it.
func Root() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..")
}
