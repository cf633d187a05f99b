package interop

import (
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/types/descriptorpb"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"

	"github.com/plugd/plugd/internal/testenv"
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

// builds are the Go servers, each built once for the run: from the
// repository's root, as testenv.Build takes them.
var builds = map[Stack]*build{
	GRPCGo:    {pkg: "test/interop/cmd/grpcgo-server"},
	Raw:       {pkg: "test/interop/cmd/rawh2-server"},
	GRPCGo127: {pkg: "test/interop/grpc127"},
}

type build struct {
	pkg  string
	once sync.Once
	err  error
}

// built returns the binary of stack's server, building it on first use.
func built(t testing.TB, stack Stack) string {
	t.Helper()
	if bin == "" {
		t.Fatal("interop: servers written in Go are built by interop.Run: call it from TestMain")
	}
	b := builds[stack]
	b.once.Do(func() { b.err = testenv.Build(bin, b.pkg) })
	if b.err != nil {
		t.Fatal("interop: ", b.err)
	}
	return filepath.Join(bin, filepath.Base(b.pkg))
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
