package deploy

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// JSON Schema cannot compare durations, but a pattern can hold one to a
// range when the ways of writing it are bounded. The chart's schema takes
// a duration of plugd's written
//
//   - as one number and one unit of h, m, s or ms, with a fraction if
//     wanted (90s, 1.5m, 500ms, 24h), or
//   - as Go prints one: whole hours and minutes, then seconds (1h30m,
//     1m30s, 5m0s, 1h0m0s),
//
// and holds it to plugd's range; zero (plugd's default) and, where plugd
// allows one, any negative duration are taken as plugd takes them. What
// plugd also takes but the schema refuses (it is stricter, never looser):
// the units ns, us and µs, leading zeros (05m), a unit repeated or out of
// order (1h90m, 30s1m), and a fraction of a unit not ending in decimal
// (0.5m where the floor is 1s). TestDurationPatterns checks this.

// durationRange is a bounded duration of plugd's: its $defs name in
// values.schema.json and plugd's range (cmd/plugd/internal/daemon/bounds.go,
// held to plugd by TestBadValues' cases at the bounds).
type durationRange struct {
	def      string
	min, max time.Duration
	negative bool // plugd takes a negative value (disables, or for ever)
}

var durationRanges = []durationRange{
	{"duration1sTo24h", time.Second, 24 * time.Hour, false},
	{"duration1mTo5m", time.Minute, 5 * time.Minute, false},
	{"duration10msTo24h", 10 * time.Millisecond, 24 * time.Hour, false},
	{"duration10msTo24hOrNegative", 10 * time.Millisecond, 24 * time.Hour, true},
	{"duration100msTo24hOrNegative", 100 * time.Millisecond, 24 * time.Hour, true},
	{"duration10msTo10m", 10 * time.Millisecond, 10 * time.Minute, false},
}

// anyDuration is a Go duration of any size, as the schema writes one.
const anyDuration = `([0-9]+(\.[0-9]*)?|\.[0-9]+)(ns|us|µs|ms|s|m|h)`

// durationPattern is the pattern of r: every spelling described above of
// a duration plugd takes.
func durationPattern(r durationRange) string {
	if r.min > time.Minute {
		panic("durationPattern: compound forms assume a floor of at most 1m")
	}
	alts := []string{`[-+]?(0|0+(\.0*)?(ns|us|µs|ms|s|m|h))`} // zero: plugd's default
	if r.negative {
		alts = append(alts, `-(`+anyDuration+`)+`)
	}
	for _, u := range []struct {
		name string
		d    time.Duration
	}{{"h", time.Hour}, {"m", time.Minute}, {"s", time.Second}, {"ms", time.Millisecond}} {
		alts = append(alts, oneUnit(r.min, r.max, u.d, u.name)...)
	}
	// Go's own forms: the leading whole hours or minutes make at least 1m.
	const sec, anySec, zeroSec = `[0-5]?[0-9]`, `[0-5]?[0-9](\.[0-9]*)?s`, `0+(\.0*)?s`
	if r.max >= time.Hour && r.max%time.Hour == 0 {
		h := int64(r.max / time.Hour)
		if h > 1 {
			alts = append(alts, intRange(1, h-1)+`h`+sec+`m(`+anySec+`)?`)
		}
		alts = append(alts, strconv.FormatInt(h, 10)+`h0+m(`+zeroSec+`)?`)
	}
	if m := int64(r.max / time.Minute); r.max%time.Minute == 0 && m >= 1 {
		if m > 1 {
			alts = append(alts, intRange(1, m-1)+`m`+anySec)
		}
		alts = append(alts, strconv.FormatInt(m, 10)+`m`+zeroSec)
	}
	return "^(" + strings.Join(alts, "|") + ")$"
}

// oneUnit is the alternatives of r written as one number of unit u: none
// where the ceiling is not a whole number of u.
func oneUnit(min, max, u time.Duration, name string) []string {
	if max%u != 0 || max < u {
		return nil
	}
	hi := int64(max / u)
	lo := int64(min / u)
	var alts []string
	if min%u != 0 {
		// A fraction of u at the floor: only where it ends in decimal.
		if digits, ok := decimalFraction(int64(min%u), int64(u)); ok {
			alts = append(alts, strconv.FormatInt(lo, 10)+`\.`+atLeast(digits)+name)
		}
		lo++
	}
	if lo <= hi-1 {
		alts = append(alts, intRange(lo, hi-1)+`(\.[0-9]*)?`+name)
	}
	return append(alts, strconv.FormatInt(hi, 10)+`(\.0*)?`+name)
}

// decimalFraction is num/den (< 1) as the digits after the point, if it
// ends within 18 of them.
func decimalFraction(num, den int64) (string, bool) {
	var b strings.Builder
	for range 18 {
		num *= 10
		b.WriteByte(byte('0' + num/den))
		num %= den
		if num == 0 {
			return b.String(), true
		}
	}
	return "", false
}

// atLeast matches the digits after a point whose value is at least 0.f.
func atLeast(f string) string {
	var alts []string
	for i := range len(f) {
		if f[i] < '9' {
			alts = append(alts, f[:i]+digitClass(f[i]+1, '9')+`[0-9]*`)
		}
	}
	alts = append(alts, f+`[0-9]*`)
	return "(" + strings.Join(alts, "|") + ")"
}

