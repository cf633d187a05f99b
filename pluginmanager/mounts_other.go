//go:build !linux

package pluginmanager

import "log/slog"

// watchMounts does nothing here: only Linux says when its mount table
// changes. A mount over a directory of sockets, or its umount, is seen at
// the next resync (Options.ResyncInterval, 30 s by default).
func watchMounts(string, func(), *slog.Logger) (stop func(), err error) {
	return func() {}, nil
}
