package textsafe

import (
	"strings"
	"testing"
	"unicode/utf8"
)

func TestPrintable(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"plain text", "plain text"},
		{"\x1b[31mred\n", `\x1b[31mred\n`},
		{"bidi \u202e", `bidi \u202e`},
		{"bad \xff byte", "bad  byte"},
	} {
		if got := Printable(tc.in, 100); got != tc.want {
			t.Errorf("Printable(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
	long := strings.Repeat("é", 100) // 200 bytes
	if got := Printable(long, 51); len(got) != 50 || !utf8.ValidString(got) {
		t.Errorf("cut to %d bytes, valid %v; want 50, cut at a character boundary", len(got), utf8.ValidString(got))
	}
}

// Shorten keeps short text whole and marks a cut, which never falls inside
// a character: the result is valid UTF-8 of at most max bytes.
func TestShorten(t *testing.T) {
	if got := Shorten("short \x01", 100); got != `short \x01` {
		t.Errorf("Shorten kept %q", got)
	}
	for shift := range 4 {
		long := strings.Repeat("a", shift) + strings.Repeat("é\u202e", 100)
		for _, max := range []int{0, 2, 3, 50, 51, 52, 53} {
			got := Shorten(long, max)
			if len(got) > max || !utf8.ValidString(got) || max >= 3 && !strings.HasSuffix(got, "...") {
				t.Errorf("Shorten(%d a's and more, %d) = %q (%d bytes, valid %v)", shift, max, got, len(got), utf8.ValidString(got))
			}
		}
	}
}
