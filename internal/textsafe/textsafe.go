// Package textsafe makes text that plugins (or hooks, or drivers) choose safe
// to store, log and show on an operator's terminal.
package textsafe

import (
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
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
		s = cut(s, max)
	}
	return s
}

// Shorten is Escape, cut to at most max bytes at a character boundary with
// "..." at the end when something was cut: text to show whole where it is
// short, and with a visible cut where it is not.
func Shorten(s string, max int) string {
	s = Escape(s)
	if len(s) <= max {
		return s
	}
	if max < len(ellipsis) {
		return cut(s, max)
	}
	return cut(s, max-len(ellipsis)) + ellipsis
}

const ellipsis = "..."

// cut is s cut to at most n bytes, at the start of a character.
func cut(s string, n int) string {
	for n > 0 && n < len(s) && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:min(n, len(s))]
}
