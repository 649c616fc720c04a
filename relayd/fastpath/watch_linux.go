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
// subscribed to NEW events. A socket error (an overrun) is counted and the socket
// reopened; the watcher ends when stop is called or the netns is gone.
func (m *Manager) watch(po *pod) (stop func(), err error) {
	c, err := dialIn(po.Netns)
	if err != nil {
		return nil, err
	}
	quit := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			err := m.listen(po, c, quit)
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
				if c, err = dialIn(po.Netns); err == nil {
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

func dialIn(nsPath string) (*conntrack.Conn, error) {
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
	return c, nil
}

// listen reads NEW events until quit (nil) or a socket error (returned). It closes c.
func (m *Manager) listen(po *pod, c *conntrack.Conn, quit <-chan struct{}) error {
	events := make(chan conntrack.Event, 1024)
	errs, err := c.Listen(events, 1, []netfilter.NetlinkGroup{netfilter.GroupCTNew})
	if err != nil {
		c.Close()
		return err
	}
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
			if ev.Type != conntrack.EventNew || ev.Flow == nil {
				continue
			}
			if ev.Flow.TupleOrig.Proto.Protocol != unix.IPPROTO_TCP {
				continue
			}
			m.record(po, ev.Flow.Mark)
		}
	}
}
