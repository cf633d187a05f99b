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
