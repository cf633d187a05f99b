package pluginmanager

import (
	"errors"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"

	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
)

// fuzzSocket is the registration socket the fuzzed infos arrive on.
const fuzzSocket = "/run/plugd/plugins/fuzz.sock"

// versionSep separates the supported versions in FuzzPluginInfo's versions
// argument. It is a control character, which a version may not hold anyway,
// so no interesting input is lost to the encoding; NUL, newlines and the
// other control characters can still reach a version.
const versionSep = "\x1e"

// splitVersions decodes FuzzPluginInfo's versions argument: "" is no versions
// at all (nil), anything else is split on versionSep, so "\x1e" is two empty
// versions.
func splitVersions(s string) []string {
	if s == "" {
		return nil
	}
	return strings.Split(s, versionSep)
}

// safeField reports whether v is what pluginFromInfo may accept for a field:
// valid UTF-8, at most max bytes, and only printable characters that are not
// spaces.
func safeField(v string, max int) bool {
	if len(v) > max || !utf8.ValidString(v) {
		return false
	}
	for _, r := range v {
		if r == utf8.RuneError || !unicode.IsPrint(r) || unicode.IsSpace(r) {
			return false
		}
	}
	return true
}

// FuzzPluginInfo checks the validation of a plugin's GetInfo answer: whatever
// a plugin sends, pluginFromInfo either returns a Plugin whose every field is
// within its bound and printable, or an errInvalidInfo error whose message is
// itself safe to log and to send back to the plugin.
func FuzzPluginInfo(f *testing.F) {
	addPluginInfoSeeds(f)
	checkKnownPluginInfo(f)
	f.Fuzz(func(t *testing.T, typ, name, endpoint, versions string) {
		vs := splitVersions(versions)
		info := &registerapi.PluginInfo{Type: typ, Name: name, Endpoint: endpoint, SupportedVersions: slices.Clone(vs)}
		p, err := pluginFromInfo(info, fuzzSocket)
		if err != nil {
			checkInfoError(t, err)
			return
		}
		checkAcceptedInfo(t, p, typ, name, endpoint, vs)
	})
}

// addPluginInfoSeeds adds FuzzPluginInfo's seeds: what real plugins send,
// and what breaks each rule.
func addPluginInfoSeeds(f *testing.F) {
	// The built-in types, as real plugins send them.
	f.Add("CSIPlugin", "csi.example.com", "/var/lib/kubelet/plugins/csi.example.com/csi.sock", "1.0.0")
	f.Add("DRAPlugin", "dra.example.com", "/var/lib/kubelet/plugins/dra.example.com/dra.sock", "v1.DRAPlugin\x1ev1beta1.DRAPlugin")
	f.Add("DevicePlugin", "example.com/gpu", "/var/lib/kubelet/device-plugins/gpu.sock", "v1beta1")
	// No endpoint: the registration socket is the endpoint. No versions.
	f.Add("CSIPlugin", "csi.example.com", "", "")
	// Empty required fields, and an empty version.
	f.Add("", "", "", "")
	f.Add("CSIPlugin", "", "", "1.0.0")
	f.Add("CSIPlugin", "csi.example.com", "", "1.0.0\x1e\x1e2.0.0")
	// A relative endpoint.
	f.Add("DevicePlugin", "example.com/gpu", "gpu.sock", "v1beta1")
	// Just over each bound, and just at it.
	f.Add(strings.Repeat("t", maxTypeLen+1), "n", "", "")
	f.Add(strings.Repeat("t", maxTypeLen), strings.Repeat("n", maxNameLen), strings.Repeat("e", maxEndpointLen), strings.Repeat("v", maxVersionLen))
	f.Add("CSIPlugin", strings.Repeat("n", maxNameLen+44), "", "1.0.0")
	f.Add("CSIPlugin", "csi.example.com", "", strings.Repeat("v", maxVersionLen+1))
	f.Add("CSIPlugin", "csi.example.com", "", strings.Repeat("1\x1e", maxVersions-1)+"1")
	f.Add("CSIPlugin", "csi.example.com", "", strings.Repeat("1\x1e", maxVersions)+"1")
	f.Add("CSIPlugin", "csi.example.com", "", strings.Repeat("1\x1e", 99)+"1")
	// NUL, terminal escapes, spaces, invalid UTF-8, a literal U+FFFD.
	f.Add("CSI\x00Plugin", "csi.example.com", "", "1.0.0")
	f.Add("CSIPlugin", "csi\x1b[2J\x1b[H.example.com", "/tmp/a\nb.sock", "1.0.0\r")
	f.Add("CSIPlugin", "csi example.com", "/tmp/a\u00a0b", "1.0.0\u2028")
	f.Add("CSIPlugin", "csi.\xff\xfe.example.com", "/tmp/\xc3", "1.0.0")
	f.Add("CSIPlugin", "csi.\ufffd.example.com", "", "1.0.0")
	// The longest quoted error: a non-printable rune quotes to ten bytes, and
	// the message quotes 64 of them.
	f.Add("CSIPlugin", strings.Repeat("\U000e0001", maxNameLen/4), "", "")
	f.Add("CSIPlugin", "n", "", strings.Repeat("1\x1e", maxVersions-1)+strings.Repeat("\U000e0001", maxVersionLen/4))
}

