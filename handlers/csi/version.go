package csi

import (
	"strconv"
	"strings"
)

// version is a CSI version as a driver announces it: "1.0.0", "1.2" or
// "v1.5.0", optionally with a pre-release ("-rc1") or build ("+abc") suffix.
// node-driver-registrar sends "1.0.0"; other registrars have sent the rest, and
// the kubelet accepts them, so plugd does too.
type version struct {
	major, minor, patch int
	pre                 string // pre-release; "" sorts after any pre-release
}

// parseVersion parses s, and reports false for anything that is not one to
// three dot-separated numbers after an optional "v".
func parseVersion(s string) (version, bool) {
	s = strings.TrimPrefix(s, "v")
	if i := strings.IndexByte(s, '+'); i >= 0 {
		s = s[:i]
	}
	var v version
	if i := strings.IndexByte(s, '-'); i >= 0 {
		s, v.pre = s[:i], s[i+1:]
		if v.pre == "" {
			return version{}, false
		}
	}
	parts := strings.Split(s, ".")
	if len(parts) > 3 {
		return version{}, false
	}
	nums := [3]*int{&v.major, &v.minor, &v.patch}
	for i, p := range parts {
		// Digits only: Atoi would take a sign, and the length bound keeps
		// a number from overflowing.
		if p == "" || len(p) > 9 || strings.Trim(p, "0123456789") != "" {
			return version{}, false
		}
		*nums[i], _ = strconv.Atoi(p)
	}
	return v, true
}

// less reports whether v is an earlier version than w.
func (v version) less(w version) bool {
	if v.major != w.major {
		return v.major < w.major
	}
	if v.minor != w.minor {
		return v.minor < w.minor
	}
	if v.patch != w.patch {
		return v.patch < w.patch
	}
	if (v.pre == "") != (w.pre == "") {
		return v.pre != ""
	}
	return v.pre < w.pre
}

// supportedMajor is the CSI major version plugd speaks. Every 1.x is
// compatible with 1.0 (the spec only adds to it), so any 1.x is accepted.
const supportedMajor = 1

// highestSupported picks the highest 1.x among versions, as the kubelet does,
// and returns it as the driver wrote it. Versions that do not parse are
// ignored; ok is false if none is a 1.x.
func highestSupported(versions []string) (raw string, v version, ok bool) {
	for _, s := range versions {
		w, parsed := parseVersion(s)
		if !parsed || w.major != supportedMajor {
			continue
		}
		if !ok || v.less(w) {
			raw, v, ok = s, w, true
		}
	}
	return raw, v, ok
}
