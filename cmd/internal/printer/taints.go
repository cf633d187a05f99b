package printer

import (
	"fmt"
	"strings"
	"time"

	"github.com/plugd/plugd/api"
)

// Taints is the cell of a plugin's startup taints: each one's state
// (Held with its holder, a pending write marked); wide adds the taint,
// since when, and the re-adds plugd removed again with their last writer.
// "-" for none.
func Taints(ts []api.TaintView, wide bool, now time.Time) string {
	if len(ts) == 0 {
		return "-"
	}
	parts := make([]string, len(ts))
	for i, t := range ts {
		parts[i] = taint(t, wide, now)
	}
	return Cell(strings.Join(parts, "; "))
}

func taint(t api.TaintView, wide bool, now time.Time) string {
	s := t.State
	if t.State == api.TaintHeld {
		s += " by " + t.Holder
	}
	if !wide {
		if t.Pending {
			s += "(pending)"
		}
		return s
	}
	s = t.Taint + " " + s
	if t.All {
		s = "(for all) " + s
	}
	if !t.Since.IsZero() {
		s += " " + Since(t.Since, now) + " ago"
	}
	if t.ReRemovals > 0 {
		s += fmt.Sprintf(", removed again %d times (last re-added by %s)", t.ReRemovals, t.ReaddedBy)
	}
	if t.Pending {
		s += ", write pending"
	}
	return s
}
