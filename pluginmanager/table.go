package pluginmanager

import (
	"maps"
	"sync"
	"sync/atomic"
	"time"

	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
)

// handlerTable is the handlers added, by plugin type, with the settings of
// each, and the observers. It is read on every registration without a lock
// (maps replaced, never changed, by AddHandler and AddObserver) and written
// rarely.
type handlerTable struct {
	mu        sync.Mutex // serialises writers
	m         atomic.Pointer[map[string]*handlerEntry]
	observers atomic.Pointer[map[string]Observer]
}

// handlerEntry is one handler and its settings, defaults applied.
type handlerEntry struct {
	h     Handler
	grace time.Duration // how long a plugin may be Unhealthy before it is deregistered; negative: for ever
	probe time.Duration // routine probe interval; not positive: none
	peers *Peers        // who may serve its plugins; nil: anyone
	// deregisterWithRegistrar: a plugin whose registration socket stops
	// answering is Unhealthy even while its endpoint serves.
	deregisterWithRegistrar bool
}

func newHandlerTable() *handlerTable {
	t := &handlerTable{}
	t.m.Store(&map[string]*handlerEntry{})
	t.observers.Store(&map[string]Observer{})
	return t
}

// get returns the handler for typ, or nil.
func (t *handlerTable) get(typ string) *handlerEntry { return (*t.m.Load())[typ] }

// add adds he for typ, and reports false if typ has a handler already.
func (t *handlerTable) add(typ string, he *handlerEntry) bool { return addTo(t, &t.m, typ, he) }

// observer returns the observer for typ, or nil.
func (t *handlerTable) observer(typ string) Observer { return (*t.observers.Load())[typ] }

// addObserver adds o for typ, and reports false if typ has one already.
func (t *handlerTable) addObserver(typ string, o Observer) bool {
	return addTo(t, &t.observers, typ, o)
}

// addTo puts v in a copy of the map m points to, unless it has typ already.
func addTo[V any](t *handlerTable, m *atomic.Pointer[map[string]V], typ string, v V) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	old := *m.Load()
	if _, dup := old[typ]; dup {
		return false
	}
	next := maps.Clone(old)
	next[typ] = v
	m.Store(&next)
	return true
}

// known reports whether typ has a handler or an observer.
func (t *handlerTable) known(typ string) bool {
	return t.get(typ) != nil || t.observer(typ) != nil
}

// types returns the types with a handler or an observer.
func (t *handlerTable) types() []string {
	var out []string
	for typ := range *t.m.Load() {
		out = append(out, typ)
	}
	for typ := range *t.observers.Load() {
		if t.get(typ) == nil {
			out = append(out, typ)
		}
	}
	return out
}

// label is the metric label for a plugin type: the type if it has a
// handler or an observer, or is one of the kubelet's (a fixed set, named
// even when observed), else "other", so that plugins cannot create series
// at will.
func (t *handlerTable) label(typ string) string {
	if t.known(typ) {
		return typ
	}
	switch typ {
	case registerapi.CSIPlugin, registerapi.DRAPlugin, registerapi.DevicePlugin:
		return typ
	}
	return otherType
}
