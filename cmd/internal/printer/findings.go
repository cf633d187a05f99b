package printer

import (
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/plugd/plugd/api"
)

// Findings prints doctor findings for people: a heading line each, then the
// summary, evidence and remedy, indented; last, how many of each severity.
// what names who looked, for the line printed when nothing was found.
func Findings(w io.Writer, what string, fs []api.Finding) error {
	var b strings.Builder
	if len(fs) == 0 {
		fmt.Fprintf(&b, "%s found nothing wrong\n", what)
	}
	for i, f := range fs {
		if i > 0 {
			b.WriteString("\n")
		}
		head := []string{text(strings.ToUpper(f.Severity)), text(f.Check)}
		if f.Type != "" {
			head = append(head, text(f.Type+" "+f.Name))
		}
		if f.Socket != "" {
			head = append(head, text(f.Socket))
		}
		fmt.Fprintf(&b, "%s\n  %s\n", strings.Join(head, "  "), text(f.Summary))
		for _, e := range f.Evidence {
			fmt.Fprintf(&b, "  - %s\n", text(e))
		}
		if f.Remedy != "" {
			fmt.Fprintf(&b, "  remedy: %s\n", text(f.Remedy))
		}
	}
	if len(fs) > 0 {
		fmt.Fprintf(&b, "\n%s\n", CountFindings(fs))
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// text is s on one line, safe for a terminal, cut at maxFindingText
// bytes: a finding quotes what others wrote (a Node's conditions, a pod's
// status), which the API does not bound.
func text(s string) string {
	if s == "" {
		return ""
	}
	return ShortCell(s, maxFindingText)
}

// maxFindingText bounds each line of a finding: twice a condition message
// of plugd's, and its quote.
const maxFindingText = 1024

// CountFindings says how many findings there are of each severity, most
// serious first: "2 errors, 1 warning".
func CountFindings(fs []api.Finding) string {
	var parts []string
	for _, sev := range slices.Backward(api.Severities) {
		n := 0
		for _, f := range fs {
			if f.Severity == sev {
				n++
			}
		}
		if n > 0 {
			parts = append(parts, fmt.Sprintf("%d %s", n, plural(n, sev)))
		}
	}
	return strings.Join(parts, ", ")
}

func plural(n int, s string) string {
	if n == 1 {
		return s
	}
	return s + "s"
}

// SeverityAtLeast says whether severity s is min or more serious.
func SeverityAtLeast(s, min string) bool {
	return slices.Index(api.Severities, s) >= slices.Index(api.Severities, min)
}

// AtLeast is the findings of fs of severity min or above, in their order
// (never nil: -o json prints an empty list, not null).
func AtLeast(fs []api.Finding, min string) []api.Finding {
	out := []api.Finding{}
	for _, f := range fs {
		if SeverityAtLeast(f.Severity, min) {
			out = append(out, f)
		}
	}
	return out
}

// Serious reports whether a finding of fs is a warning or an error: what
// makes a doctor exit 4. The caller passes the findings it shows, so that
// --min-severity error with only warnings found exits 0.
func Serious(fs []api.Finding) bool {
	return slices.ContainsFunc(fs, func(f api.Finding) bool { return SeverityAtLeast(f.Severity, api.SeverityWarning) })
}

// FindingsAtLeast prints, as Findings does, the findings of fs of severity
// min or above; when there are none but some below, it says so, and how
// many, rather than that nothing is wrong.
func FindingsAtLeast(w io.Writer, what string, fs []api.Finding, min string) error {
	shown := AtLeast(fs, min)
	if len(shown) == 0 && len(fs) > 0 {
		_, err := fmt.Fprintf(w, "%s found nothing at %s or above (below it: %s; --min-severity %s shows them)\n", what, min, CountFindings(fs), api.SeverityInfo)
		return err
	}
	return Findings(w, what, shown)
}
