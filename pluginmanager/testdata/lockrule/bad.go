// Package lockrule breaks the rule of the registry's lock each way, for
// TestLockRuleCatches; the lines it must report say "caught".
package lockrule

import (
	"log/slog"
	"net"
	"os"
	"sync"
)

type registry struct{ mu sync.Mutex }

func (r *registry) lock()   { r.mu.Lock() }
func (r *registry) unlock() { r.mu.Unlock() }

type worker struct {
	reg *registry
	log *slog.Logger
}

func (w *worker) logs() {
	w.reg.lock()
	w.log.Info("under the lock") // caught
	w.reg.unlock()
	w.log.Info("after it")
}

func stat(path string) bool {
	_, err := os.Lstat(path)
	return err == nil // the Lstat above is caught: stat is called under the lock
}

func (w *worker) deferred(path string) {
	w.reg.lock()
	defer w.reg.unlock()
	os.Remove(path) // caught
}

func (w *worker) closes(conn net.Conn) {
	w.reg.lock()
	if conn != nil {
		conn.Close() // caught
	}
	w.reg.unlock()
}

func (w *worker) branches(path string, early bool) {
	w.reg.lock()
	if early {
		w.reg.unlock()
		w.log.Info("after it, in a branch")
		return
	}
	if stat(path) { // stat, entered with the lock held, is caught
		w.reg.unlock()
		return
	}
	w.reg.unlock()
}

// letsGo is entered with the lock held, and lets it go before it logs.
func (w *worker) letsGo() {
	w.reg.unlock()
	w.log.Info("after it")
}

func (w *worker) calls() {
	w.reg.lock()
	w.letsGo()
	go func() { w.log.Info("on another goroutine") }()
	w.reg.lock()
	w.reg.unlock()
}

func (w *worker) removeLocked(path string) {
	_, _ = os.Lstat(path) // caught: a Locked function is entered with the lock held
}