// intRange matches the whole numbers from lo to hi, written without
// leading zeros.
func intRange(lo, hi int64) string {
	var alts []string
	for n := len(strconv.FormatInt(lo, 10)); n <= len(strconv.FormatInt(hi, 10)); n++ {
		a, b := max(lo, pow10(n-1)), min(hi, pow10(n)-1)
		if n == 1 {
			a = lo
		}
		if a <= b {
			alts = append(alts, sameLength(strconv.FormatInt(a, 10), strconv.FormatInt(b, 10)))
		}
	}
	return "(" + strings.Join(alts, "|") + ")"
}

// sameLength matches the digit strings from a to b, of one length.
func sameLength(a, b string) string {
	if a == b {
		return a
	}
	if len(a) == 1 {
		return digitClass(a[0], b[0])
	}
	if a[0] == b[0] {
		return a[:1] + "(" + sameLength(a[1:], b[1:]) + ")"
	}
	rest := len(a) - 1
	var alts []string
	lo, hi := a[0], b[0]
	if a[1:] != strings.Repeat("0", rest) {
		alts = append(alts, a[:1]+"("+sameLength(a[1:], strings.Repeat("9", rest))+")")
		lo++
	}
	if b[1:] != strings.Repeat("9", rest) {
		hi--
	}
	if lo <= hi {
		alts = append(alts, digitClass(lo, hi)+fmt.Sprintf("[0-9]{%d}", rest))
	}
	if b[1:] != strings.Repeat("9", rest) {
		alts = append(alts, b[:1]+"("+sameLength(strings.Repeat("0", rest), b[1:])+")")
	}
	return strings.Join(alts, "|")
}

func digitClass(lo, hi byte) string {
	if lo == hi {
		return string(lo)
	}
	return "[" + string(lo) + "-" + string(hi) + "]"
}

func pow10(n int) int64 {
	p := int64(1)
	for range n {
		p *= 10
	}
	return p
}

// schemaDefs are the $defs of values.schema.json.
func schemaDefs(t *testing.T) map[string]struct {
	Pattern string `json:"pattern"`
} {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(chartDir, "values.schema.json"))
	if err != nil {
		t.Fatal(err)
	}
	var s struct {
		Defs map[string]struct {
			Pattern string `json:"pattern"`
		} `json:"$defs"`
	}
	if err := json.Unmarshal(b, &s); err != nil {
		t.Fatal(err)
	}
	return s.Defs
}

// The schema's bounded durations are durationPattern's, and each takes
// exactly what plugd takes of the spellings it describes, and never what
// plugd refuses.
func TestDurationPatterns(t *testing.T) {
	defs := schemaDefs(t)
	for _, r := range durationRanges {
		want := durationPattern(r)
		if got := defs[r.def].Pattern; got != want {
			t.Errorf("values.schema.json $defs.%s.pattern is not the generated one; want\n%s", r.def, strconv.Quote(want))
			continue
		}
		re := regexp.MustCompile(want)
		for _, s := range spellings(r) {
			d, err := time.ParseDuration(s.text)
			plugd := err == nil && (d == 0 || d < 0 && r.negative || d >= r.min && d <= r.max)
			schema := re.MatchString(s.text)
			switch {
			case schema && !plugd:
				t.Errorf("%s: the schema takes %q, which plugd refuses", r.def, s.text)
			case !schema && plugd && s.described:
				t.Errorf("%s: the schema refuses %q, which plugd takes", r.def, s.text)
			}
		}
	}
}

// spelling is a way of writing a duration, and whether it is one the
// schema describes.
type spelling struct {
	text      string
	described bool
}

// spellings writes durations around r's bounds, and others, every way.
func spellings(r durationRange) []spelling {
	var ds []time.Duration
	for _, b := range []time.Duration{r.min, r.max, time.Second, time.Minute, time.Hour, 100 * time.Millisecond, 10 * time.Millisecond} {
		for _, e := range []time.Duration{0, time.Millisecond, 500 * time.Microsecond, time.Second, 500 * time.Millisecond, time.Minute, 30 * time.Minute} {
			ds = append(ds, b+e, b-e, -(b + e))
		}
	}
	ds = append(ds, 0, 90*time.Second, 25*time.Hour, 1441*time.Minute, 23*time.Hour+59*time.Minute+59*time.Second+999*time.Millisecond)
	var out []spelling
	for _, d := range ds {
		if d == 0 {
			out = append(out, spelling{"0", true}, spelling{"0s", true}, spelling{"0.0m", true})
			continue
		}
		out = append(out, spelling{d.String(), !strings.ContainsAny(d.String(), "nµu") && !(d < 0 && !r.negative)})
		neg := ""
		if d < 0 {
			neg, d = "-", -d
		}
		for _, u := range []struct {
			name string
			d    time.Duration
		}{{"h", time.Hour}, {"m", time.Minute}, {"s", time.Second}, {"ms", time.Millisecond}} {
			v := strconv.FormatFloat(float64(d)/float64(u.d), 'f', -1, 64)
			_, ends := decimalFraction(int64(r.min%u.d), int64(u.d))
			described := neg == "" && r.max%u.d == 0 && r.max >= u.d && (r.min%u.d == 0 || ends || d >= (r.min/u.d+1)*u.d)
			out = append(out, spelling{neg + v + u.name, described})
		}
		out = append(out, spelling{neg + strconv.FormatInt(int64(d/time.Microsecond), 10) + "us", false})
	}
	return append(out, spelling{"1h90m", false}, spelling{"30s1m", false}, spelling{"05m", false}, spelling{"1m1m", false},
		spelling{"5", false}, spelling{"1d", false}, spelling{"", false}, spelling{"1.5.5s", false})
}
