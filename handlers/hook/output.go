package hook

import (
	"strings"
	"unicode/utf8"

	"github.com/plugd/plugd/internal/textsafe"
)

const (
	// keepOutput is how much of a hook's output is kept for Details.
	keepOutput = 4 << 10
	// maxReason is how much of it goes into an error, which the plugin is
	// told and plugd's status shows.
	maxReason = 512
)

// tail keeps the last keepOutput bytes written to it, so that a hook that
// writes without end costs no more memory than that.
type tail struct{ b []byte }

func (t *tail) Write(p []byte) (int, error) {
	n := len(p)
	if len(p) >= keepOutput {
		t.b = append(t.b[:0], p[len(p)-keepOutput:]...)
		return n, nil
	}
	t.b = append(t.b, p...)
	if len(t.b) > 2*keepOutput {
		t.b = append(t.b[:0], t.b[len(t.b)-keepOutput:]...)
	}
	return n, nil
}

// String returns the last keepOutput bytes, made printable.
func (t *tail) String() string {
	b := t.b
	if len(b) > keepOutput {
		b = b[len(b)-keepOutput:]
	}
	return lastBytes(printable(string(b)), keepOutput)
}

// printable makes a hook's output safe to store and to show, trimmed of
// surrounding space: a hook's output may come from anywhere, and reaches an
// operator's terminal through plugd's status.
func printable(s string) string { return textsafe.Escape(strings.TrimSpace(s)) }

// lastBytes returns the end of s, at most n bytes of it, cut at a character
// boundary: the end of a command's output is where it says why it failed.
func lastBytes(s string, n int) string {
	if len(s) <= n {
		return s
	}
	i := len(s) - n
	for i < len(s) && !utf8.RuneStart(s[i]) {
		i++
	}
	return s[i:]
}

// firstBytes returns the start of s, at most n bytes of it, cut at a
// character boundary: a response body says why at its start.
func firstBytes(s string, n int) string {
	if len(s) <= n {
		return s
	}
	i := n
	for i > 0 && !utf8.RuneStart(s[i]) {
		i--
	}
	return s[:i]
}
