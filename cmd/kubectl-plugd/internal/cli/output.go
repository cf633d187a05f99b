package cli

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"strings"

	"k8s.io/client-go/util/jsonpath"

	"github.com/plugd/plugd/cmd/internal/fleet"
	"github.com/plugd/plugd/cmd/internal/printer"
)

// viewOutputs are the -o values of the views (cluster, node), as kubectl's:
// jsonpath=TEMPLATE prints what the template picks from the JSON view.
var viewOutputs = []string{"table", "wide", "json", "yaml", "jsonpath=TEMPLATE"}

// output is a parsed -o of a view, and --no-headers.
type output struct {
	format    string // table, wide, json, yaml or jsonpath
	jsonpath  *jsonpath.JSONPath
	noHeaders bool
}

// parseOutput reads -o as kubectl does: one of the formats, or
// jsonpath=TEMPLATE (jsonpath='{.plugins[*].name}'), the template checked
// now, so that a bad one is a usage error.
func parseOutput(o string, noHeaders bool) (output, error) {
	if tmpl, ok := strings.CutPrefix(o, "jsonpath="); ok {
		j := jsonpath.New("output")
		j.AllowMissingKeys(true) // as kubectl: a missing key prints nothing
		if err := j.Parse(tmpl); err != nil {
			return output{}, usageErrorf("--output jsonpath=%s: %v", tmpl, err)
		}
		return output{format: "jsonpath", jsonpath: j}, nil
	}
	if _, err := oneOf("--output", o, viewOutputs[:4]...); err != nil {
		return output{}, usageErrorf("--output %q must be one of %s", o, strings.Join(viewOutputs, ", "))
	}
	return output{format: o, noHeaders: noHeaders}, nil
}

// machine writes v in a format for programs, and reports whether o is one;
// otherwise the caller prints its table.
func (o output) machine(w io.Writer, v any) (bool, error) {
	switch o.format {
	case "json":
		return true, printer.JSON(w, v)
	case "yaml":
		return true, printer.YAML(w, v)
	case "jsonpath":
		// The template runs on the view as JSON has it (its field names),
		// as kubectl's does on an object's JSON.
		b, err := json.Marshal(v)
		if err != nil {
			return true, err
		}
		var data any
		if err := json.Unmarshal(b, &data); err != nil {
			return true, err
		}
		var out bytes.Buffer
		if err := o.jsonpath.Execute(&out, data); err != nil {
			return true, fmt.Errorf("--output jsonpath: %w", err)
		}
		_, err = w.Write(out.Bytes())
		return true, err
	}
	return false, nil
}

// table is the Format of the table outputs.
func (o output) table() fleet.Format {
	return fleet.Format{Wide: o.format == "wide", NoHeaders: o.noHeaders}
}
