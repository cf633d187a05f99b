package deviceplugin_test

import (
	"context"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
	api "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/plugd/plugd/handlers/deviceplugin"
	"github.com/plugd/plugd/internal/testenv"
	"github.com/plugd/plugd/plugin"
)

// floodingPlugin sends device lists of 10,000 devices as fast as it can,
// each with devices named after the list's number.
type floodingPlugin struct {
	api.UnimplementedDevicePluginServer
	sent   atomic.Int64
	enough int64
	many   chan struct{} // closed when enough lists are sent
}

func floodList(n int) *api.ListAndWatchResponse {
	devs := make([]*api.Device, 10000)
	for i := range devs {
		devs[i] = &api.Device{ID: fmt.Sprintf("l%05d-%05d", n, i), Health: api.Healthy}
	}
	return &api.ListAndWatchResponse{Devices: devs}
}

func (p *floodingPlugin) GetDevicePluginOptions(context.Context, *api.Empty) (*api.DevicePluginOptions, error) {
	return &api.DevicePluginOptions{}, nil
}

func (p *floodingPlugin) ListAndWatch(_ *api.Empty, s api.DevicePlugin_ListAndWatchServer) error {
	for n := 0; ; n++ {
		if err := s.Send(floodList(n)); err != nil {
			return err
		}
		if p.sent.Add(1) == p.enough {
			close(p.many)
		}
	}
}

// listNumber is the number of the list whose devices r holds.
func listNumber(t *testing.T, r deviceplugin.Resource) int {
	t.Helper()
	if len(r.Devices) == 0 {
		t.Fatalf("resource %s has no devices", r.Name)
	}
	n, err := strconv.Atoi(strings.TrimPrefix(strings.SplitN(r.Devices[0].ID, "-", 2)[0], "l"))
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// Issue 13, item 5: a device plugin that floods its ListAndWatch stream is
// slowed to the pace (1 MiB of lists a second, 4 MiB at once): the handler
// takes a burst, then waits, and gRPC's flow control holds the plugin back
// in its Send; each step of the clock lets more through.
func TestListAndWatchFloodIsPaced(t *testing.T) {
	clk := testenv.NewTimerClock()
	e := newEnv(t, deviceplugin.Options{GracePeriod: testenv.Timeout, Clock: clk})
	fp := &floodingPlugin{enough: 500, many: make(chan struct{})}
	endpoint := filepath.Join(testenv.ShortDir(t, "dpf"), "flood.sock")
	testenv.ServeGRPC(t, endpoint, func(s grpc.ServiceRegistrar) { api.RegisterDevicePluginServer(s, fp) })
	registered(t, e.startPlugin(plugin.Config{Name: gpu, Socket: "gpu.sock", Endpoint: endpoint}))

	size := proto.Size(floodList(0))
	var d time.Duration
	select {
	case d = <-clk.Timers:
	case <-fp.many:
		t.Fatalf("the handler took %d lists of %d KiB without slowing the stream; it holds list %d", fp.enough, size>>10, listNumber(t, e.resource(gpu)))
	case <-time.After(testenv.Timeout):
		t.Fatalf("the handler neither slowed the stream nor took %d lists within %s", fp.enough, testenv.Timeout)
	}
	taken := listNumber(t, e.resource(gpu))
	if most := (4<<20)/size + 2; taken > most {
		t.Errorf("the handler took %d lists of %d KiB at once, more than the burst of 4 MiB allows (%d)", taken+1, size>>10, most)
	}

	// Each step of the clock over the wait lets the next list through, and
	// no more: the handler takes it, and waits again.
	for range 3 {
		before := taken
		clk.Step(d)
		select {
		case d = <-clk.Timers:
		case <-time.After(testenv.Timeout):
			t.Fatalf("the handler did not wait again; it holds list %d", listNumber(t, e.resource(gpu)))
		}
		if taken = listNumber(t, e.resource(gpu)); taken != before+1 {
			t.Errorf("a step of the clock took the handler from list %d to list %d", before, taken)
		}
	}
	// The plugin is held back: it sent only what the flow control window
	// (1 MiB) takes beyond what the handler took.
	if sent, most := fp.sent.Load(), int64(taken+1+(1<<20)/size+4); sent > most {
		t.Errorf("the plugin sent %d lists while the handler took %d: more than the window holds (%d)", sent, taken+1, most)
	}
	t.Logf("lists of %d KiB: the handler took %d, the plugin could send %d", size>>10, taken+1, fp.sent.Load())
}
