// Package printer is how plugd's command-line programs (plugctl and
// kubectl-plugd) print: aligned tables of terminal-safe cells, ages, JSON
// and YAML, and doctor findings. Both programs print the same things the
// same way, so a user reads one form.
package printer

import (
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/plugd/plugd/internal/textsafe"
)

// Table is rows of cells under a header, printed with aligned columns.
type Table struct {
	Header []string
	Rows   [][]string
	// NoHeader leaves the header out (kubectl's --no-headers); the
	// columns are as wide as with it, so that the rows line up alike.
	NoHeader bool
}

// columnGap separates columns, as kubectl does.
const columnGap = "   "

// minLastColumn is the least room the last column gets when cut to fit, so
// that a narrow terminal still shows the start of an error.
const minLastColumn = 20

// Write prints t. If width is positive, the last column is cut so that each
// line fits in width characters; the others are never cut, so that IDs can be
// copied from the output.
func (t Table) Write(w io.Writer, width int) error {
	cols := len(t.Header)
	widths := make([]int, cols)
	for _, r := range append([][]string{t.Header}, t.Rows...) {
		for i, c := range r {
			widths[i] = max(widths[i], utf8.RuneCountInString(c))
		}
	}
	last := -1 // no limit
	if width > 0 {
		used := 0
		for _, cw := range widths[:cols-1] {
			used += cw + len(columnGap)
		}
		last = max(width-used, minLastColumn)
	}
	var b strings.Builder
	rows := append([][]string{t.Header}, t.Rows...)
	if t.NoHeader {
		rows = rows[1:]
	}
	for _, r := range rows {
		for i, c := range r {
			if i == cols-1 {
				b.WriteString(Truncate(c, last))
				break
			}
			b.WriteString(c)
			b.WriteString(strings.Repeat(" ", widths[i]-utf8.RuneCountInString(c)))
			b.WriteString(columnGap)
		}
		b.WriteString("\n")
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// Cell makes s fit in a table cell: on one line, and "-" when empty so that
// every row has as many words as the header (for awk and friends).
func Cell(s string) string {
	s = strings.Join(strings.Fields(s), " ")
	// plugd escapes what plugins send; a daemon that did not must still not
	// be able to drive the terminal through plugctl.
	s = strings.Map(func(r rune) rune {
		if unicode.IsPrint(r) || r == ' ' {
			return r
		}
		return '?'
	}, s)
	if s == "" {
		return "-"
	}
	return s
}

// ShortCell is Cell for text some other program chose (a condition's
// message, an error): its unsafe characters escaped as textsafe escapes
// them, cut to at most max bytes at a character boundary, and the cut
// marked with "...". A Node condition's message is whatever its writer
// put there, a megabyte if they like.
func ShortCell(s string, max int) string {
	return Cell(textsafe.Shorten(strings.Join(strings.Fields(s), " "), max))
}

// Truncate cuts s to n characters, marking the cut with an ellipsis; a
// negative n leaves s whole.
func Truncate(s string, n int) string {
	if n < 0 || utf8.RuneCountInString(s) <= n {
		return s
	}
	r := []rune(s)
	return string(r[:n-1]) + "…"
}

// Width is how wide a table on w may be: the terminal's width, else
// $COLUMNS, else a fixed width, so that a table piped to a file or grep still
// has one short line per plugin (the whole error is in -o wide and get).
func Width(w io.Writer, getenv func(string) string) int {
	if n := terminalWidth(w); n > 0 {
		return n
	}
	if n, err := strconv.Atoi(getenv("COLUMNS")); err == nil && n > 0 {
		return n
	}
	return 120
}

// Human is a duration the way people say it: 3s, 5m, 2h, 4d. It is rounded
// down, as ages are.
func Human(d time.Duration) string {
	switch {
	case d < 0:
		return "0s"
	case d < time.Minute:
		return fmt.Sprintf("%ds", int(d/time.Second))
	case d < time.Hour:
		return fmt.Sprintf("%dm", int(d/time.Minute))
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh", int(d/time.Hour))
	}
	return fmt.Sprintf("%dd", int(d/(24*time.Hour)))
}

// Since is how long ago t was, or "-" if it is unknown.
func Since(t, now time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return Human(now.Sub(t))
}

// Until says when t comes: "in 3s", or "now" if it is due; "-" if there is no t.
func Until(t, now time.Time) string {
	if t.IsZero() {
		return "-"
	}
	d := t.Sub(now)
	if d <= 0 {
		return "now"
	}
	// Round up: a retry 300ms away is "in 1s", not "in 0s".
	return "in " + Human((d + time.Second - 1).Truncate(time.Second))
}