// checkKnownPluginInfo checks answers whose verdict is known.
func checkKnownPluginInfo(f *testing.F) {
	// What real plugins of the built-in types send is accepted.
	for _, info := range []*registerapi.PluginInfo{
		{Type: "CSIPlugin", Name: "csi.example.com", SupportedVersions: []string{"1.0.0"}},
		{Type: "DRAPlugin", Name: "dra.example.com", Endpoint: "/var/lib/kubelet/plugins/dra.example.com/dra.sock", SupportedVersions: []string{"v1.DRAPlugin"}},
		{Type: "DevicePlugin", Name: "example.com/gpu", Endpoint: "/var/lib/kubelet/device-plugins/gpu.sock", SupportedVersions: []string{"v1beta1"}},
	} {
		if _, err := pluginFromInfo(info, fuzzSocket); err != nil {
			f.Errorf("pluginFromInfo(%v): %v", info, err)
		}
	}
	// No endpoint sent, and a socket whose path cannot be one: the error
	// names the socket, not an endpoint the plugin never sent.
	if _, err := pluginFromInfo(&registerapi.PluginInfo{Type: "CSIPlugin", Name: "csi.example.com", SupportedVersions: []string{"1.0.0"}}, "/var/lib/kubelet/plugins_registry/my driver.sock"); !errors.Is(err, errInvalidInfo) || !strings.Contains(err.Error(), "sent no endpoint") || !strings.Contains(err.Error(), "rename the socket") {
		f.Errorf("no endpoint and a socket path with a space: %v, want an invalid answer that says the socket is taken for the endpoint", err)
	}
	// A nil answer is an empty one.
	if _, err := pluginFromInfo(nil, fuzzSocket); !errors.Is(err, errInvalidInfo) {
		f.Fatalf("pluginFromInfo(nil) = %v, want errInvalidInfo", err)
	}
}

// checkInfoError checks the error of an answer refused: errInvalidInfo,
// with a message safe to log and to send back to the plugin.
func checkInfoError(t *testing.T, err error) {
	t.Helper()
	if !errors.Is(err, errInvalidInfo) {
		t.Fatalf("error %q is not errInvalidInfo", err)
	}
	msg := err.Error()
	if !utf8.ValidString(msg) {
		t.Errorf("error message is not valid UTF-8: %q", msg)
	}
	// The message goes back to the plugin, cut to maxErrorMessage
	// bytes: it should never need the cut. (It is not bounded by
	// 512: a quoted field of 64 non-printable runes is 642 bytes.)
	if len(msg) > maxErrorMessage {
		t.Errorf("error message is %d bytes, more than %d: %q", len(msg), maxErrorMessage, msg)
	}
	if printable(msg) != msg {
		t.Errorf("error message is not printable as it is: %q", msg)
	}
}

