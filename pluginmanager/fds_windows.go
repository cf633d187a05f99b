package pluginmanager

// openFileLimit is 0 on Windows: a process's handles are limited only by
// memory.
func openFileLimit() int { return 0 }

// openFiles is unknown on Windows.
func openFiles() int { return -1 }
