package interop

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/types/descriptorpb"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
)

// bin is where Run keeps what it builds; empty outside Run.
var bin string

// Run runs a test package's tests (m.Run) with a directory for the servers
// that Start builds, and removes it afterwards. Call it from TestMain.
func Run(m interface{ Run() int }) int {
	d, err := os.MkdirTemp("", "interop-bin")
	if err != nil {
		fmt.Fprintln(os.Stderr, "interop:", err)
		return 1
	}
	defer os.RemoveAll(d)
	bin = d
	defer func() { bin = "" }()
	return m.Run()
}

// builds are the Go servers, each built once for the run.
var builds = map[Stack]*build{
	GRPCGo:    {module: "../..", pkg: "./test/interop/cmd/grpcgo-server"},
	Raw:       {module: "../..", pkg: "./test/interop/cmd/rawh2-server"},
	GRPCGo127: {module: "grpc127", pkg: "."},
}

type build struct {
	module string // the module's directory, from this package's
	pkg    string // the package, from the module's directory
	once   sync.Once
	exe    string
	err    error
}

// built returns the binary of stack's server, building it on first use.
func built(t testing.TB, stack Stack) string {
	t.Helper()
	if bin == "" {
		t.Fatal("interop: servers written in Go are built by interop.Run: call it from TestMain")
	}
	b := builds[stack]
	b.once.Do(func() {
		exe := filepath.Join(bin, string(stack))
		cmd := exec.Command("go", "build", "-o", exe, b.pkg)
		cmd.Dir = filepath.Join(dir(), b.module)
		if out, err := cmd.CombinedOutput(); err != nil {
			b.err = fmt.Errorf("building the %s server (in %s): %v\n%s", stack, cmd.Dir, err, out)
			return
		}
		b.exe = exe
	})
	if b.err != nil {
		t.Fatal("interop: ", b.err)
	}
	return b.exe
}

var desc struct {
	once sync.Once
	path string
	err  error
}

// descriptor returns a file holding the registration API's descriptor
// (a FileDescriptorSet), taken from k8s.io/kubelet's Go package: the Python
// server builds its messages from it, as there is no protoc here to
// generate them with.
func descriptor(t testing.TB) string {
	t.Helper()
	if bin == "" {
		t.Fatal("interop: call interop.Run from TestMain")
	}
	desc.once.Do(func() {
		set := &descriptorpb.FileDescriptorSet{File: []*descriptorpb.FileDescriptorProto{protodesc.ToFileDescriptorProto(registerapi.File_staging_src_k8s_io_kubelet_pkg_apis_pluginregistration_v1_api_proto)}}
		b, err := proto.Marshal(set)
		if err != nil {
			desc.err = err
			return
		}
		desc.path = filepath.Join(bin, "pluginregistration.binpb")
		desc.err = os.WriteFile(desc.path, b, 0o644)
	})
	if desc.err != nil {
		t.Fatal("interop: writing the API's descriptor: ", desc.err)
	}
	return desc.path
}
