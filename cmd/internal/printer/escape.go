package printer

import (
	"bytes"
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"
	"unicode"
	"unicode/utf16"
	"unicode/utf8"

	yaml "go.yaml.in/yaml/v3"
)

// What -o json and -o yaml print is text from the API and from plugins:
// valid JSON or YAML that gives back every string as it was, but in which
// no character reaches the terminal raw that it would act on. JSON leaves
// DEL, the C1 controls (U+0080-U+009F, U+009B starts an escape sequence on
// many terminals), the bidi overrides and isolates (U+202A-U+202E,
// U+2066-U+2069) and the zero-width characters (U+200B-U+200F, U+FEFF) as
// they are; YAML refuses DEL and C1 outright ("control characters are not
// allowed"), and prints the others raw.

// unsafe says whether a terminal may act on r, or hide it: every character
// that is not printable (unicode.IsPrint), from DEL up. Those below are
// escaped by JSON and YAML themselves.
func unsafe(r rune) bool { return r >= utf8.RuneSelf-1 && !unicode.IsPrint(r) }

// escapeJSON writes each unsafe character of js, a JSON text, as a \u
// escape. Outside its strings JSON is ASCII, so each is inside a string,
// where the escape means the same character.
func escapeJSON(js []byte) []byte {
	if bytes.IndexFunc(js, unsafe) < 0 {
		return js
	}
	out := make([]byte, 0, len(js)+64)
	for len(js) > 0 {
		r, n := utf8.DecodeRune(js)
		if !unsafe(r) {
			out = append(out, js[:n]...)
		} else if r1, r2 := utf16.EncodeRune(r); r1 != unicode.ReplacementChar {
			out = fmt.Appendf(out, `\u%04x\u%04x`, r1, r2)
		} else {
			out = fmt.Appendf(out, `\u%04x`, r)
		}
		js = js[n:]
	}
	return out
}

// JSON prints v indented, for people and jq alike; unsafe characters are
// \u escapes.
func JSON(w io.Writer, v any) error {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		return err
	}
	_, err := w.Write(escapeJSON(b.Bytes()))
	return err
}

// JSONLine prints v as one line of JSON (a stream of them is what jq -c
// and log shippers read); unsafe characters are \u escapes, as in JSON.
func JSONLine(w io.Writer, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	_, err = w.Write(append(escapeJSON(b), '\n'))
	return err
}

// YAML prints v as YAML with the field names of its JSON form, keys in
// alphabetical order as kubectl prints them. A string with an unsafe
// character is double-quoted, the only YAML style with escapes, and each
// unsafe character in it is one.
func YAML(w io.Writer, v any) error {
	js, err := json.Marshal(v)
	if err != nil {
		return err
	}
	var doc yaml.Node
	// YAML reads JSON, and its \U escapes (not JSON's surrogate pairs).
	if err := yaml.Unmarshal(escapeYAML(js), &doc); err != nil {
		return err
	}
	restyle(&doc)
	var b bytes.Buffer
	enc := yaml.NewEncoder(&b)
	enc.SetIndent(2)
	enc.CompactSeqIndent()
	if err := enc.Encode(&doc); err != nil {
		return err
	}
	if err := enc.Close(); err != nil {
		return err
	}
	_, err = w.Write(escapeYAML(b.Bytes()))
	return err
}

// restyle gives the nodes of a document read from JSON (flow mappings,
// every string quoted) YAML's block style and plain strings, but for the
// strings with an unsafe character, which stay double-quoted; it sorts
// each mapping by key.
func restyle(n *yaml.Node) {
	n.Style = 0
	if n.Kind == yaml.ScalarNode && n.Tag == "!!str" && strings.IndexFunc(n.Value, unsafe) >= 0 {
		n.Style = yaml.DoubleQuotedStyle
	}
	for _, c := range n.Content {
		restyle(c)
	}
	if n.Kind != yaml.MappingNode {
		return
	}
	pairs := make([][2]*yaml.Node, 0, len(n.Content)/2)
	for i := 0; i+1 < len(n.Content); i += 2 {
		pairs = append(pairs, [2]*yaml.Node{n.Content[i], n.Content[i+1]})
	}
	slices.SortStableFunc(pairs, func(a, b [2]*yaml.Node) int { return cmp.Compare(a[0].Value, b[0].Value) })
	n.Content = n.Content[:0]
	for _, p := range pairs {
		n.Content = append(n.Content, p[0], p[1])
	}
}

// escapeYAML writes each unsafe character of y as a YAML escape: in JSON
// before YAML reads it, and in what the YAML emitter printed, which leaves
// raw what YAML can hold (bidi and zero-width characters). Each is in a
// double-quoted string (JSON's; restyle's), where \u and \U escapes mean
// the character.
func escapeYAML(y []byte) []byte {
	if bytes.IndexFunc(y, unsafe) < 0 {
		return y
	}
	out := make([]byte, 0, len(y)+64)
	for len(y) > 0 {
		r, n := utf8.DecodeRune(y)
		switch {
		case !unsafe(r):
			out = append(out, y[:n]...)
		case r > 0xFFFF:
			out = fmt.Appendf(out, `\U%08x`, r)
		default:
			out = fmt.Appendf(out, `\u%04x`, r)
		}
		y = y[n:]
	}
	return out
}
