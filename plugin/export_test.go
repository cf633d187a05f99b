package plugin

import "time"

// SetGrace shortens s's Close grace period (gracePeriod) so tests can
// exercise the forced stop without waiting the production default. Call it
// before Close.
func (s *Server) SetGrace(d time.Duration) { s.grace = d }
