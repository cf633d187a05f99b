package pluginmanager

import (
	"testing"
	"time"
)

// Two instances of a plugin whose sockets were born in the same tick of the
// filesystem's clock: the one discovered later is the newest, whichever
// sorts first by path (handlers/dra TestRollingUpdate once failed so, with
// "...pod-a..." the old socket and "...pod-b..." the new).
func TestNewestOfSocketsBornAtOnce(t *testing.T) {
	born := time.Unix(1700000000, 4000000)
	for _, tc := range []struct {
		name             string
		oldPath, newPath string
	}{
		{"old sorts first", "/r/a.sock", "/r/b.sock"},
		{"new sorts first", "/r/b.sock", "/r/a.sock"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ps := []PluginStatus{
				{Plugin: Plugin{Type: "DRAPlugin", Name: "d", Socket: tc.oldPath}, State: StateRegistered, Created: born},
				{Plugin: Plugin{Type: "DRAPlugin", Name: "d", Socket: tc.newPath}, State: StateRegistered, Created: born},
			}
			markNewest(ps, map[string]uint64{tc.oldPath: 1, tc.newPath: 2})
			for _, s := range ps {
				if want := s.Socket == tc.newPath; s.Newest != want {
					t.Errorf("%s: newest = %v, want %v", s.Socket, s.Newest, want)
				}
			}
		})
	}
}
