package kube

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/plugd/plugd/api"
)

// What plugd shows of its startup taints (issue 32 item 6), checked in
// TestPluginTaints: plugctl get and plugctl list give each expected
// plugin's taint and its state, and plugctl doctor names the holder of a
// taint another writer put back after the startup window.

// plugctlTaint is the taint of the plugin of name, as plugctl get shows
// it (the first answering socket of that name plugctl list gives); ok
// false while plugd shows none.
func plugctlTaint(t *testing.T, socket, name, taint string) (api.TaintView, string) {
	t.Helper()
	out, code := plugctl(t, "--socket", socket, "list", "--name", name, "-o", "json")
	var l api.PluginList
	if code != 0 || json.Unmarshal([]byte(out), &l) != nil || len(l.Plugins) == 0 {
		return api.TaintView{}, fmt.Sprintf("plugctl list: exit %d: %s", code, out)
	}
	id := l.Plugins[0].ID
	for _, p := range l.Plugins {
		if p.State == api.StateAnswering || p.State == api.StateRegistered {
			id = p.ID
		}
	}
	out, code = plugctl(t, "--socket", socket, "get", id, "-o", "json")
	var p api.Plugin
	if code != 0 || json.Unmarshal([]byte(out), &p) != nil {
		return api.TaintView{}, fmt.Sprintf("plugctl get %s: exit %d: %s", id, code, out)
	}
	for _, v := range p.Taints {
		if strings.HasPrefix(v.Taint, taint+":") {
			return v, out
		}
	}
	return api.TaintView{}, out
}

// wantTaintState waits until plugctl get shows the taint of plugin name in
// state, with ok saying what else must hold of it; and checks that
// plugctl list -o wide shows the state in its TAINT column.
func wantTaintState(t *testing.T, socket, name, taint, state string, ok func(api.TaintView) bool) api.TaintView {
	t.Helper()
	var v api.TaintView
	eventually(t, fmt.Sprintf("plugctl get showing %s's taint %s", name, state), func() (bool, string) {
		var out string
		v, out = plugctlTaint(t, socket, name, taint)
		list, _ := plugctl(t, "--socket", socket, "list", "-o", "wide")
		return v.State == state && (ok == nil || ok(v)), fmt.Sprintf("%+v\n%s\n%s", v, out, list)
	})
	out, _ := plugctl(t, "--socket", socket, "list", "--name", name, "-o", "wide")
	if !strings.Contains(out, "TAINT") || !strings.Contains(out, taint+":NoSchedule "+state) {
		t.Errorf("plugctl list -o wide does not show %s %s:\n%s", taint, state, out)
	}
	return v
}

// wantTaintRemoved waits until plugctl get shows the taint of plugin name
// Removed, removed again reRemovals times, the last re-add by readdedBy.
func wantTaintRemoved(t *testing.T, socket, name, taint string, reRemovals int, readdedBy string) {
	t.Helper()
	wantTaintState(t, socket, name, taint, api.TaintRemoved, func(v api.TaintView) bool {
		return !v.Since.IsZero() && v.ReRemovals == reRemovals && v.ReaddedBy == readdedBy
	})
}

// wantTaintHeld waits until plugctl get shows the taint of plugin name
// Held by holder, since a time.
func wantTaintHeld(t *testing.T, socket, name, taint, holder string) {
	t.Helper()
	wantTaintState(t, socket, name, taint, api.TaintHeld, func(v api.TaintView) bool { return v.Holder == holder && !v.Since.IsZero() })
}

// wantDoctorNamesHolder waits until plugctl doctor has the finding
// taint-held for the taint, naming holder as its writer, and says since
// when and how to remove it.
func wantDoctorNamesHolder(t *testing.T, socket, node, taint, holder string) {
	t.Helper()
	eventually(t, "plugctl doctor naming the holder of "+taint, func() (bool, string) {
		out, _ := plugctl(t, "--socket", socket, "doctor", "-o", "json") // exit 4, and a count on stderr, after the JSON
		var l api.FindingList
		if json.NewDecoder(strings.NewReader(out)).Decode(&l) != nil {
			return false, out
		}
		for _, f := range l.Findings {
			if f.Check == "taint-held" && strings.Contains(f.Summary, taint) && strings.Contains(f.Summary, "put there by "+holder+" since ") &&
				strings.Contains(f.Remedy, "kubectl taint node "+node+" "+taint+":NoSchedule-") {
				return true, ""
			}
		}
		return false, out
	})
}

// wantRemovalTimed checks that plugd timed the removal of the taint from
// the kubelet's registration (plugd_taint_removal_seconds), and logs it.
func wantRemovalTimed(t *testing.T, pd *plugd, taint string) {
	t.Helper()
	text, _ := plugctlMetrics(t, pd)
	label := fmt.Sprintf("taint=%q", taint+":NoSchedule")
	count, ok := metric(text, "plugd_taint_removal_seconds_count", label)
	sum, _ := metric(text, "plugd_taint_removal_seconds_sum", label)
	if !ok || count != "1" {
		t.Errorf("plugd_taint_removal_seconds_count{%s}: %q; want 1", label, count)
		return
	}
	t.Logf("the kubelet's registration to the removal of %s, as plugd timed it: %ss", taint, sum)
}
