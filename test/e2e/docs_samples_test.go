package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/plugd/plugd/api"
	"github.com/plugd/plugd/internal/testenv"
)

// Issue 33, item 12: the samples of plugctl's output in the docs are what
// the commands they show print, under plugd as getting-started.md runs it:
// no configuration, its default directories, the example plugin started
// as shown. The sample had the example plugin Registered where a default
// plugd rejects it (no handler for its type). AGE is left out of the
// comparison, and a cell the sample cuts ("…") is compared up to the cut.
func TestDocsSamples(t *testing.T) {
	runtime := testenv.ShortDir(t, "gs")
	env := append(os.Environ(), "XDG_RUNTIME_DIR="+runtime)
	command := func(name string, args ...string) *exec.Cmd {
		cmd := exec.Command(filepath.Join(bin, name), args...)
		cmd.Env = env
		return cmd
	}
	socket := filepath.Join(runtime, "plugd", "plugd.sock")
	n := &node{socket: socket, client: &api.Client{Socket: socket}, plugd: startCmd(t, command("plugd"))}
	n.waitReady(t, 10*time.Millisecond)
	// As getting-started.md runs them.
	csi := startCmd(t, command("plugin", "-type", "CSIPlugin", "-name", "csi.example.com", "-versions", "1.0.0"))
	nope := startCmd(t, command("plugin", "-type", "example.com/Nope", "-name", "nope"))
	defer func() {
		for _, p := range []*proc{csi, nope, n.plugd} {
			p.stop(t, syscall.SIGTERM)
		}
	}()
	for name, state := range map[string]string{"csi.example.com": "registered", "nope": "rejected"} {
		if out, code := plugctl(t, socket, "wait", "--name", name, "--for", state, "--timeout", "30s"); code != 0 {
			t.Fatalf("plugctl wait --name %s --for %s: %d\n%s", name, state, code, out)
		}
	}
	got := map[string]string{}
	got["plugctl list"], _ = plugctl(t, socket, "list")
	var code int
	got["plugctl wait --name nope --for registered --timeout 1s"], code = plugctl(t, socket, "wait", "--name", "nope", "--for", "registered", "--timeout", "1s")
	got["echo $?"] = strconv.Itoa(code) + "\n"

	for _, doc := range []string{"docs/getting-started.md", "docs/reference.md"} {
		b, err := os.ReadFile(filepath.Join(testenv.Root(), doc))
		if err != nil {
			t.Fatal(err)
		}
		samples := consoleSamples(string(b))
		if len(samples) == 0 {
			t.Errorf("%s has no sample of plugctl list", doc)
		}
		for cmd, want := range samples {
			out, ok := got[cmd]
			if !ok {
				continue // a command this test does not run (get, watch)
			}
			if !sameTable(want, out) {
				t.Errorf("%s: the sample of %q is not what it prints (AGE aside):\n%s\nit prints:\n%s", doc, cmd, want, out)
			}
		}
	}
}

// consoleSamples are the commands of the docs' console blocks that start
// with "$ plugctl list", and the output shown under each ("$ " starts a
// command; a comment after it is dropped).
func consoleSamples(doc string) map[string]string {
	out := map[string]string{}
	for _, block := range regexp.MustCompile("(?s)```console\n(\\$ plugctl list\n.*?)```").FindAllStringSubmatch(doc, -1) {
		var cmd string
		for _, line := range strings.SplitAfter(block[1], "\n") {
			if c, ok := strings.CutPrefix(line, "$ "); ok {
				c, _, _ = strings.Cut(c, "#")
				cmd = strings.TrimSpace(c)
				out[cmd] = ""
				continue
			}
			out[cmd] += line
		}
	}
	return out
}

// sameTable reports whether got prints what the sample want shows: line by
// line, cell by cell (cells are separated by two spaces or more), the AGE
// column aside, a cell of want that ends in "…" a prefix of got's.
func sameTable(want, got string) bool {
	wl, gl := strings.Split(strings.TrimRight(want, "\n"), "\n"), strings.Split(strings.TrimRight(got, "\n"), "\n")
	if len(wl) != len(gl) {
		return false
	}
	cells := regexp.MustCompile(`\s{2,}`)
	age := -1
	for i := range wl {
		wc, gc := cells.Split(strings.TrimSpace(wl[i]), -1), cells.Split(strings.TrimSpace(gl[i]), -1)
		if i == 0 {
			for j, c := range wc {
				if c == "AGE" {
					age = j
				}
			}
		}
		if len(wc) != len(gc) {
			return false
		}
		for j := range wc {
			if j == age && i > 0 {
				continue
			}
			if w, cut := strings.CutSuffix(wc[j], "…"); cut && strings.HasPrefix(gc[j], w) || wc[j] == gc[j] {
				continue
			}
			return false
		}
	}
	return true
}
