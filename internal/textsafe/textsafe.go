// Package textsafe makes text that plugins (or hooks, or drivers) choose safe
// to store, log and show on an operator's terminal.
package textsafe

import (
	"strconv"
	"strings"
	"unicode"
)

// Escape returns s as valid UTF-8 (invalid bytes dropped) with every
// character a terminal would act on (escape sequences, newlines, bidi
// controls) written as a Go escape, as strconv.QuoteRune writes it without
// the quotes. Spaces are kept.
func Escape(s string) string {
	s = strings.ToValidUTF8(s, "")
	if strings.IndexFunc(s, needsEscape) < 0 {
		return s
	}
	var b strings.Builder
	for _, r := range s {
		if needsEscape(r) {
			q := strconv.QuoteRune(r)
			b.WriteString(q[1 : len(q)-1])
		} else {
			b.WriteRune(r)
		}
	}
	return b.String()
}

func needsEscape(r rune) bool { return !unicode.IsPrint(r) && r != ' ' }

// Printable is Escape, cut to at most max bytes at a character boundary.
func Printable(s string, max int) string {
	s = Escape(s)
	if len(s) > max {
		s = strings.ToValidUTF8(s[:max], "")
	}
	return s
}
