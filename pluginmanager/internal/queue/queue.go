// Package queue is the plugin manager's one owner of time: the socket paths
// to look at, now or at a given time, handed to workers one at a time per
// path.
//
// It is client-go's workqueue shape (a key is in the queue at most once and
// never with two workers at once; a key added while a worker has it is
// handed out again when that worker is done), with the delaying half made to
// fit the manager:
//
//   - A key has at most one scheduled time, and Schedule replaces it: the
//     last look at a socket decides when the next is due, so a retry or a
//     probe that is no longer wanted is not left to fire.
//   - Scheduling is synchronous: once Schedule returns, the time is armed,
//     so a test that advances a fake clock after seeing the result of a
//     look is exact (client-go hands the time to a goroutine first).
//   - Every key due at a wake-up is handed out at that wake-up, and nothing
//     wakes the queue but a due key: no heartbeat, so an idle manager stays
//     idle.
package queue

import (
	"container/heap"
	"sync"
	"time"

	"k8s.io/utils/clock"
)

// Queue is a work queue of keys with a time at which each is due. Make one
// with New, start Run in a goroutine, and end it with ShutDown. Its methods
// are safe for concurrent use.
type Queue struct {
	clock clock.WithDelayedExecution
	wake  chan struct{} // the timer fired: Run moves what is due to ready
	stop  chan struct{} // closed by ShutDown

	mu         sync.Mutex
	cond       *sync.Cond
	ready      []string
	dirty      map[string]bool // in ready, or to be put back when its worker is done
	processing map[string]bool
	waiting    timeHeap
	scheduled  map[string]*waiting // by key: its entry, in waiting or not (index -1)
	timer      clock.Timer         // armed for armedAt, the earliest waiting time
	armedAt    time.Time
	closed     bool
}

type waiting struct {
	key   string
	at    time.Time
	index int // in waiting
}

// New returns an empty queue on clk.
func New(clk clock.WithDelayedExecution) *Queue {
	q := &Queue{
		clock:      clk,
		wake:       make(chan struct{}, 1),
		stop:       make(chan struct{}),
		dirty:      make(map[string]bool),
		processing: make(map[string]bool),
		scheduled:  make(map[string]*waiting),
	}
	q.cond = sync.NewCond(&q.mu)
	return q
}

// Add makes key ready now. Its scheduled time, if any, stays. It never
// blocks.
func (q *Queue) Add(key string) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.addLocked(key)
}

func (q *Queue) addLocked(key string) {
	if q.readyLocked(key) {
		q.cond.Signal()
	}
}

// readyLocked marks key ready, and reports whether a worker can take it now.
func (q *Queue) readyLocked(key string) bool {
	if q.closed || q.dirty[key] {
		return false
	}
	q.dirty[key] = true
	if q.processing[key] {
		return false // Done puts it back
	}
	q.ready = append(q.ready, key)
	return true
}

// Schedule makes key due at at, replacing the time it was scheduled for; a
// zero at unschedules it, and a time not after now makes it ready at once.
func (q *Queue) Schedule(key string, at time.Time) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed {
		return
	}
	// A key's entry is kept while it is known, in the heap (index >= 0)
	// or not: a socket probed every interval costs no allocation each time.
	w := q.scheduled[key]
	switch {
	case at.IsZero():
		if w != nil {
			if w.index >= 0 {
				heap.Remove(&q.waiting, w.index)
			}
			delete(q.scheduled, key)
		}
	case !at.After(q.clock.Now()):
		if w != nil && w.index >= 0 {
			heap.Remove(&q.waiting, w.index)
		}
		q.addLocked(key)
	case w == nil:
		w = &waiting{key: key, at: at}
		heap.Push(&q.waiting, w)
		q.scheduled[key] = w
	case w.index >= 0:
		w.at = at
		heap.Fix(&q.waiting, w.index)
	default:
		w.at = at
		heap.Push(&q.waiting, w)
	}
	q.armLocked()
}

// Scheduled reports the time key is scheduled for, if it is.
func (q *Queue) Scheduled(key string) (time.Time, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if w := q.scheduled[key]; w != nil && w.index >= 0 {
		return w.at, true
	}
	return time.Time{}, false
}

// armLocked sets the timer for the earliest waiting time, if it is not set
// for it already.
func (q *Queue) armLocked() {
	if len(q.waiting) == 0 {
		if q.timer != nil {
			q.timer.Stop()
			q.timer, q.armedAt = nil, time.Time{}
		}
		return
	}
	next := q.waiting[0].at
	if q.timer != nil && q.armedAt.Equal(next) {
		return
	}
	if q.timer != nil {
		q.timer.Stop()
	}
	// The callback only pokes Run: a fake clock calls it with its own lock
	// held, where asking the clock the time would deadlock.
	q.timer = q.clock.AfterFunc(next.Sub(q.clock.Now()), q.poke)
	q.armedAt = next
}

func (q *Queue) poke() {
	select {
	case q.wake <- struct{}{}:
	default:
	}
}

// Run hands out scheduled keys as they fall due, until ShutDown.
func (q *Queue) Run() {
	for {
		select {
		case <-q.stop:
			return
		case <-q.wake:
		}
		q.mu.Lock()
		now := q.clock.Now()
		n := 0
		for len(q.waiting) > 0 && !q.waiting[0].at.After(now) {
			w := heap.Pop(&q.waiting).(*waiting)
			if q.readyLocked(w.key) {
				n++
			}
		}
		if !q.closed {
			q.armLocked() // for the next time now, unless a stale wake-up found it armed
		}
		q.mu.Unlock()
		// Workers are woken once the lock is free, not one by one while it
		// is held: a batch of probes wakes each worker once.
		switch {
		case n == 1:
			q.cond.Signal()
		case n > 1:
			q.cond.Broadcast()
		}
	}
}

// Len is how many keys are ready.
func (q *Queue) Len() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.ready)
}

// Get blocks until a key is ready, and hands it out; the caller calls Done
// with it when finished. ok is false once the queue is shut down.
func (q *Queue) Get() (key string, ok bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for len(q.ready) == 0 && !q.closed {
		q.cond.Wait()
	}
	if q.closed {
		return "", false
	}
	key = q.ready[0]
	q.ready[0] = ""
	q.ready = q.ready[1:]
	delete(q.dirty, key)
	q.processing[key] = true
	return key, true
}

// Done releases key; if it was added meanwhile, it is ready again.
func (q *Queue) Done(key string) {
	q.mu.Lock()
	defer q.mu.Unlock()
	delete(q.processing, key)
	if q.dirty[key] && !q.closed {
		q.ready = append(q.ready, key)
		q.cond.Signal()
	}
}

// ShutDown stops the queue: Get returns false from now on, Run returns, and
// nothing scheduled fires. It may be called more than once.
func (q *Queue) ShutDown() {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed {
		return
	}
	q.closed = true
	if q.timer != nil {
		q.timer.Stop()
		q.timer = nil
	}
	close(q.stop)
	q.cond.Broadcast()
}

// timeHeap orders waiting keys by time, the earliest first.
type timeHeap []*waiting

func (h timeHeap) Len() int           { return len(h) }
func (h timeHeap) Less(i, j int) bool { return h[i].at.Before(h[j].at) }
func (h timeHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].index = i
	h[j].index = j
}
func (h *timeHeap) Push(x any) {
	w := x.(*waiting)
	w.index = len(*h)
	*h = append(*h, w)
}
func (h *timeHeap) Pop() any {
	old := *h
	w := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	w.index = -1
	return w
}
