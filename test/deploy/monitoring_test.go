package deploy

import (
	"context"
	"encoding/json"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/model/rulefmt"
	promqlparser "github.com/prometheus/prometheus/promql/parser"
	"github.com/prometheus/prometheus/promql/promqltest"
	"github.com/prometheus/prometheus/rules"
	"sigs.k8s.io/yaml"
)

var monitoringDir = filepath.Join(repo, "deploy", "monitoring")

// promParser is PromQL as Prometheus parses rules by default.
var promParser = promqlparser.NewParser(promqlparser.Options{})

func parseRules(t *testing.T) *rulefmt.RuleGroups {
	t.Helper()
	rgs, errs := rulefmt.ParseFile(filepath.Join(monitoringDir, "rules.yaml"), false, model.UTF8Validation, promParser, slog.New(slog.DiscardHandler))
	for _, err := range errs {
		t.Error(err)
	}
	if rgs == nil {
		t.FailNow()
	}
	return rgs
}

// The rules parse as Prometheus parses them; every alert says what is wrong
// (summary, description), how bad (severity) and links its runbook, whose
// section exists.
func TestRules(t *testing.T) {
	rgs := parseRules(t)
	runbooks, err := os.ReadFile(filepath.Join(repo, "docs", "runbooks.md"))
	if err != nil {
		t.Fatal(err)
	}
	anchors := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^#+ (.+)$`).FindAllStringSubmatch(string(runbooks), -1) {
		anchors[githubAnchor(m[1])] = true
	}
	alerts := 0
	for _, g := range rgs.Groups {
		for _, r := range g.Rules {
			if r.Alert == "" {
				continue
			}
			alerts++
			for _, a := range []string{"summary", "description", "runbook_url"} {
				if r.Annotations[a] == "" {
					t.Errorf("alert %s has no %s", r.Alert, a)
				}
			}
			if s := r.Labels["severity"]; s != "warning" && s != "critical" && s != "info" {
				t.Errorf("alert %s has severity %q", r.Alert, s)
			}
			const base = "https://github.com/plugd/plugd/blob/main/docs/runbooks.md#"
			anchor, ok := strings.CutPrefix(r.Annotations["runbook_url"], base)
			if !ok || !anchors[anchor] {
				t.Errorf("alert %s: runbook_url %s is no section of docs/runbooks.md (sections: %v)", r.Alert, r.Annotations["runbook_url"], anchors)
			}
			if anchor != strings.ToLower(r.Alert) {
				t.Errorf("alert %s: its runbook's section is %q; name it after the alert", r.Alert, anchor)
			}
		}
	}
	if alerts < 10 {
		t.Errorf("%d alerts; the mixin has ten", alerts)
	}
}

// githubAnchor is the anchor GitHub gives a Markdown heading.
func githubAnchor(h string) string {
	h = strings.ToLower(strings.TrimSpace(h))
	var b strings.Builder
	for _, r := range h {
		switch {
		case r == ' ' || r == '-':
			b.WriteRune('-')
		case r == '_' || r >= 'a' && r <= 'z' || r >= '0' && r <= '9':
			b.WriteRune(r)
		}
	}
	return b.String()
}

// unitTests is promtool's test file (promtool test rules).
type unitTests struct {
	RuleFiles          []string       `json:"rule_files"`
	EvaluationInterval model.Duration `json:"evaluation_interval"`
	Tests              []testGroup    `json:"tests"`
}

type testGroup struct {
	Interval    model.Duration `json:"interval"`
	InputSeries []struct {
		Series string `json:"series"`
		Values string `json:"values"`
	} `json:"input_series"`
	AlertRuleTests []struct {
		EvalTime  model.Duration `json:"eval_time"`
		Alertname string         `json:"alertname"`
		ExpAlerts []struct {
			ExpLabels      map[string]string `json:"exp_labels"`
			ExpAnnotations map[string]string `json:"exp_annotations"`
		} `json:"exp_alerts"`
	} `json:"alert_rule_test"`
	PromQLExprTests []struct {
		Expr       string         `json:"expr"`
		EvalTime   model.Duration `json:"eval_time"`
		ExpSamples []struct {
			Labels string  `json:"labels"`
			Value  float64 `json:"value"`
		} `json:"exp_samples"`
	} `json:"promql_expr_test"`
	Name string `json:"name"`
}

