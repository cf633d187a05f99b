package pluginmanager

import (
	"maps"
	"sync"
	"sync/atomic"
	"time"
)

// handlerTable is the handlers added, by plugin type, with the settings of
// each. It is read on every registration without a lock (a map replaced,
// never changed, by AddHandler) and written rarely.
type handlerTable struct {
	mu sync.Mutex // serialises writers
	m  atomic.Pointer[map[string]*handlerEntry]
}

// handlerEntry is one handler and its settings, defaults applied.
type handlerEntry struct {
	h     Handler
	grace time.Duration // how long a plugin may be Unhealthy before it is deregistered
	probe time.Duration // probe interval; negative: no probes and no connection watch
}

func newHandlerTable() *handlerTable {
	t := &handlerTable{}
	t.m.Store(&map[string]*handlerEntry{})
	return t
}

// get returns the handler for typ, or nil.
func (t *handlerTable) get(typ string) *handlerEntry { return (*t.m.Load())[typ] }

// add adds he for typ, and reports false if typ has a handler already.
func (t *handlerTable) add(typ string, he *handlerEntry) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	old := *t.m.Load()
	if _, dup := old[typ]; dup {
		return false
	}
	m := maps.Clone(old)
	m[typ] = he
	t.m.Store(&m)
	return true
}

// types returns the types with a handler.
func (t *handlerTable) types() map[string]*handlerEntry { return *t.m.Load() }
