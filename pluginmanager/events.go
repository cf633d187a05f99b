package pluginmanager

import (
	"sync"
	"time"
)

// EventType says what happened to a socket.
type EventType string

// The events a Subscription delivers.
const (
	EventDiscovered   EventType = "Discovered"   // a new socket file appeared (or an old one was replaced)
	EventRegistered   EventType = "Registered"   // the handler accepted the plugin and it was told so
	EventFailed       EventType = "Failed"       // an attempt failed; it will be retried
	EventRejected     EventType = "Rejected"     // refused until the socket changes
	EventDeregistered EventType = "Deregistered" // the handler let the plugin go (State: the socket's state then, none if its file is gone; Error: the handler's failure)
	EventUnhealthy    EventType = "Unhealthy"    // a registered plugin stopped answering, or its endpoint went (State says whether it stays registered meanwhile)
	EventHealthy      EventType = "Healthy"      // an Unhealthy plugin answers again, still registered
	EventAnswering    EventType = "Answering"    // observe mode: the plugin answers (again)
	EventNotAnswering EventType = "NotAnswering" // observe mode: the plugin stopped answering (or is Stale)
	EventLooked       EventType = "Looked"       // observe mode: a look found the plugin as the last one did
	EventRemoved      EventType = "Removed"      // the socket file is gone and forgotten (State: none)
	EventLost         EventType = "Lost"         // this subscriber fell behind; Missed events were dropped
)

// Event is one change, in the order the manager made it.
type Event struct {
	// Seq increases by one for every event the manager publishes, so a
	// subscriber can tell the order and see gaps.
	Seq    uint64    `json:"seq"`
	Time   time.Time `json:"time"`
	Type   EventType `json:"type"`
	Plugin Plugin    `json:"plugin"`
	// State is the socket's state once the change was made: a plugin
	// deregistered at the end of its grace period is Failed; one whose
	// socket file went has none (and Removed follows).
	State     State     `json:"state,omitempty"`
	Reason    Reason    `json:"reason,omitempty"`
	Error     string    `json:"error,omitempty"`
	Attempt   int       `json:"attempt,omitempty"`
	NextRetry time.Time `json:"nextRetry,omitzero"`
	// Missed is set on EventLost: how many events this subscriber did not get;
	// the Seq of an EventLost is that of the last one missed.
	Missed int `json:"missed,omitempty"`
}

// Subscription is a stream of events. Read it from Events; close it when done.
type Subscription struct {
	c      chan Event
	b      *broker
	missed int  // guarded by b.mu
	closed bool // guarded by b.mu
}

// Events returns the channel events arrive on. It is closed by Close and when
// the manager's Run returns.
func (s *Subscription) Events() <-chan Event { return s.c }

// Close stops the subscription and closes its channel. It may be called more
// than once and from any goroutine.
func (s *Subscription) Close() {
	s.b.mu.Lock()
	defer s.b.mu.Unlock()
	s.b.closeLocked(s)
}

// broker fans events out to subscribers without ever waiting for one: a
// subscriber whose buffer is full loses the event and is told how many it lost
// as soon as it has room again.
//
// It also keeps the most recent events, so that a new subscriber can start
// with what just happened, with nothing missing or doubled between the replay
// and the live events.
type broker struct {
	mu      sync.Mutex
	seq     uint64
	subs    map[*Subscription]struct{}
	buffer  int
	history []Event // ring of the last len(history) events; history[seq%len] is event seq
	done    bool    // Run has returned: new subscriptions start closed
}

func newBroker(buffer, history int) *broker {
	return &broker{subs: make(map[*Subscription]struct{}), buffer: buffer, history: make([]Event, history)}
}

// subscribe starts a subscription whose channel first holds up to replay of
// the most recent events.
func (b *broker) subscribe(replay int) *Subscription {
	b.mu.Lock()
	defer b.mu.Unlock()
	replay = min(replay, len(b.history), int(b.seq))
	s := &Subscription{c: make(chan Event, b.buffer+replay), b: b}
	for seq := b.seq - uint64(replay) + 1; seq <= b.seq; seq++ {
		s.c <- b.history[seq%uint64(len(b.history))]
	}
	if b.done {
		s.closed = true
		close(s.c)
		return s
	}
	b.subs[s] = struct{}{}
	return s
}

func (b *broker) publish(ev Event) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.seq++
	ev.Seq = b.seq
	if len(b.history) > 0 {
		b.history[b.seq%uint64(len(b.history))] = ev
	}
	for s := range b.subs {
		if s.missed > 0 {
			select {
			case s.c <- Event{Seq: ev.Seq - 1, Time: ev.Time, Type: EventLost, Missed: s.missed}:
				s.missed = 0
			default:
				s.missed++
				continue
			}
		}
		select {
		case s.c <- ev:
		default:
			s.missed++
		}
	}
}

func (b *broker) closeLocked(s *Subscription) {
	if s.closed {
		return
	}
	s.closed = true
	delete(b.subs, s)
	close(s.c)
}

// shutdown closes every subscription; later ones start closed.
func (b *broker) shutdown() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.done = true
	for s := range b.subs {
		b.closeLocked(s)
	}
}
