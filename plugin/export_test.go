package plugin

import "time"

// SetGracePeriod shortens Close's grace period so tests can exercise the
// forced stop without waiting the production default. It returns a function
// restoring the previous value.
func SetGracePeriod(d time.Duration) (restore func()) {
	old := gracePeriod
	gracePeriod = d
	return func() { gracePeriod = old }
}
