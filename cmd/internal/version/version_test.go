package version

import (
	"runtime/debug"
	"strings"
	"testing"
)

// Issue 33, item 12: one rule for the three programs' versions: the
// stamp, else what go install recorded, else devel with the commit.
func TestOf(t *testing.T) {
	vcs := func(rev, modified string) []debug.BuildSetting {
		return []debug.BuildSetting{{Key: "vcs.revision", Value: rev}, {Key: "vcs.modified", Value: modified}}
	}
	for _, tc := range []struct {
		stamped string
		bi      *debug.BuildInfo
		want    string
	}{
		{"v1.2.3", &debug.BuildInfo{Main: debug.Module{Version: "v0.0.0-20261201000000-abcdef123456"}}, "v1.2.3"},
		{"", &debug.BuildInfo{Main: debug.Module{Version: "v0.0.0-20261201000000-abcdef123456"}}, "v0.0.0-20261201000000-abcdef123456"},
		{"", &debug.BuildInfo{Main: debug.Module{Version: "(devel)"}, Settings: vcs("0123456789abcdef0123", "false")}, "devel+0123456789ab"},
		{"", &debug.BuildInfo{Main: debug.Module{Version: "(devel)"}, Settings: vcs("0123456789abcdef0123", "true")}, "devel+0123456789ab-dirty"},
		{"", &debug.BuildInfo{Main: debug.Module{Version: "(devel)"}}, "devel"},
		{"", nil, "devel"},
	} {
		if got := of(tc.stamped, tc.bi, tc.bi != nil); got != tc.want {
			t.Errorf("of(%q, %+v) = %q, want %q", tc.stamped, tc.bi, got, tc.want)
		}
	}
	if l := Line("plugd"); !strings.HasPrefix(l, "plugd "+String()+" (go") {
		t.Errorf("Line = %q", l)
	}
}
