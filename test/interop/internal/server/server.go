// Package server is what the interop servers written in Go in this module
// (grpcgo-server, rawh2-server) share: the command line that package
// interop starts them with, and their report, one JSON object a line on
// standard output.
package server

import (
	"encoding/json"
	"flag"
	"os"
	"strings"
	"sync"

	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"

	"github.com/plugd/plugd/api"
)

// Config is what the command line says.
type Config struct {
	Socket       string
	Info         *registerapi.PluginInfo // what GetInfo answers
	Gzip         bool                    // compress every answer with gzip
	TrailerBytes int                     // a trailer of this many bytes on every answer
	NotifyError  string                  // answer NotifyRegistrationStatus with this error
}

// Flags declares the common flags on the default flag set; call Parse, then
// Config.
func Flags() func() Config {
	socket := flag.String("socket", "", "unix socket to listen on")
	typ := flag.String("type", api.CSIPlugin, "PluginInfo.type")
	name := flag.String("name", "interop.example.com", "PluginInfo.name")
	endpoint := flag.String("endpoint", "", "PluginInfo.endpoint")
	versions := flag.String("versions", "", "PluginInfo.supported_versions, comma-separated")
	gzip := flag.Bool("gzip", false, "compress every answer with gzip, whatever the client offers")
	trailerBytes := flag.Int("trailer-bytes", 0, "a trailer of this many bytes on every answer")
	notifyError := flag.String("notify-error", "", "answer NotifyRegistrationStatus with this error")
	return func() Config {
		c := Config{
			Socket:       *socket,
			Info:         &registerapi.PluginInfo{Type: *typ, Name: *name, Endpoint: *endpoint},
			Gzip:         *gzip,
			TrailerBytes: *trailerBytes,
			NotifyError:  *notifyError,
		}
		if *versions != "" {
			c.Info.SupportedVersions = strings.Split(*versions, ",")
		}
		return c
	}
}

// BigTrailer is the value of a trailer of n bytes: "{}" is what HPACK's
// Huffman coding does not shorten, so that it is n bytes on the wire too.
func BigTrailer(n int) string { return strings.Repeat("{}", n/2) }

var out struct {
	sync.Mutex
	enc *json.Encoder
}

// Emit reports an event (package interop's Event) on standard output.
func Emit(event string, fields map[string]any) {
	ev := map[string]any{"event": event}
	for k, v := range fields {
		ev[k] = v
	}
	out.Lock()
	defer out.Unlock()
	if out.enc == nil {
		out.enc = json.NewEncoder(os.Stdout)
	}
	out.enc.Encode(ev)
}
