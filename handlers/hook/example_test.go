package hook_test

import (
	"context"
	"fmt"
	"log"

	"github.com/plugd/plugd/handlers/hook"
	"github.com/plugd/plugd/pluginmanager"
)

// A validate hook that lets in only plugins whose name ends in .example.com,
// and says why when it refuses one. A manager would be given it with
// m.AddHandler("example.com/GPUPlugin", h); here it is called directly.
func Example() {
	h, err := hook.New(hook.Config{
		Command: []string{"/bin/sh", "-c", `
			case "$PLUGD_PLUGIN_NAME" in
			*.example.com) exit 0 ;;
			*) echo "only *.example.com plugins are allowed, not $PLUGD_PLUGIN_NAME" >&2; exit 1 ;;
			esac`},
		Events: []string{"validate"},
	}, hook.Options{})
	if err != nil {
		log.Fatal(err)
	}
	ctx := context.Background()
	for _, name := range []string{"gpu.example.com", "gpu.example.org"} {
		p := pluginmanager.Plugin{Type: "example.com/GPUPlugin", Name: name, Endpoint: "/run/gpu.sock", Versions: []string{"v1"}, Socket: "/run/gpu-" + name + ".sock"}
		err := h.Validate(ctx, p)
		run := h.Details(p).(hook.Run)
		fmt.Printf("%s: %s, exit status %d, err: %v\n", name, run.Result, *run.ExitStatus, err)
	}
	// Output:
	// gpu.example.com: accepted, exit status 0, err: <nil>
	// gpu.example.org: refused, exit status 1, err: validate hook refused the plugin (exit status 1): only *.example.com plugins are allowed, not gpu.example.org
}
