package nodecond

import (
	"encoding/json"
	"errors"
	"fmt"
	"time"
)

// The fleet summary: plugd caretaker, which watches every Node already,
// counts the cluster view (a Census of all Nodes) and keeps it in a
// ConfigMap of its namespace, SummaryName, under the key SummaryKey, so
// that kubectl plugd cluster reads one small object instead of every Node:
// at 65,000 Nodes of 20 KB a list is 1.4 GB for the API server to encode,
// longer than 5 seconds on its own.
const (
	SummaryName = "plugd-fleet"
	SummaryKey  = "summary.json"
	// MaxSummaryBytes bounds the summary as written: a ConfigMap may hold
	// 1 MiB. A view larger than that (thousands of nodes where a plugin is
	// not ready, each with its message) is written with its counts only,
	// and Complete false.
	MaxSummaryBytes = 512 << 10
)

// Summary is the cluster view as plugd caretaker last counted it.
type Summary struct {
	// Time is when it was counted, by the caretaker's clock: the conditions
	// plugd has not written within MaxHeartbeatAge of it count as not
	// maintained, as a reader's own census holds them against its clock.
	Time time.Time `json:"time"`
	// Complete says the view holds every node where a plugin is not ready;
	// false, only the counts (the lists did not fit MaxSummaryBytes).
	Complete bool        `json:"complete"`
	View     ClusterView `json:"view"`
}

// EncodeSummary is s as the caretaker writes it: with its lists of nodes
// where they fit in MaxSummaryBytes, else without them (Complete false).
func EncodeSummary(s Summary) ([]byte, error) {
	s.Complete = true
	b, err := json.Marshal(s)
	if err != nil || len(b) <= MaxSummaryBytes {
		return b, err
	}
	s.Complete = false
	s.View.Plugins = append([]ClusterPlugin(nil), s.View.Plugins...)
	for i := range s.View.Plugins {
		s.View.Plugins[i].NotReady = nil
	}
	return json.Marshal(s)
}

// DecodeSummary reads a summary as EncodeSummary wrote it; an object
// bigger than MaxSummaryBytes, or one that is not a summary, is an error.
func DecodeSummary(b []byte) (Summary, error) {
	var s Summary
	if len(b) > MaxSummaryBytes {
		return s, fmt.Errorf("the summary is %d bytes, more than the %d plugd caretaker writes", len(b), MaxSummaryBytes)
	}
	if err := json.Unmarshal(b, &s); err != nil {
		return s, fmt.Errorf("the summary is not plugd caretaker's: %w", err)
	}
	if s.Time.IsZero() {
		return s, errors.New("the summary has no time: it is not plugd caretaker's")
	}
	return s, nil
}