// checkAcceptedInfo checks p, made of an answer accepted: it holds what
// was sent, every field within its bound and printable.
func checkAcceptedInfo(t *testing.T, p Plugin, typ, name, endpoint string, vs []string) {
	t.Helper()
	if p.Type != typ || p.Name != name || !slices.Equal(p.Versions, vs) || p.Socket != fuzzSocket {
		t.Errorf("plugin %+v does not hold what was sent (type %q, name %q, versions %q)", p, typ, name, vs)
	}
	if p.Type == "" || p.Name == "" {
		t.Errorf("accepted an empty type or name: %+v", p)
	}
	if endpoint == "" {
		if p.Endpoint != fuzzSocket {
			t.Errorf("no endpoint sent, but Endpoint is %q, not the socket", p.Endpoint)
		}
	} else if want, err := EndpointPath(endpoint); err != nil || p.Endpoint != want {
		t.Errorf("Endpoint is %q, want %q, what EndpointPath makes of %q (%v)", p.Endpoint, want, endpoint, err)
	}
	if !filepath.IsAbs(p.Endpoint) || filepath.Clean(p.Endpoint) != p.Endpoint || len(p.Endpoint) >= MaxEndpointPath {
		t.Errorf("accepted endpoint %q, which is not a clean absolute path shorter than %d bytes", p.Endpoint, MaxEndpointPath)
	}
	if !safeField(p.Type, maxTypeLen) {
		t.Errorf("accepted type %q", p.Type)
	}
	if !safeField(p.Name, maxNameLen) {
		t.Errorf("accepted name %q", p.Name)
	}
	if endpoint != "" && !safeField(p.Endpoint, maxEndpointLen) {
		t.Errorf("accepted endpoint %q", p.Endpoint)
	}
	if len(p.Versions) > maxVersions {
		t.Errorf("accepted %d versions", len(p.Versions))
	}
	for i, v := range p.Versions {
		if v == "" || !safeField(v, maxVersionLen) {
			t.Errorf("accepted versions[%d] %q", i, v)
		}
	}
}

// FuzzPrintable checks that printable makes any text safe for a terminal and a
// protobuf string, bounded, and that it is a no-op on what is safe already.
func FuzzPrintable(f *testing.F) {
	f.Add("")
	f.Add("plain reason: handler refused the plugin")
	f.Add("NUL\x00 and BEL\x07 and ESC\x1b[31mred\x1b[0m")
	f.Add("line\nbreak\r\ttab")
	f.Add("bad \xff\xfe UTF-8 \xc3")
	f.Add("C1 \u0085 and \u2028 and \u202e bidi and \U000e0001 tag")
	f.Add("ünïcödé 日本語 ✓ \ufffd")
	f.Add(strings.Repeat("x", maxErrorMessage))
	f.Add(strings.Repeat("x", maxErrorMessage+1))
	f.Add(strings.Repeat("é", maxErrorMessage/2+1))
	f.Add(strings.Repeat("x", maxErrorMessage-3) + "\x00")
	f.Add(strings.Repeat("x", maxErrorMessage-1) + "日")
	f.Add(strings.Repeat("\x00", maxErrorMessage/4+1))
	f.Add(strings.Repeat("\U000e0001", 120))

	f.Fuzz(func(t *testing.T, s string) {
		out := printable(s)
		if !utf8.ValidString(out) {
			t.Fatalf("printable(%q) = %q, not valid UTF-8", s, out)
		}
		if len(out) > maxErrorMessage {
			t.Errorf("printable(%q) is %d bytes, more than %d", s, len(out), maxErrorMessage)
		}
		for _, r := range out {
			if !unicode.IsPrint(r) && r != ' ' {
				t.Fatalf("printable(%q) = %q holds %U", s, out, r)
			}
		}
		// What comes out is safe, and fits: a second pass leaves it alone.
		// That holds at the cut too, which only drops whole characters.
		if again := printable(out); again != out {
			t.Errorf("printable is not idempotent on %q: %q, then %q", s, out, again)
		}
		valid := strings.ToValidUTF8(s, "")
		safe := strings.IndexFunc(valid, func(r rune) bool { return !unicode.IsPrint(r) && r != ' ' }) < 0
		switch {
		case safe && len(valid) <= maxErrorMessage:
			// Safe text is kept as it is, less any invalid bytes.
			if out != valid {
				t.Errorf("printable(%q) = %q, want it unchanged", s, out)
			}
		case safe:
			if !strings.HasPrefix(valid, out) {
				t.Errorf("printable(%q) = %q, not a prefix of the text", s, out)
			}
		}
		// Escapes only lengthen the text, so text longer than the bound is
		// cut, and the cut drops no more than a partial character.
		if len(valid) > maxErrorMessage && len(out) < maxErrorMessage-(utf8.UTFMax-1) {
			t.Errorf("printable cut %d bytes of text to %d, more than needed", len(valid), len(out))
		}
	})
}
