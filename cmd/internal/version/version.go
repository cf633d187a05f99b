// Package version is the version plugd, plugctl and kubectl-plugd report,
// found one way and printed in one format. It lives in cmd/internal, the
// private code of the programs, as printer and fleet do.
package version

import (
	"runtime"
	"runtime/debug"
)

// Stamped is the release's version, set at build time for all three
// programs at once (release/build.sh):
//
//	-ldflags "-X github.com/plugd/plugd/cmd/internal/version.Stamped=v1.2.3"
var Stamped string

// String is the version of the running program: Stamped if set; else the
// module version Go recorded (go install github.com/plugd/plugd/cmd/...@v1.2.3,
// a pseudo-version for a commit); else "devel", with the commit Go recorded
// when it was built in a checkout ("devel+0123456789ab", "-dirty" if it had
// changes).
func String() string {
	bi, ok := debug.ReadBuildInfo()
	return of(Stamped, bi, ok)
}

// Line is what a program's version command prints, and its log and
// User-Agent quote: "plugd v1.2.3 (go1.26.8)".
func Line(program string) string {
	return program + " " + String() + " (" + runtime.Version() + ")"
}

// of is String for a stamp and the build information Go recorded.
func of(stamped string, bi *debug.BuildInfo, ok bool) string {
	if stamped != "" {
		return stamped
	}
	if !ok {
		return "devel"
	}
	if v := bi.Main.Version; v != "" && v != "(devel)" {
		return v
	}
	var rev, dirty string
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			if s.Value == "true" {
				dirty = "-dirty"
			}
		}
	}
	if rev == "" {
		return "devel"
	}
	return "devel+" + rev[:min(len(rev), 12)] + dirty
}
