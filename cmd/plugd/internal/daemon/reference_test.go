package daemon

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"

	"github.com/plugd/plugd/internal/testenv"
)

var updateReference = flag.Bool("update", false, "rewrite docs/reference.md's configuration table from the code")

// The configuration table in docs/reference.md lies between these lines.
const (
	referenceFile  = "docs/reference.md"
	referenceBegin = "<!-- begin config table -->"
	referenceEnd   = "<!-- end config table -->"
	referenceFix   = "go test ./cmd/plugd/internal/daemon -run TestConfigReference -update"
)

// refRow is a row of the configuration table: field | flag | default |
// allowed | meaning. The code has the first four for a numeric setting;
// the meaning is the doc's own.
type refRow struct{ field, flag, def, allowed, meaning string }

func (r refRow) String() string {
	return "| " + strings.Join([]string{"`" + r.field + "`", r.flag, r.def, r.allowed, r.meaning}, " | ") + " |"
}

// Issue 26: docs/reference.md's configuration table lists every field of
// the configuration, and what it says of each numeric setting's flag,
// default and range is what the tables in bounds.go say (which WithDefaults
// applies), of each flag that plugd has it, and of each other default what
// WithDefaults gives. With -update it rewrites what the code knows (and
// adds or removes rows) in place.
func TestConfigReference(t *testing.T) {
	path := filepath.Join(testenv.Root(), filepath.FromSlash(referenceFile))
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	begin, end := strings.Index(doc, referenceBegin), strings.Index(doc, referenceEnd)
	if begin < 0 || end < begin {
		t.Fatalf("%s has no configuration table between %q and %q lines", referenceFile, referenceBegin, referenceEnd)
	}
	header, rows, err := parseReference(doc[begin+len(referenceBegin) : end])
	if err != nil {
		t.Fatalf("%s: %v", referenceFile, err)
	}

	want := referenceFromCode(t)
	var problems []string
	var fixed []refRow
	seen := map[string]bool{}
	for _, r := range rows {
		w, ok := want[r.field]
		switch {
		case !ok:
			problems = append(problems, fmt.Sprintf("%s is not a configuration field: remove its row", r.field))
			continue
		case seen[r.field]:
			problems = append(problems, fmt.Sprintf("%s has two rows", r.field))
			continue
		}
		seen[r.field] = true
		fix := r
		for _, c := range []struct {
			name      string
			have, fix *string
			want      string
		}{
			{"flag", &r.flag, &fix.flag, w.flag},
			{"default", &r.def, &fix.def, w.def},
			{"allowed", &r.allowed, &fix.allowed, w.allowed},
		} {
			if c.want != "" && *c.have != c.want {
				problems = append(problems, fmt.Sprintf("%s: the %s is %s in the doc, %s in the code", r.field, c.name, orNone(*c.have), c.want))
				*c.fix = c.want
			}
		}
		if strings.TrimSpace(r.meaning) == "" {
			problems = append(problems, fmt.Sprintf("%s: say what it means", r.field))
		}
		fixed = append(fixed, fix)
	}
	for _, field := range referenceFields(reflect.TypeFor[Config](), "") {
		if !seen[field] {
			problems = append(problems, fmt.Sprintf("%s is a configuration field the table does not list: add a row", field))
			w := want[field]
			w.field = field
			fixed = append(fixed, w)
		}
	}

	// Every flag is in the table, and every flag in it is plugd's.
	flags := map[string]bool{}
	Command().Flags().VisitAll(func(f *pflag.Flag) { flags[f.Name] = true })
	delete(flags, "config")       // the file itself: said above the table
	delete(flags, "check-config") // checks the configuration, sets none of it: said above the table
	documented := map[string]bool{}
	for _, r := range rows {
		for _, m := range regexp.MustCompile(`--([a-z][a-z0-9-]*)`).FindAllStringSubmatch(r.flag, -1) {
			documented[m[1]] = true
			if !flags[m[1]] {
				problems = append(problems, fmt.Sprintf("%s: plugd has no flag --%s", r.field, m[1]))
			}
		}
	}
	for f := range flags {
		if !documented[f] {
			problems = append(problems, fmt.Sprintf("the flag --%s is in no row's flag column", f))
		}
	}

	if len(problems) == 0 {
		return
	}
	slices.Sort(problems)
	if *updateReference {
		var sb strings.Builder
		sb.WriteString("\n" + header)
		for _, r := range fixed {
			sb.WriteString(r.String() + "\n")
		}
		doc = doc[:begin+len(referenceBegin)] + sb.String() + doc[end:]
		if err := os.WriteFile(path, []byte(doc), 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("rewrote %s's configuration table:\n  %s", referenceFile, strings.Join(problems, "\n  "))
		return
	}
	t.Errorf("%s's configuration table does not say what the code does (cmd/plugd/internal/daemon: config.go, bounds.go, cmd.go):\n  %s\n"+
		"Fix the doc, or have this test rewrite the flag, default and allowed columns and add or remove rows (then write the meaning of a new one):\n  %s",
		referenceFile, strings.Join(problems, "\n  "), referenceFix)
}

func orNone(s string) string {
	if s == "" {
		return "empty"
	}
	return s
}

// parseReference reads the table: its header and separator lines, and its
// rows.
func parseReference(s string) (header string, rows []refRow, err error) {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) < 2 || !strings.HasPrefix(lines[0], "| field |") {
		return "", nil, fmt.Errorf("the configuration table must start with a header line | field | flag | default | allowed | meaning |")
	}
	header = lines[0] + "\n" + lines[1] + "\n"
	for _, line := range lines[2:] {
		line = strings.ReplaceAll(line, `\|`, "\x00")
		cells := strings.Split(strings.Trim(strings.TrimSpace(line), "|"), "|")
		if len(cells) != 5 {
			return "", nil, fmt.Errorf("the configuration table's line %q has %d cells, not 5", line, len(cells))
		}
		for i := range cells {
			cells[i] = strings.ReplaceAll(strings.TrimSpace(cells[i]), "\x00", `\|`)
		}
		rows = append(rows, refRow{strings.Trim(cells[0], "`"), cells[1], cells[2], cells[3], cells[4]})
	}
	return header, rows, nil
}

