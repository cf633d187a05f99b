package daemon

import (
	"errors"
	"fmt"

	"golang.org/x/sys/unix"
)

// checkProcDir refuses a doctor.procDir that is not a procfs: the doctor
// believes what it reads there of running processes (who they are, which
// executable they run), and any other directory (/dev, a copy anyone
// could write) would be made up.
func checkProcDir(dir string) error {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return fmt.Errorf("cannot be read: %w", err)
	}
	if st.Type != unix.PROC_SUPER_MAGIC {
		return errors.New("is not a proc file system (mount -t proc; in a pod, mount the host's /proc there)")
	}
	return nil
}
