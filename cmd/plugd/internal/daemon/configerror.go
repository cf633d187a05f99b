package daemon

import (
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strconv"
	"strings"

	"sigs.k8s.io/yaml"
)

// configError says what is wrong with the configuration file path, whose
// text is b, in the file's own terms: yaml.UnmarshalStrict converts YAML
// to JSON first, and its errors speak of JSON ("error unmarshaling JSON:
// ... json: unknown field"). An unknown key is named with where it is
// (expect[0].nmae) and the keys allowed there.
func configError(path string, b []byte, err error) error {
	msg := err.Error()
	if rest, ok := strings.CutPrefix(msg, "error converting YAML to JSON: yaml: "); ok {
		return fmt.Errorf("config %s is not valid YAML: %s", path, rest)
	}
	msg = strings.TrimPrefix(msg, "error unmarshaling JSON: ")
	msg = strings.TrimPrefix(msg, "while decoding JSON: ")
	msg = strings.TrimPrefix(msg, "json: ")
	if strings.HasPrefix(msg, "unknown field ") {
		var doc any
		if yaml.Unmarshal(b, &doc) == nil {
			if where, allowed := unknownKey(doc, reflect.TypeFor[Config](), ""); where != "" {
				return fmt.Errorf("config %s: unknown key %s: it is not a setting of plugd (misspelt, or of another version?); the keys there are %s", path, where, strings.Join(allowed, ", "))
			}
		}
	}
	return fmt.Errorf("config %s: %s", path, msg)
}

// unknownKey walks doc, a YAML document as yaml.Unmarshal reads it, beside
// the type t it is read into, and returns where the first key t does not
// have is (in the sorted order of keys: "kubernetes.nodeNam",
// "expect[0].nmae"), with the keys allowed there; "" if there is none.
func unknownKey(doc any, t reflect.Type, at string) (where string, allowed []string) {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch v := doc.(type) {
	case map[string]any:
		if t.Kind() == reflect.Map {
			for _, k := range sortedKeys(v) {
				if w, a := unknownKey(v[k], t.Elem(), at+"."+k); w != "" {
					return w, a
				}
			}
			return "", nil
		}
		if t.Kind() != reflect.Struct {
			return "", nil
		}
		fields := jsonFields(t)
		for _, k := range sortedKeys(v) {
			f, ok := fields[k]
			if !ok {
				return strings.TrimPrefix(at+"."+k, "."), slices.Sorted(maps.Keys(fields))
			}
			if w, a := unknownKey(v[k], f, at+"."+k); w != "" {
				return w, a
			}
		}
	case []any:
		if t.Kind() != reflect.Slice && t.Kind() != reflect.Array {
			return "", nil
		}
		for i, e := range v {
			if w, a := unknownKey(e, t.Elem(), at+"["+strconv.Itoa(i)+"]"); w != "" {
				return w, a
			}
		}
	}
	return "", nil
}

// jsonFields are the JSON names of the fields of the struct type t, and
// their types.
func jsonFields(t reflect.Type) map[string]reflect.Type {
	out := map[string]reflect.Type{}
	for f := range t.Fields() {
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		switch {
		case name == "-" || !f.IsExported():
		case f.Anonymous && name == "":
			for n, ft := range jsonFields(f.Type) {
				out[n] = ft
			}
		case name == "":
			out[f.Name] = f.Type
		default:
			out[name] = f.Type
		}
	}
	return out
}

func sortedKeys(m map[string]any) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
