package daemon

// openFileLimit is not known here.
func openFileLimit() uint64 { return 0 }
