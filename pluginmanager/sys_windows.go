package pluginmanager

import (
	"errors"
	"io/fs"
	"net"
	"os"
	"syscall"
	"time"

	"golang.org/x/sys/windows"
)

// On Windows a unix socket is a file with the AF_UNIX reparse point, which
// Go reports as fs.ModeSocket, but not always: a socket made by a container
// in a bind-mounted directory shows as a plain file on the host (the
// kubelet's note, Windows 1809). As the kubelet does, a file that is not
// reported a socket is one if a connection to it succeeds; plugd dials once,
// briefly.
const socketProbeTimeout = 100 * time.Millisecond

// maybeSocket reports whether a file of this mode may be a unix socket,
// for statSocket to tell: anything but a directory or a symlink, which
// statSocket dials if it does not say it is one.
func maybeSocket(mode fs.FileMode) bool { return mode&(fs.ModeDir|fs.ModeSymlink) == 0 }

// socketFile reports whether the file at path, as fi describes it, is a
// unix socket.
func socketFile(path string, fi fs.FileInfo) bool {
	if fi.Mode()&fs.ModeSocket != 0 {
		return true
	}
	if fi.IsDir() || fi.Mode()&fs.ModeSymlink != 0 {
		return false
	}
	c, err := net.DialTimeout("unix", path, socketProbeTimeout)
	if err != nil {
		return false
	}
	c.Close()
	return true
}

// statSocket reports the identity of the unix socket at path, without
// following a symlink: the volume serial number and file index, and the
// creation time. ok is false if there is nothing there or it is not a
// socket.
func statSocket(path string) (id fileID, ok bool) {
	fi, err := os.Lstat(path)
	if err != nil || !socketFile(path, fi) {
		return fileID{}, false
	}
	p, err := windows.UTF16PtrFromString(path)
	if err != nil {
		return fileID{}, false
	}
	h, err := windows.CreateFile(p, 0, windows.FILE_SHARE_READ|windows.FILE_SHARE_WRITE|windows.FILE_SHARE_DELETE, nil,
		windows.OPEN_EXISTING, windows.FILE_FLAG_BACKUP_SEMANTICS|windows.FILE_FLAG_OPEN_REPARSE_POINT, 0)
	if err != nil {
		return fileID{}, false
	}
	defer windows.CloseHandle(h)
	var info windows.ByHandleFileInformation
	if err := windows.GetFileInformationByHandle(h, &info); err != nil {
		return fileID{}, false
	}
	born := time.Unix(0, info.CreationTime.Nanoseconds())
	return fileID{
		dev: uint64(info.VolumeSerialNumber),
		ino: uint64(info.FileIndexHigh)<<32 | uint64(info.FileIndexLow),
		sec: born.Unix(), nsec: int64(born.Nanosecond()),
	}, true
}

// refused reports whether err is a connection refused: a socket file that
// nobody listens on. Windows says so with its own error number.
func refused(err error) bool {
	return errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, windows.WSAECONNREFUSED)
}
