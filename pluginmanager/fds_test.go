package pluginmanager

import (
	"fmt"
	"syscall"
	"testing"
	"time"
)

func TestFDReserve(t *testing.T) {
	open, counts := 0, 0
	f := &fdReserve{limit: func() int { return 1024 }, open: func() int { counts++; return open }}
	// Far from the limit: no count.
	if ok, changed, _, _ := f.admit(100); !ok || changed || counts != 0 {
		t.Fatalf("100 held of 1024: ok %v changed %v, %d counts; want held, no change, no count", ok, changed, counts)
	}
	// Near it: counted, and refused once the reserve (128) would be cut into.
	open = 890
	if ok, changed, n, _ := f.admit(800); !ok || changed || counts != 1 || n != 890 {
		t.Fatalf("890 open: ok %v changed %v open %d, %d counts; want held", ok, changed, n, counts)
	}
	if ok, changed, n, _ := f.admit(807); ok || !changed || n != 897 {
		t.Fatalf("897 open (estimated): ok %v changed %v open %d; want refused, a change", ok, changed, n)
	}
	if ok, changed, _, _ := f.admit(807); ok || changed {
		t.Fatalf("again: ok %v changed %v; want refused, no change", ok, changed)
	}
	// Room for the reserve again, but not twice: held, still short.
	open = 850
	for range fdRecount {
		f.admit(807)
	}
	if ok, changed, n, _ := f.admit(807); !ok || changed || n != 850 {
		t.Fatalf("850 open: ok %v changed %v open %d; want held, no change yet", ok, changed, n)
	}
	open = 800
	for range fdRecount {
		f.admit(807)
	}
	if !f.short {
		t.Fatal("short cleared before there was room")
	}
	open = 500
	changes := 0
	for range fdRecount + 1 { // counted again within these
		if ok, changed, _, _ := f.admit(807); !ok {
			t.Fatal("500 open: refused")
		} else if changed {
			changes++
		}
	}
	if changes != 1 || f.short {
		t.Fatalf("500 open: %d changes, short %v; want one change, to not short", changes, f.short)
	}

	// No limit known: always held.
	f = &fdReserve{limit: func() int { return 0 }, open: func() int { return 1 << 20 }}
	if ok, _, _, _ := f.admit(1 << 20); !ok {
		t.Fatal("no limit: refused")
	}

	// Dials out of descriptors: news once until a connection is made.
	err := fmt.Errorf("connect x: %w", syscall.EMFILE)
	if out, news := f.dialFailed(err); !out || !news {
		t.Fatalf("EMFILE: out %v news %v", out, news)
	}
	if out, news := f.dialFailed(fmt.Errorf("connect x: %w", syscall.ENFILE)); !out || news {
		t.Fatalf("ENFILE after EMFILE: out %v news %v", out, news)
	}
	if out, _ := f.dialFailed(fmt.Errorf("connect x: %w", syscall.ECONNREFUSED)); out {
		t.Fatal("ECONNREFUSED taken for a shortage of descriptors")
	}
	if !f.connected() || f.connected() {
		t.Fatal("connected: want true once after the shortage, then false")
	}
}

// The limit is read again at every admission near it, and far from it once
// its reading is fdLimitAge old.
func TestFDReserveLimitAge(t *testing.T) {
	limit, reads := 1024, 0
	now := time.Unix(1000, 0)
	f := &fdReserve{
		limit: func() int { reads++; return limit },
		open:  func() int { return 900 },
		now:   func() time.Time { return now },
	}
	for range 10 {
		f.admit(100)
	}
	if reads != 1 {
		t.Fatalf("far from the limit: %d reads in 10 admissions, want 1", reads)
	}
	// Lowered: heard once the reading is old.
	limit = 512
	if _, _, _, l := f.admit(100); l != 1024 {
		t.Fatalf("limit %d before the reading is old, want the 1024 read", l)
	}
	now = now.Add(fdLimitAge)
	if _, _, _, l := f.admit(100); l != 512 || reads != 2 {
		t.Fatalf("limit %d after %v (%d reads), want 512 read again", l, fdLimitAge, reads)
	}
	// Near it: read at every admission, so that a raise is heard at once.
	if ok, _, _, _ := f.admit(400); ok {
		t.Fatal("900 open of 512: held")
	}
	limit = 4096
	if ok, _, _, l := f.admit(400); !ok || l != 4096 {
		t.Fatalf("raised to 4096 near the limit: ok %v, limit %d; want held at 4096", ok, l)
	}
	if reads != 4 {
		t.Fatalf("%d reads, want 4 (one at each admission near the limit)", reads)
	}
}
