package plugin_test

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log"
	"os"
	"path/filepath"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"

	"github.com/plugd/plugd/plugin"
)

// A device plugin announces itself, and a minimal manager discovers it,
// asks for its info and accepts it.
func Example() {
	// os.MkdirTemp rather than a deeper directory: unix socket paths must
	// stay under 108 bytes.
	dir, err := os.MkdirTemp("", "plg")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)

	srv, err := plugin.Start(plugin.Config{
		Dir:      dir,
		Type:     registerapi.DevicePlugin,
		Name:     "gpu.example.com",
		Versions: []string{"v1beta1"},
		OnStatus: func(st plugin.Status) {
			fmt.Printf("plugin: manager says registered=%v\n", st.Registered)
		},
	})
	if err != nil {
		log.Fatal(err)
	}
	defer srv.Close()
	fmt.Println("socket:", filepath.Base(srv.Path()))

	// The manager's side.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := grpc.NewClient("unix:"+srv.Path(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()
	manager := registerapi.NewRegistrationClient(conn)
	info, err := manager.GetInfo(ctx, &registerapi.InfoRequest{})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("manager: type=%s name=%s endpoint=%q versions=%v\n",
		info.Type, info.Name, info.Endpoint, info.SupportedVersions)
	if _, err := manager.NotifyRegistrationStatus(ctx, &registerapi.RegistrationStatus{PluginRegistered: true}); err != nil {
		log.Fatal(err)
	}

	// Back on the plugin's side.
	if err := srv.WaitRegistered(ctx); err != nil {
		log.Fatal(err)
	}
	fmt.Println("plugin: registered:", srv.Registered(), "notifications:", srv.Notifications())

	if err := srv.Close(); err != nil {
		log.Fatal(err)
	}
	_, err = os.Lstat(srv.Path())
	fmt.Println("socket removed:", errors.Is(err, fs.ErrNotExist))

	// Output:
	// socket: gpu.example.com.sock
	// manager: type=DevicePlugin name=gpu.example.com endpoint="" versions=[v1beta1]
	// plugin: manager says registered=true
	// plugin: registered: true notifications: 1
	// socket removed: true
}
