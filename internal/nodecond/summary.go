package nodecond

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/plugd/plugd/internal/textsafe"
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
// A reason or message longer than MaxMessage bytes is cut (escaped, with
// "..."): plugd's are no longer, and another writer's, which the API does
// not bound, would crowd out the lists.
func EncodeSummary(s Summary) ([]byte, error) {
	s.Complete = true
	s.View.Plugins = append([]ClusterPlugin(nil), s.View.Plugins...)
	for i := range s.View.Plugins {
		p := &s.View.Plugins[i]
		p.NotReady = append([]NodeCondition(nil), p.NotReady...)
		for j := range p.NotReady {
			p.NotReady[j].Reason = bounded(p.NotReady[j].Reason)
			p.NotReady[j].Message = bounded(p.NotReady[j].Message)
		}
	}
	b, err := json.Marshal(s)
	if err != nil {
		return nil, err
	}
	if b = yamlSafe(b); len(b) <= MaxSummaryBytes {
		return b, nil
	}
	s.Complete = false
	for i := range s.View.Plugins {
		s.View.Plugins[i].NotReady = nil
	}
	b, err = json.Marshal(s)
	return yamlSafe(b), err
}

// yamlSafe is the JSON b with the characters YAML does not allow in a
// document (DEL, the C1 controls, U+FFFE, U+FFFF), which encoding/json
// leaves as they are, written as \u escapes: the API server parses a
// server-side apply as YAML, and refuses them. Such characters are only
// in strings, where the escape means the same character.
func yamlSafe(b []byte) []byte {
	if !bytes.ContainsFunc(b, notYAML) {
		return b
	}
	var out bytes.Buffer
	for _, r := range string(b) {
		if notYAML(r) {
			fmt.Fprintf(&out, "\\u%04x", r)
			continue
		}
		out.WriteRune(r)
	}
	return out.Bytes()
}

func notYAML(r rune) bool { return r >= 0x7f && r <= 0x9f || r == 0xfffe || r == 0xffff }

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

// bounded is s if it is at most MaxMessage bytes, else s escaped and cut
// to MaxMessage bytes.
func bounded(s string) string {
	if len(s) <= MaxMessage {
		return s
	}
	return textsafe.Shorten(s, MaxMessage)
}
