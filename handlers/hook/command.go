package hook

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/plugd/plugd/pluginmanager"
)

// killGrace is how long the output pipes may stay open once the hook's process
// group is dead: only a process that left the group can hold them, and the
// run does not wait for it any longer than this.
const killGrace = time.Second

// cmd is the command of a run of the hook for event and the plugin p, with
// payload on its stdin, writing to stdout and stderr, in a process group of
// its own that is killed when ctx is done.
func (h *Handler) cmd(ctx context.Context, event string, p pluginmanager.Plugin, payload []byte, stdout, stderr *os.File) *exec.Cmd {
	cmd := exec.CommandContext(ctx, h.program)
	cmd.Args = h.command
	cmd.Env = append(slices.Clip(h.env), // never into h.env's spare capacity, shared by concurrent runs
		"PLUGD_EVENT="+event,
		"PLUGD_PLUGIN_TYPE="+p.Type,
		"PLUGD_PLUGIN_NAME="+p.Name,
		"PLUGD_PLUGIN_ENDPOINT="+p.Endpoint,
		"PLUGD_PLUGIN_VERSIONS="+strings.Join(p.Versions, ","),
		"PLUGD_PLUGIN_SOCKET="+p.Socket,
	)
	cmd.Stdin = bytes.NewReader(payload)
	cmd.Stdout, cmd.Stderr = stdout, stderr
	ownGroup(cmd)
	cmd.Cancel = func() error { return killGroup(cmd.Process.Pid) }
	// Bounds Wait's wait for the goroutine that writes stdin, should a process
	// that left the group hold it open without reading.
	cmd.WaitDelay = killGrace

	return cmd
}

// exec runs the command once, with payload on stdin, and reads its answer from
// its exit status.
func (h *Handler) exec(ctx context.Context, outOfTime error, run *Run, p pluginmanager.Plugin, payload []byte) outcome {
	event := run.Event
	// Pipes of our own rather than an io.Writer: os/exec would wait in Wait
	// for every process holding its pipes, and we want to kill those first.
	stdoutR, stdoutW, err := os.Pipe()
	if err != nil {
		return outcome{result: resultError, err: fmt.Errorf("%s hook not started: %w", event, err)}
	}
	defer stdoutR.Close()
	stderrR, stderrW, err := os.Pipe()
	if err != nil {
		stdoutW.Close()
		return outcome{result: resultError, err: fmt.Errorf("%s hook not started: %w", event, err)}
	}
	defer stderrR.Close()

	cmd := h.cmd(ctx, event, p, payload, stdoutW, stderrW)
	err = cmd.Start()
	// The child has its own copies; ours must go for the readers to see EOF.
	stdoutW.Close()
	stderrW.Close()
	if err != nil && ctx.Err() != nil {
		return stopped(ctx, event, outOfTime, false, "")
	}
	if err != nil {
		return outcome{result: resultError, err: fmt.Errorf("%s hook not started: %w", event, err)}
	}
	var stdout, stderr tail
	var wg sync.WaitGroup
	wg.Go(func() { io.Copy(&stdout, stdoutR) })
	wg.Go(func() { io.Copy(&stderr, stderrR) })

	cmd.Wait() // the answer is in cmd.ProcessState
	// Whatever the hook left running in its group goes with it. The group's id
	// cannot have been reused while a process is in the group; if none is, the
	// kill finds no one.
	killGroup(cmd.Process.Pid)
	deadline := time.Now().Add(killGrace)
	stdoutR.SetReadDeadline(deadline)
	stderrR.SetReadDeadline(deadline)
	wg.Wait()

	out := stderr.String()
	if out == "" {
		out = stdout.String()
	}
	run.Output = out
	reason := lastBytes(out, maxReason)

	state := cmd.ProcessState
	switch {
	case state == nil:
		return outcome{result: resultError, err: fmt.Errorf("%s hook: lost track of the process", event)}
	case state.Exited():
		status := state.ExitCode()
		run.ExitStatus = &status
		if status == 0 {
			return outcome{result: resultAccepted}
		}
		return outcome{
			result: resultRefused,
			final:  event == eventRegister && status == exitRefuseForGood,
			err:    withOutput(fmt.Sprintf("%s hook refused the plugin (exit status %d)", event, status), reason),
		}
	case ctx.Err() != nil:
		return stopped(ctx, event, outOfTime, true, reason)
	default:
		return outcome{result: resultError, err: withOutput(fmt.Sprintf("%s hook failed: %v", event, state), reason)}
	}
}