// The rules' unit tests (deploy/monitoring/tests.yaml), run as promtool
// test rules runs them: the input series loaded into Prometheus's test
// storage, the rule groups evaluated by its rule manager with its PromQL
// engine every evaluation_interval, the firing alerts (labels and
// annotations, all of them) and the expressions' samples compared at each
// eval_time.
func TestRuleUnitTests(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(monitoringDir, "tests.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var ut unitTests
	if err := yaml.UnmarshalStrict(b, &ut); err != nil {
		t.Fatalf("tests.yaml: %v", err)
	}
	if ut.EvaluationInterval == 0 {
		ut.EvaluationInterval = model.Duration(time.Minute)
	}
	var files []string
	for _, f := range ut.RuleFiles {
		files = append(files, filepath.Join(monitoringDir, f))
	}
	if len(ut.Tests) == 0 {
		t.Fatal("tests.yaml has no tests")
	}
	// Every alert of the rules is seen firing by some test.
	fired := map[string]bool{}
	for _, tg := range ut.Tests {
		for _, at := range tg.AlertRuleTests {
			if len(at.ExpAlerts) > 0 {
				fired[at.Alertname] = true
			}
		}
	}
	for _, g := range parseRules(t).Groups {
		for _, r := range g.Rules {
			if r.Alert != "" && !fired[r.Alert] {
				t.Errorf("alert %s: no test of tests.yaml expects it to fire", r.Alert)
			}
		}
	}
	for i, tg := range ut.Tests {
		t.Run(fmt.Sprint(i), func(t *testing.T) {
			if tg.Interval == 0 {
				tg.Interval = ut.EvaluationInterval
			}
			runTestGroup(t, tg, time.Duration(ut.EvaluationInterval), files)
		})
	}
}

func runTestGroup(t *testing.T, tg testGroup, evalInterval time.Duration, files []string) {
	var load strings.Builder
	fmt.Fprintf(&load, "load %s\n", time.Duration(tg.Interval))
	for _, s := range tg.InputSeries {
		fmt.Fprintf(&load, "  %s %s\n", s.Series, s.Values)
	}
	suite, err := promqltest.NewLazyLoader(load.String(), promqltest.LazyLoaderOpts{EnableAtModifier: true, EnableNegativeOffset: true, Parser: promParser})
	if err != nil {
		t.Fatalf("input_series: %v", err)
	}
	defer suite.Close()
	suite.SubqueryInterval = evalInterval
	m := rules.NewManager(&rules.ManagerOptions{
		QueryFunc:    rules.EngineQueryFunc(suite.QueryEngine(), suite.Storage()),
		AppendableV2: suite.Storage(),
		Context:      context.Background(),
		NotifyFunc:   func(context.Context, string, ...*rules.Alert) {},
		Logger:       slog.New(slog.DiscardHandler),
		Parser:       promParser,
	})
	groups, errs := m.LoadGroups(evalInterval, labels.EmptyLabels(), "", nil, false, files...)
	for _, err := range errs {
		t.Fatal(err)
	}
	var ordered []*rules.Group
	for _, g := range groups {
		ordered = append(ordered, g)
		for _, r := range g.Rules() {
			if ar, ok := r.(*rules.AlertingRule); ok {
				ar.SetRestored(true)
			}
		}
	}
	sort.Slice(ordered, func(i, j int) bool { return ordered[i].Name() < ordered[j].Name() })

	var maxEval model.Duration
	for _, a := range tg.AlertRuleTests {
		maxEval = max(maxEval, a.EvalTime)
	}
	for _, e := range tg.PromQLExprTests {
		maxEval = max(maxEval, e.EvalTime)
	}
	start := time.Unix(0, 0).UTC()
	for ts := start; !ts.After(start.Add(time.Duration(maxEval))); ts = ts.Add(evalInterval) {
		suite.WithSamplesTill(ts, func(err error) {
			if err != nil {
				t.Fatal(err)
			}
			for _, g := range ordered {
				g.Eval(suite.Context(), ts)
				for _, r := range g.Rules() {
					if r.LastError() != nil {
						t.Fatalf("rule %s at %s: %v", r.Name(), ts.Sub(start), r.LastError())
					}
				}
			}
		})
		// The alerts of an eval_time are those of the evaluation at or just
		// before it.
		for _, at := range tg.AlertRuleTests {
			if d := time.Duration(at.EvalTime); d < ts.Sub(start) || d >= ts.Sub(start)+evalInterval {
				continue
			}
			var got, want []string
			for _, g := range ordered {
				for _, r := range g.Rules() {
					ar, ok := r.(*rules.AlertingRule)
					if !ok || ar.Name() != at.Alertname {
						continue
					}
					for _, a := range ar.ActiveAlerts() {
						if a.State == rules.StateFiring {
							got = append(got, a.Labels.String()+" "+a.Annotations.String())
						}
					}
				}
			}
			for _, e := range at.ExpAlerts {
				l := maps(e.ExpLabels)
				l["alertname"] = at.Alertname
				want = append(want, labels.FromMap(l).String()+" "+labels.FromMap(e.ExpAnnotations).String())
			}
			slices.Sort(got)
			slices.Sort(want)
			if !slices.Equal(got, want) {
				t.Errorf("alert %s at %s:\n  want %q\n  got  %q", at.Alertname, time.Duration(at.EvalTime), want, got)
			}
		}
	}
	for _, et := range tg.PromQLExprTests {
		q, err := suite.QueryEngine().NewInstantQuery(suite.Context(), suite.Queryable(), nil, et.Expr, start.Add(time.Duration(et.EvalTime)))
		if err != nil {
			t.Fatalf("%s: %v", et.Expr, err)
		}
		res := q.Exec(suite.Context())
		if res.Err != nil {
			t.Fatalf("%s: %v", et.Expr, res.Err)
		}
		vec, err := res.Vector()
		if err != nil {
			t.Fatalf("%s: %v", et.Expr, err)
		}
		var got, want []string
		for _, s := range vec {
			got = append(got, s.Metric.String()+" "+strconv.FormatFloat(round(s.F), 'g', -1, 64))
		}
		for _, s := range et.ExpSamples {
			l, err := promParser.ParseMetric(s.Labels)
			if err != nil {
				t.Fatalf("exp_samples %q: %v", s.Labels, err)
			}
			want = append(want, l.String()+" "+strconv.FormatFloat(round(s.Value), 'g', -1, 64))
		}
		slices.Sort(got)
		slices.Sort(want)
		if !slices.Equal(got, want) {
			t.Errorf("%s at %s:\n  want %q\n  got  %q", et.Expr, time.Duration(et.EvalTime), want, got)
		}
		q.Close()
	}
}

// round drops the last bits of float noise (0.2485000000001).
func round(f float64) float64 { return math.Round(f*1e9) / 1e9 }

func maps(m map[string]string) map[string]string {
	out := map[string]string{}
	for k, v := range m {
		out[k] = v
	}
	return out
}

// exported are the metrics plugd exports, read from its source: every
// metric name a prometheus.NewDesc or a CounterOpts, GaugeOpts or
// HistogramOpts names (a histogram's with its _bucket, _sum and _count),
// and the Go and process collectors' when the daemon registers them. A
// metric renamed in the code is renamed here.
func exported(t *testing.T) map[string]bool {
	t.Helper()
	names := map[string]bool{}
	fset := token.NewFileSet()
	goCollector := false
	err := filepath.WalkDir(repo, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			// Other modules (test/, bench/) are not plugd.
			if rel, _ := filepath.Rel(repo, path); rel == "test" || rel == "bench" || strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata" {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, 0)
		if err != nil {
			return err
		}
		ast.Inspect(f, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.CallExpr:
				sel, ok := n.Fun.(*ast.SelectorExpr)
				if !ok {
					return true
				}
				switch sel.Sel.Name {
				case "NewDesc":
					if len(n.Args) > 0 {
						names[literal(t, fset, n.Args[0])] = true
					}
				case "NewGoCollector", "NewProcessCollector":
					goCollector = true
				}
			case *ast.CompositeLit:
				sel, ok := n.Type.(*ast.SelectorExpr)
				if !ok {
					return true
				}
				kind := sel.Sel.Name
				if kind != "CounterOpts" && kind != "GaugeOpts" && kind != "HistogramOpts" {
					return true
				}
				for _, e := range n.Elts {
					kv, ok := e.(*ast.KeyValueExpr)
					if !ok {
						continue
					}
					if k, ok := kv.Key.(*ast.Ident); ok && k.Name == "Name" {
						name := literal(t, fset, kv.Value)
						names[name] = true
						if kind == "HistogramOpts" {
							names[name+"_bucket"], names[name+"_sum"], names[name+"_count"] = true, true, true
						}
					}
					if k, ok := kv.Key.(*ast.Ident); ok && (k.Name == "Namespace" || k.Name == "Subsystem") {
						t.Errorf("%s: a metric with a %s: this test reads whole names only", fset.Position(kv.Pos()), k.Name)
					}
				}
			}
			return true
		})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if goCollector {
		for _, n := range []string{"process_start_time_seconds", "process_resident_memory_bytes", "process_cpu_seconds_total", "process_open_fds", "go_goroutines", "go_memstats_heap_inuse_bytes"} {
			names[n] = true
		}
	}
	if len(names) < 20 {
		t.Fatalf("found only these metrics in the code: %v", names)
	}
	return names
}

