package printer

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/plugd/plugd/api"
	"github.com/plugd/plugd/internal/nodecond"
)

// hostile is text a condition's writer chose: DEL, C1 controls (U+009B is
// CSI on many terminals), bidi overrides and isolates, zero-width
// characters, a tag character beyond the BMP, and ordinary text around.
const hostile = "a\x7fb\u0085c\u009b31md\u202ee\u202af\u2066g\u2069h\u200bi\u200fj\ufeffk\U000e0001l é ✓ \t\n\"\\"

func hostileView() nodecond.ClusterView {
	return nodecond.ClusterView{Nodes: 2, NodesWithPlugd: 1, Plugins: []nodecond.ClusterPlugin{{
		Type: "CSIPlugin", Name: "csi.example.com", Condition: "csi.example.com/CSIPluginReady", Expected: 1,
		NotReady: []nodecond.NodeCondition{{Node: "node-a", Status: "False", Reason: hostile, Message: "plugd: " + hostile,
			Since: time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)}}}}}
}

// noneRaw fails if out holds a character a terminal would act on.
func noneRaw(t *testing.T, what string, out []byte) {
	t.Helper()
	if i := bytes.IndexFunc(out, unsafe); i >= 0 {
		t.Errorf("%s lets %q reach the terminal raw:\n%s", what, out[i:min(i+4, len(out))], out)
	}
	for _, raw := range []string{"\x7f", "\u009b", "\u202e", "\u200b", "\ufeff"} {
		if bytes.Contains(out, []byte(raw)) {
			t.Errorf("%s holds %q raw", what, raw)
		}
	}
}

// Issue 25, item 11: -o json escapes what JSON leaves raw, and still gives
// back every string as it was.
func TestJSONEscapesWhatTerminalsActOn(t *testing.T) {
	var b bytes.Buffer
	if err := JSON(&b, hostileView()); err != nil {
		t.Fatal(err)
	}
	noneRaw(t, "-o json", b.Bytes())
	var back nodecond.ClusterView
	if err := json.Unmarshal(b.Bytes(), &back); err != nil {
		t.Fatalf("-o json is not JSON: %v\n%s", err, b.String())
	}
	if got := back.Plugins[0].NotReady[0]; got.Reason != hostile || got.Message != "plugd: "+hostile {
		t.Errorf("-o json does not give the strings back:\n got %q\nwant %q", got.Reason, hostile)
	}
	if !strings.Contains(b.String(), `\u009b`) || !strings.Contains(b.String(), `\udb40\udc01`) {
		t.Errorf("-o json: no \\u escapes:\n%s", b.String())
	}
}

// plugctl watch -o json: one line per value, escaped as -o json is.
func TestJSONLine(t *testing.T) {
	var b bytes.Buffer
	for range 2 {
		if err := JSONLine(&b, hostileView()); err != nil {
			t.Fatal(err)
		}
	}
	noneRaw(t, "a JSON line", b.Bytes())
	lines := strings.Split(strings.TrimSuffix(b.String(), "\n"), "\n")
	if len(lines) != 2 {
		t.Fatalf("two values made %d lines:\n%s", len(lines), b.String())
	}
	var back nodecond.ClusterView
	if err := json.Unmarshal([]byte(lines[1]), &back); err != nil {
		t.Fatalf("a line is not JSON: %v\n%s", err, lines[1])
	}
	if got := back.Plugins[0].NotReady[0].Reason; got != hostile {
		t.Errorf("a JSON line does not give the strings back:\n got %q\nwant %q", got, hostile)
	}
}

// Issue 25, item 11: -o yaml prints a view whose strings hold DEL and C1
// controls (YAML cannot hold them raw: "control characters are not
// allowed"), with nothing raw that a terminal acts on, and gives every
// string back.
func TestYAMLEscapesWhatTerminalsActOn(t *testing.T) {
	var b bytes.Buffer
	if err := YAML(&b, hostileView()); err != nil {
		t.Fatalf("-o yaml: %v", err)
	}
	noneRaw(t, "-o yaml", b.Bytes())
	var back nodecond.ClusterView
	if err := yaml.UnmarshalStrict(b.Bytes(), &back); err != nil {
		t.Fatalf("-o yaml is not YAML: %v\n%s", err, b.String())
	}
	if got := back.Plugins[0].NotReady[0]; got.Reason != hostile || got.Message != "plugd: "+hostile || back.Nodes != 2 {
		t.Errorf("-o yaml does not give the strings back:\n got %q\nwant %q\n%s", got.Reason, hostile, b.String())
	}
}

// What has nothing to escape prints as sigs.k8s.io/yaml printed it before:
// the same keys in the same order, the same quoting. (A string longer than
// a line is not folded any more.)
func TestYAMLAsBefore(t *testing.T) {
	for _, v := range []any{
		hostileView().Plugins[0].Type,
		nodecond.ClusterView{Nodes: 3, Plugins: []nodecond.ClusterPlugin{{Type: "CSIPlugin", Name: "123", Condition: "true", Ready: 1, Expected: 2,
			NotReady: []nodecond.NodeCondition{{Node: "null", Status: "False", Reason: "", Message: "plugd: CSIPlugin 123: a message,\nand a second line: yes",
				Since: time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)}}}, {Type: "DevicePlugin", Name: "vendor.example/gpu", Ready: 0, Expected: 0}}},
		nodecond.ClusterView{},
		api.FindingList{Findings: []api.Finding{{Severity: "error", Check: "x", Summary: "a: b", Evidence: []string{"- c", "#d", "1.5", "0x1f", "~", "2026-12-01"}, Remedy: "'quoted'"}}},
		map[string]any{"b": 1.5, "a": []any{}, "c": map[string]any{}, "d": nil, "e": 1e21, "f": -7},
	} {
		want, err := yaml.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		var got bytes.Buffer
		if err := YAML(&got, v); err != nil {
			t.Fatal(err)
		}
		if got.String() != string(want) {
			t.Errorf("YAML of %+v:\n got:\n%s\nwant:\n%s", v, got.String(), want)
		}
	}
}
