// Package smallfile reads the small files an operator names in a
// configuration (plugd's --config, a kubeconfig and the certificates it
// names) without trusting the name: only a regular file is read, of at
// most a given size, and opening it never blocks.
package smallfile

import (
	"fmt"
	"io"
	"io/fs"
	"os"
	"syscall"
)

// Error is Read's refusal of a file that is not a regular file, or is
// larger than the bound.
type Error struct {
	Path string
	// Kind says what the file is ("a device", "a named pipe (FIFO)"),
	// when it is not a regular file; empty when it is too large.
	Kind string
	// Max is the bound, when the file is too large.
	Max int
}

func (e *Error) Error() string {
	if e.Kind != "" {
		return fmt.Sprintf("%s is %s, not a regular file", e.Path, e.Kind)
	}
	return fmt.Sprintf("%s is larger than %s", e.Path, Size(e.Max))
}

// Read returns the contents of the regular file at path, of at most max
// bytes. Anything else is refused at once, with an *Error: a named pipe
// (opening one waits for a writer, reading it for what the writer sends),
// a device such as /dev/zero (which never ends), a directory, a socket;
// and a file larger than max, also one that grows past it while it is
// read. Other errors are the file system's, naming the path.
func Read(path string, max int) ([]byte, error) {
	// O_NONBLOCK: opening a FIFO waits for a writer otherwise. It changes
	// nothing for a regular file.
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		return nil, &Error{Path: path, Kind: kind(fi.Mode())}
	}
	if fi.Size() > int64(max) {
		return nil, &Error{Path: path, Max: max}
	}
	b, err := io.ReadAll(io.LimitReader(f, int64(max)+1))
	if err != nil {
		return nil, err
	}
	if len(b) > max {
		return nil, &Error{Path: path, Max: max}
	}
	return b, nil
}

// kind names what a file that is not a regular file is.
func kind(m fs.FileMode) string {
	switch {
	case m.IsDir():
		return "a directory"
	case m&fs.ModeNamedPipe != 0:
		return "a named pipe (FIFO)"
	case m&fs.ModeSocket != 0:
		return "a socket"
	case m&fs.ModeDevice != 0:
		return "a device"
	}
	return "a special file"
}

// Size writes a bound for people: "1 MiB", "64 KiB", "100 bytes".
func Size(n int) string {
	switch {
	case n >= 1<<20 && n%(1<<20) == 0:
		return fmt.Sprintf("%d MiB", n>>20)
	case n >= 1<<10 && n%(1<<10) == 0:
		return fmt.Sprintf("%d KiB", n>>10)
	}
	return fmt.Sprintf("%d bytes", n)
}