// literal is the string a metric name's expression holds.
func literal(t *testing.T, fset *token.FileSet, e ast.Expr) string {
	t.Helper()
	bl, ok := e.(*ast.BasicLit)
	if !ok || bl.Kind != token.STRING {
		t.Errorf("%s: a metric name that is not a string literal: write it as one, so that this test sees it", fset.Position(e.Pos()))
		return ""
	}
	s, err := strconv.Unquote(bl.Value)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// selectors are the metric names an expression reads.
func selectors(t *testing.T, expr string) []string {
	t.Helper()
	e, err := promParser.ParseExpr(expr)
	if err != nil {
		t.Errorf("%q does not parse: %v", expr, err)
		return nil
	}
	var out []string
	promqlparser.Inspect(e, func(n promqlparser.Node, _ []promqlparser.Node) error {
		if vs, ok := n.(*promqlparser.VectorSelector); ok {
			name := vs.Name
			for _, m := range vs.LabelMatchers {
				if m.Name == labels.MetricName {
					name = m.Value
				}
			}
			out = append(out, name)
		}
		return nil
	})
	return out
}

// recorded are the recording rules' names.
func recorded(rgs *rulefmt.RuleGroups) map[string]bool {
	out := map[string]bool{}
	for _, g := range rgs.Groups {
		for _, r := range g.Rules {
			if r.Record != "" {
				out[r.Record] = true
			}
		}
	}
	return out
}

// Every expression of the rules and the dashboard parses, and reads only
// metrics plugd exports, or the rules' own records. The rules may also read
// the facts plugd cannot export about itself: whether Prometheus reaches it
// (up) and whether its DaemonSet's and its caretaker's pods are available
// (kube-state-metrics).
func TestMetricNames(t *testing.T) {
	names := exported(t)
	rgs := parseRules(t)
	records := recorded(rgs)
	external := map[string]bool{"up": true, "kube_daemonset_status_desired_number_scheduled": true, "kube_daemonset_status_number_available": true, "kube_deployment_status_replicas_available": true}
	for _, g := range rgs.Groups {
		for _, r := range g.Rules {
			for _, n := range selectors(t, r.Expr) {
				if !names[n] && !records[n] && !external[n] {
					t.Errorf("rule %s%s reads %s, which plugd does not export", r.Alert, r.Record, n)
				}
			}
		}
	}

	b, err := os.ReadFile(filepath.Join(monitoringDir, "dashboard.json"))
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Title      string
		Panels     []dashPanel
		Templating struct {
			List []struct {
				Name, Type string
				Query      any
			}
		}
	}
	if err := json.Unmarshal(b, &dash); err != nil {
		t.Fatalf("dashboard.json: %v", err)
	}
	// Grafana's variables, as Prometheus would see them substituted.
	vars := strings.NewReplacer("$__rate_interval", "5m", "$__interval", "1m", "$node", "node-a")
	exprs := 0
	for _, p := range dash.Panels {
		if p.Type != "row" && len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, tg := range p.Targets {
			exprs++
			for _, n := range selectors(t, vars.Replace(tg.Expr)) {
				if !names[n] && !records[n] {
					t.Errorf("panel %q reads %s, which plugd does not export", p.Title, n)
				}
			}
		}
	}
	for _, v := range dash.Templating.List {
		if v.Type != "query" {
			continue
		}
		q, _ := json.Marshal(v.Query)
		m := regexp.MustCompile(`label_values\(([^,]+),`).FindStringSubmatch(string(q))
		if m == nil {
			t.Errorf("variable %s: query %s is not label_values(SELECTOR, LABEL)", v.Name, q)
			continue
		}
		sel, _ := strconv.Unquote(`"` + m[1] + `"`)
		for _, n := range selectors(t, sel) {
			if !names[n] {
				t.Errorf("variable %s reads %s, which plugd does not export", v.Name, n)
			}
		}
	}
	if exprs < 10 {
		t.Errorf("the dashboard has %d queries", exprs)
	}
}

type dashPanel struct {
	Type, Title string
	Targets     []struct{ Expr string }
}
