package dirtrust

import (
	"os"
	"testing"
)

// Windows: nothing is checked, not even a directory another user owns.
func TestWindowsChecksNothing(t *testing.T) {
	if err := Check(t.TempDir(), os.Geteuid()+1); err != nil {
		t.Errorf("Check = %v", err)
	}
}
