package conformance

import (
	"errors"
	"strings"
	"testing"
)

// A failed csi-sanity run is reported by the specs it names as failed, each
// once (ginkgo names them inline and again in its summary); without any,
// by the end of its output.
func TestSanityFailure(t *testing.T) {
	out := `• [FAIL] [0.001 seconds]
[FAIL] Node Service NodePublishVolume [It] should fail when no volume id is provided
Summarizing 1 Failure:
  [FAIL] Node Service NodePublishVolume [It] should fail when no volume id is provided
Ran 7 of 103 Specs in 0.076 seconds
`
	got := sanityFailure(errors.New("exit status 1"), []byte(out))
	want := "csi-sanity: exit status 1; failed: Node Service NodePublishVolume [It] should fail when no volume id is provided"
	if got != want {
		t.Errorf("got %q, want %q", got, want)
	}
	got = sanityFailure(errors.New("exit status 2"), []byte("flag provided but not defined: -csi.nope\n"))
	if !strings.Contains(got, "its output ends: flag provided but not defined") {
		t.Errorf("got %q, want the end of the output", got)
	}
	if got := sanityLine([]byte(out), "Ran "); got != "Ran 7 of 103 Specs in 0.076 seconds" {
		t.Errorf("sanityLine: %q", got)
	}
}
