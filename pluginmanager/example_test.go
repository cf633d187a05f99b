package pluginmanager_test

import (
	"context"
	"fmt"
	"log"
	"os"

	"github.com/plugd/plugd/plugin"
	"github.com/plugd/plugd/pluginmanager"
)

// A node agent that accepts CSI drivers: every driver that puts a registration
// socket in the directory is handed to the handler.
func Example() {
	dir, err := os.MkdirTemp("", "plugins")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)

	m, err := pluginmanager.New(pluginmanager.Options{Dir: dir})
	if err != nil {
		log.Fatal(err)
	}
	registered := make(chan pluginmanager.Plugin, 1)
	m.AddHandler("CSIPlugin", pluginmanager.HandlerFuncs{
		RegisterFunc: func(ctx context.Context, p pluginmanager.Plugin) error {
			registered <- p
			return nil
		},
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- m.Run(ctx) }()

	// A CSI driver registers, as node-driver-registrar would do for it.
	driver, err := plugin.Start(plugin.Config{Dir: dir, Type: "CSIPlugin", Name: "csi.example.com", Versions: []string{"1.0.0"}})
	if err != nil {
		log.Fatal(err)
	}
	defer driver.Close()

	p := <-registered
	fmt.Println("registered", p.Type, p.Name, p.Versions)
	if err := driver.WaitRegistered(ctx); err != nil {
		log.Fatal(err)
	}
	fmt.Println("driver told it is registered:", driver.Registered())

	cancel()
	if err := <-done; err != nil {
		log.Fatal(err)
	}
	// Output:
	// registered CSIPlugin csi.example.com [1.0.0]
	// driver told it is registered: true
}

// Watching what the manager does, as a status page or a test would.
func ExampleManager_Subscribe() {
	dir, err := os.MkdirTemp("", "plugins")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)

	m, err := pluginmanager.New(pluginmanager.Options{Dir: dir})
	if err != nil {
		log.Fatal(err)
	}
	sub := m.Subscribe()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- m.Run(ctx) }()

	// No handler was added for this type: the plugin is rejected, and told why.
	p, err := plugin.Start(plugin.Config{Dir: dir, Type: "example.com/Widget", Name: "widget", Versions: []string{"v1"}})
	if err != nil {
		log.Fatal(err)
	}
	defer p.Close()
	for ev := range sub.Events() {
		fmt.Printf("%s name=%q reason=%q\n", ev.Type, ev.Plugin.Name, ev.Reason)
		if ev.Type == pluginmanager.EventRejected {
			break
		}
	}
	st, _ := p.Status()
	fmt.Println("plugin told:", st.Error)

	cancel()
	if err := <-done; err != nil {
		log.Fatal(err)
	}
	// Output:
	// Discovered name="" reason=""
	// Rejected name="widget" reason="no_handler"
	// plugin told: no handler for plugin type "example.com/Widget": the manager has none for it
}