// referenceFromCode is what the code says of each field: for a numeric
// setting its flag, default and range; for a switch its default, false;
// for another field with a default that is not a path, that default.
func referenceFromCode(t *testing.T) map[string]refRow {
	def, err := Config{}.WithDefaults()
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]refRow{}
	for _, f := range referenceFields(reflect.TypeFor[Config](), "") {
		r := refRow{}
		switch v := valueAt(reflect.ValueOf(def), f); {
		case !v.IsValid():
		case v.Kind() == reflect.Bool:
			r.def = "`false`"
		case v.Kind() == reflect.String && v.String() != "" && !filepath.IsAbs(v.String()):
			r.def = "`" + v.String() + "`"
		}
		want[f] = r
	}
	for _, s := range countSettings {
		want[s.field] = refRow{flag: "`--" + s.flag + "`", def: "`" + s.defaultText() + "`", allowed: s.rangeText()}
	}
	for _, s := range durationSettings {
		want[s.field] = durationRow(s.flag, s.def, s.defText, s.rangeText())
	}
	for _, s := range handlerSettings {
		want["handlers[]."+s.field] = durationRow(s.flag, s.def, s.defText, s.rangeText())
	}
	return want
}

func durationRow(flag string, def time.Duration, defText, allowed string) refRow {
	r := refRow{def: "`" + shortDuration(def) + "`", allowed: allowed}
	if def == 0 {
		r.def = defText
		if strings.Contains(defText, ".") { // another setting's
			r.def = "`" + defText + "`"
		}
	}
	if flag != "" {
		r.flag = "`--" + flag + "`"
	}
	return r
}

// referenceFields lists the fields of a configuration struct by their YAML
// paths: every field but those that only group others (status, timeouts),
// a list of entries and each field of an entry (handlers, handlers[].type).
// A list of entries of the type it is in (expect[].anyOf) is one row: its
// entries' fields are the rows of the type's.
func referenceFields(typ reflect.Type, prefix string, outer ...reflect.Type) []string {
	var out []string
	outer = append(outer, typ)
	for f := range typ.Fields() {
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name == "" || name == "-" {
			continue
		}
		path := prefix + name
		switch ft := f.Type; {
		case ft.Kind() == reflect.Struct && ft != reflect.TypeFor[Duration]():
			out = append(out, referenceFields(ft, path+".", outer...)...)
		case ft.Kind() == reflect.Pointer && ft.Elem().Kind() == reflect.Struct:
			out = append(out, path)
			out = append(out, referenceFields(ft.Elem(), path+".", outer...)...)
		case ft.Kind() == reflect.Slice && ft.Elem().Kind() == reflect.Struct && !slices.Contains(outer, ft.Elem()):
			out = append(out, path)
			out = append(out, referenceFields(ft.Elem(), path+"[].", outer...)...)
		default:
			out = append(out, path)
		}
	}
	return out
}

// valueAt is the field at a YAML path of v, or the zero Value where the
// path goes through a list or a nil pointer.
func valueAt(v reflect.Value, path string) reflect.Value {
	for name := range strings.SplitSeq(path, ".") {
		if v.Kind() == reflect.Pointer {
			if v.IsNil() {
				return reflect.Value{}
			}
			v = v.Elem()
		}
		if v.Kind() != reflect.Struct {
			return reflect.Value{}
		}
		next := reflect.Value{}
		for f, fv := range v.Fields() {
			if n, _, _ := strings.Cut(f.Tag.Get("json"), ","); n == name {
				next = fv
				break
			}
		}
		if v = next; !v.IsValid() {
			return v
		}
	}
	return v
}
