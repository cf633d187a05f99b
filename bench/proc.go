package main

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// clockTicks is USER_HZ, the unit of CPU times in /proc/<pid>/stat: 100 on
// every Linux architecture Go supports (sysconf(_SC_CLK_TCK) needs cgo).
const clockTicks = 100

// managerProc is a manager under test running as a child process.
type managerProc struct {
	name   string
	cmd    *exec.Cmd
	log    string        // the child's stdout and stderr
	exited chan struct{} // closed when the child has exited; err is set then
	err    error
}

// startManager runs the manager l on dir.
func startManager(l launch, dir, logPath string) (*managerProc, error) {
	logf, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	defer logf.Close() // the child has its own descriptor
	exe, args := l.command(dir)
	cmd := exec.Command(exe, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	// A benchmark killed half-way must not leave a manager behind.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting the %s manager: %w", l.name, err)
	}
	p := &managerProc{name: l.name, cmd: cmd, log: logPath, exited: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.exited)
	}()
	return p, nil
}

// stop asks the manager to shut down, and kills it if it has not within 30s.
func (p *managerProc) stop() error {
	select {
	case <-p.exited:
		return p.died()
	default:
	}
	p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
		if p.err != nil {
			return p.died()
		}
		return nil
	case <-time.After(30 * time.Second):
		p.cmd.Process.Kill()
		<-p.exited
		return fmt.Errorf("the %s manager did not stop within 30s of SIGTERM%s", p.name, p.logTail())
	}
}

// died describes an exited manager, with the end of its log.
func (p *managerProc) died() error {
	return fmt.Errorf("the %s manager exited (%v)%s", p.name, p.err, p.logTail())
}

// logTail returns the last lines of the manager's log, to put in an error.
func (p *managerProc) logTail() string {
	b, err := os.ReadFile(p.log)
	if err != nil || len(b) == 0 {
		return ""
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > 15 {
		lines = lines[len(lines)-15:]
	}
	return fmt.Sprintf("; last lines of its log %s:\n\t%s", p.log, strings.Join(lines, "\n\t"))
}

// cpu returns the CPU time the manager used so far.
func (p *managerProc) cpu() (time.Duration, error) { return cpuTime(p.cmd.Process.Pid) }

// cpuTime returns the CPU time (user and system, all threads) that process
// pid used so far, to the nanosecond: the sum of its threads' run time in
// /proc/<pid>/task/*/schedstat. /proc/<pid>/stat counts in clock ticks (10
// ms), too coarse for an idle manager: plugd probing 1000 plugins uses a
// few ticks in a 10 s window, and a tick more or less swung its growth
// figure by a third. The sum leaves out threads that have exited, which Go
// programs' threads do not; without schedstat, it falls back to the ticks.
func cpuTime(pid int) (time.Duration, error) {
	if d, err := schedTime(pid); err == nil {
		return d, nil
	}
	return tickTime(pid)
}

// schedTime sums the run time of pid's threads, in nanoseconds.
func schedTime(pid int) (time.Duration, error) {
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil {
		return 0, err
	}
	var sum time.Duration
	for _, t := range tasks {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/schedstat", pid, t.Name()))
		if errors.Is(err, fs.ErrNotExist) {
			continue // the thread exited meanwhile
		}
		if err != nil {
			return 0, err
		}
		f := strings.Fields(string(b))
		if len(f) == 0 {
			return 0, errors.New("empty schedstat")
		}
		n, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil {
			return 0, fmt.Errorf("parsing schedstat: %w", err)
		}
		sum += time.Duration(n)
	}
	return sum, nil
}

// tickTime is the CPU time of pid from /proc/<pid>/stat, in clock ticks.
func tickTime(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The command name, field 2, may hold spaces; the fields after it start
	// after its closing parenthesis, with field 3.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, errors.New("malformed /proc/<pid>/stat")
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 13 {
		return 0, errors.New("short /proc/<pid>/stat")
	}
	var ticks int64
	for _, s := range f[11:13] { // utime (field 14) and stime (field 15)
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("parsing /proc/<pid>/stat: %w", err)
		}
		ticks += n
	}
	return time.Duration(ticks) * time.Second / clockTicks, nil
}

// rss returns the manager's resident memory in bytes (VmRSS).
func (p *managerProc) rss() (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", p.cmd.Process.Pid))
	if err != nil {
		return 0, err
	}
	for line := range strings.Lines(string(b)) {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			if err != nil {
				return 0, fmt.Errorf("parsing VmRSS: %w", err)
			}
			return kb << 10, nil
		}
	}
	return 0, errors.New("no VmRSS in /proc/<pid>/status")
}
