package pluginmanager

import "sync"

// queue hands socket paths to workers: first in, first out, each path at most
// once in the queue, and never to two workers at once. A path added while a
// worker has it is handed out again when that worker is done, so no change is
// lost and none is worked on twice concurrently.
type queue struct {
	mu         sync.Mutex
	cond       *sync.Cond
	items      []string
	queued     map[string]bool // in items, or to be put back when its worker is done
	processing map[string]bool
	closed     bool
}

func newQueue() *queue {
	q := &queue{queued: make(map[string]bool), processing: make(map[string]bool)}
	q.cond = sync.NewCond(&q.mu)
	return q
}

// add asks for path to be looked at again. It never blocks.
func (q *queue) add(path string) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed || q.queued[path] {
		return
	}
	q.queued[path] = true
	if q.processing[path] {
		return // done puts it back
	}
	q.items = append(q.items, path)
	q.cond.Signal()
}

// get blocks until a path is ready or the queue is closed (ok false).
func (q *queue) get() (path string, ok bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for len(q.items) == 0 && !q.closed {
		q.cond.Wait()
	}
	if q.closed {
		return "", false
	}
	path = q.items[0]
	q.items[0] = ""
	q.items = q.items[1:]
	delete(q.queued, path)
	q.processing[path] = true
	return path, true
}

// done releases path; if it was added meanwhile, it is queued again.
func (q *queue) done(path string) {
	q.mu.Lock()
	defer q.mu.Unlock()
	delete(q.processing, path)
	if q.queued[path] && !q.closed {
		q.items = append(q.items, path)
		q.cond.Signal()
	}
}

// close wakes every waiting worker; get returns false from then on.
func (q *queue) close() {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.closed = true
	q.cond.Broadcast()
}
