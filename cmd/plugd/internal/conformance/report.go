package conformance

import (
	"encoding/json"
	"encoding/xml"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/plugd/plugd/internal/textsafe"
)

// Statuses of a check's result.
const (
	statusPass = "PASS"
	statusFail = "FAIL"
	statusSkip = "SKIP"
)

// maxSeen bounds what a result quotes of a plugin's answers.
const maxSeen = 512

// Result is what one check found.
type Result struct {
	ID       string        `json:"id"`
	Status   string        `json:"status"`
	Rule     string        `json:"rule"` // "kubelet" or "recommendation"
	Required bool          `json:"required"`
	Kubelet  string        `json:"kubelet,omitempty"`
	Expected string        `json:"expected"`
	Seen     string        `json:"seen"`
	Duration time.Duration `json:"durationNanoseconds"`
}

// PluginInfo is what the plugin answered to GetInfo.
type PluginInfo struct {
	Socket   string   `json:"socket"`
	Type     string   `json:"type"`
	Name     string   `json:"name"`
	Endpoint string   `json:"endpoint"`
	Versions []string `json:"versions"`
	// Via is how the plugin registered: "registry" (a socket in the
	// registry directory) or "kubelet.sock" (a device plugin's Register).
	Via string `json:"via"`
}

// Report is a run's outcome.
type Report struct {
	Plugin   *PluginInfo   `json:"plugin,omitempty"`
	Checks   []Result      `json:"checks"`
	Passed   bool          `json:"passed"`
	Duration time.Duration `json:"durationNanoseconds"`
}

// failed counts the checks that failed, required or not.
func (r *Report) failed(required bool) int {
	n := 0
	for _, c := range r.Checks {
		if c.Status == statusFail && c.Required == required {
			n++
		}
	}
	return n
}

// writeText prints one line per check: status, ID, rule, what was expected
// and what was seen.
func writeText(w io.Writer, r *Report) error {
	if p := r.Plugin; p != nil {
		fmt.Fprintf(w, "plugin %s %q registered through %s, endpoint %q, versions %q\n", p.Type, p.Name, p.Socket, p.Endpoint, p.Versions)
	}
	for _, c := range r.Checks {
		rule := c.Rule
		if !c.Required {
			rule += ", not required"
		}
		fmt.Fprintf(w, "%s  %-34s [%s] expected: %s; seen: %s\n", c.Status, c.ID, rule, c.Expected, c.Seen)
	}
	verdict := "every check passed"
	switch req, rec := r.failed(true), r.failed(false); {
	case req > 0 && rec > 0:
		verdict = fmt.Sprintf("%d required check(s) failed, and %d recommendation(s) not required", req, rec)
	case req > 0:
		verdict = fmt.Sprintf("%d required check(s) failed", req)
	case rec > 0:
		verdict = fmt.Sprintf("every required check passed; %d recommendation(s) failed (--strict requires them)", rec)
	}
	_, err := fmt.Fprintf(w, "%s in %s\n", verdict, r.Duration.Round(time.Millisecond))
	return err
}

func writeJSON(w io.Writer, r *Report) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

// The JUnit XML form, as CI systems read it: one suite, one test case per
// check, named by its ID.
type junitSuites struct {
	XMLName xml.Name     `xml:"testsuites"`
	Suites  []junitSuite `xml:"testsuite"`
}

type junitSuite struct {
	Name     string      `xml:"name,attr"`
	Tests    int         `xml:"tests,attr"`
	Failures int         `xml:"failures,attr"`
	Skipped  int         `xml:"skipped,attr"`
	Time     string      `xml:"time,attr"`
	Cases    []junitCase `xml:"testcase"`
}

type junitCase struct {
	Name      string        `xml:"name,attr"`
	Classname string        `xml:"classname,attr"`
	Time      string        `xml:"time,attr"`
	Failure   *junitMessage `xml:"failure,omitempty"`
	Skipped   *junitMessage `xml:"skipped,omitempty"`
	SystemOut string        `xml:"system-out,omitempty"`
}

type junitMessage struct {
	Message string `xml:"message,attr"`
	Text    string `xml:",chardata"`
}

func writeJUnit(w io.Writer, r *Report) error {
	s := junitSuite{Name: "plugd conformance", Tests: len(r.Checks), Time: seconds(r.Duration)}
	if p := r.Plugin; p != nil {
		s.Name = fmt.Sprintf("plugd conformance: %s %s", p.Type, p.Name)
	}
	for _, c := range r.Checks {
		area, _, _ := strings.Cut(c.ID, "/")
		jc := junitCase{Name: c.ID, Classname: "conformance." + area, Time: seconds(c.Duration),
			SystemOut: fmt.Sprintf("rule: %s\nrequired: %t\nexpected: %s\nseen: %s\n", c.Rule, c.Required, c.Expected, c.Seen)}
		msg := &junitMessage{Message: c.Seen, Text: "expected: " + c.Expected + "\nseen: " + c.Seen}
		switch c.Status {
		case statusFail:
			s.Failures++
			jc.Failure = msg
		case statusSkip:
			s.Skipped++
			jc.Skipped = msg
		}
		s.Cases = append(s.Cases, jc)
	}
	if _, err := io.WriteString(w, xml.Header); err != nil {
		return err
	}
	enc := xml.NewEncoder(w)
	enc.Indent("", "  ")
	if err := enc.Encode(junitSuites{Suites: []junitSuite{s}}); err != nil {
		return err
	}
	_, err := io.WriteString(w, "\n")
	return err
}

func seconds(d time.Duration) string { return fmt.Sprintf("%.3f", d.Seconds()) }

// quote makes text a plugin chose safe to print, and bounded.
func quote(s string) string { return textsafe.Printable(s, maxSeen) }
