package fastpath

import (
	"errors"
	"sync"
	"time"

	"github.com/kl-egress/kl/netns"
	"github.com/ti-mo/conntrack"
	"github.com/ti-mo/netfilter"
	"golang.org/x/sys/unix"
)

// readBuffer is the conntrack event socket's receive buffer: a burst of new connections
// must not overrun it (an overrun loses events, counted as lost).
const readBuffer = 8 << 20

// watch starts the pod's conntrack watcher: a netlink socket opened inside the pod netns
// and subscribed to NEW and DESTROY events before watch returns (so the pod's first
// connection is seen). A socket error (an overrun) is counted and the socket reopened;
// the watcher ends when stop is called or the netns is gone.
func (m *Manager) watch(po *pod) (stop func(), err error) {
	sub, err := subscribe(po.Netns)
	if err != nil {
		return nil, err
	}
	quit := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			err := m.listen(po, sub, quit)
			if err == nil {
				return // stopped
			}
			m.lost(po, 1)
			m.log.Warn("conntrack events lost, reopening", "pod", po.ID, "err", err)
			for tries := 0; ; tries++ {
				select {
				case <-quit:
					return
				case <-time.After(50 * time.Millisecond):
				}
				if sub, err = subscribe(po.Netns); err == nil {
					break
				}
				if tries >= 20 {
					m.log.Warn("conntrack watcher gave up", "pod", po.ID, "err", err)
					return
				}
			}
		}
	}()
	return func() { close(quit); wg.Wait() }, nil
}

// subscription is a conntrack socket in a pod netns with its event worker running.
type subscription struct {
	c      *conntrack.Conn
	events chan conntrack.Event
	errs   chan error
}

func subscribe(nsPath string) (*subscription, error) {
	var c *conntrack.Conn
	err := netns.Do(nsPath, func() error {
		var err error
		c, err = conntrack.Dial(nil)
		return err
	})
	if err != nil {
		return nil, err
	}
	if err := c.SetReadBuffer(readBuffer); err != nil {
		c.Close()
		return nil, err
	}
	s := &subscription{c: c, events: make(chan conntrack.Event, 1024)}
	s.errs, err = c.Listen(s.events, 1, []netfilter.NetlinkGroup{netfilter.GroupCTNew, netfilter.GroupCTDestroy})
	if err != nil {
		c.Close()
		return nil, err
	}
	return s, nil
}

// listen reads events until quit (nil) or a socket error (returned). It closes the
// subscription.
func (m *Manager) listen(po *pod, sub *subscription, quit <-chan struct{}) error {
	c, events, errs := sub.c, sub.events, sub.errs
	// Closing the socket ends the worker; it may be blocked handing over an event, so
	// keep draining until it is gone.
	shutdown := func() {
		done := make(chan struct{})
		go func() {
			for {
				select {
				case <-events:
				case <-errs:
				case <-done:
					return
				}
			}
		}()
		c.Close()
		close(done)
	}
	for {
		select {
		case <-quit:
			shutdown()
			return nil
		case err := <-errs:
			shutdown()
			if err == nil {
				err = errors.New("conntrack worker ended")
			}
			return err
		case ev := <-events:
			if ev.Flow == nil || ev.Flow.TupleOrig.Proto.Protocol != unix.IPPROTO_TCP {
				continue
			}
			if _, _, ok := splitMark(ev.Flow.Mark); !ok {
				continue
			}
			switch ev.Type {
			case conntrack.EventNew:
				if m.record(po, ev.Flow.Mark) {
					po.markSeen(ev.Flow.ID)
				}
			case conntrack.EventDestroy:
				// The kernel reports a connection created and destroyed before its NEW
				// event went out as one DESTROY event: record it now, once.
				if !po.forget(ev.Flow.ID) && m.record(po, ev.Flow.Mark) {
					m.late(po)
				}
			}
		}
	}
}

// maxSeen bounds the ids of live kernel-decided connections a watcher remembers (their
// DESTROY events normally remove them; a lost one must not grow the set for ever).
const maxSeen = 1 << 20

func (po *pod) markSeen(id uint32) {
	if po.seen == nil || len(po.seen) >= maxSeen {
		po.seen = map[uint32]struct{}{}
	}
	po.seen[id] = struct{}{}
}

// forget reports whether id was recorded at NEW, and forgets it.
func (po *pod) forget(id uint32) bool {
	if _, ok := po.seen[id]; ok {
		delete(po.seen, id)
		return true
	}
	return false
}
