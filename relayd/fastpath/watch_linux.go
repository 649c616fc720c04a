package fastpath

import (
	"encoding/binary"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/kl-egress/kl/netns"
	"golang.org/x/sys/unix"
)

// The watcher reads conntrack events from a raw NETLINK_NETFILTER socket in the pod
// netns. It is built to cost the pod's connections as little as possible:
//
//   - The kernel sends only what is needed: the nft rule that decides a flow sets its
//     conntrack event mask to NEW (netns.SetMark, netns.MapMark), so a kernel-decided
//     connection makes exactly one event, and a socket filter (classic BPF on the
//     CTA_MARK attribute, as libnetfilter_conntrack's nfct_filter does) drops every
//     event whose mark is not a kernel decision before it is queued to the socket.
//   - Delivery is reliable (NETLINK_BROADCAST_ERROR): when the socket is full, the
//     kernel keeps the NEW event as missed and sends it again with the connection's next
//     event, at the latest in its DESTROY event (retried until delivered). So an overrun
//     delays records but loses none; such a DESTROY is the connection's only message
//     and is recorded like a NEW one.
//   - Events are read in batches: after draining the socket the reader waits
//     eventBatch before looking again, so a burst of connections costs a wake-up per
//     batch, not one per connection (a context switch is the dearest part of a short
//     connection on a small machine). An idle pod's first event is read at once.
//   - Parsing reads the three attributes it needs in place, without allocating.

// readBuffer is the event socket's receive buffer (SO_RCVBUFFORCE, root): several
// batches of a connection burst.
const readBuffer = 8 << 20

// eventBatch is how long the reader lets events gather after draining the socket.
const eventBatch = 10 * time.Millisecond

// Netlink constants of ctnetlink (linux/netfilter/nfnetlink_conntrack.h).
const (
	nfnlSubsysCTNetlink = 1
	ipctnlMsgCtNew      = 0
	ipctnlMsgCtDelete   = 2
	nfnlgrpCTNew        = 1 // NFNLGRP_CONNTRACK_NEW
	nfnlgrpCTDestroy    = 3 // NFNLGRP_CONNTRACK_DESTROY
	ctaTupleOrig        = 1
	ctaTupleProto       = 2
	ctaProtoNum         = 1
	ctaMark             = 8
	ctaID               = 12
	nlaTypeMask         = 0x3fff // ^(NLA_F_NESTED | NLA_F_NET_BYTEORDER)
	nfgenHdrLen         = 4      // struct nfgenmsg
	// BPF ancillary load of a netlink attribute's offset (linux/filter.h: SKF_AD_OFF is
	// -0x1000, SKF_AD_NLATTR 12), as a uint32 load offset.
	skfAdOff    = 0xfffff000
	skfAdNlattr = 12
)

// watch starts the pod's conntrack watcher: a netlink socket opened inside the pod netns
// and subscribed before watch returns (so the pod's first connection is seen). A socket
// error other than an overrun is counted as lost and the socket reopened; the watcher
// ends when stop is called or the netns is gone.
func (m *Manager) watch(po *pod) (stop func(), err error) {
	s, err := openEvents(po.Netns)
	if err != nil {
		return nil, err
	}
	quit := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			err := m.listen(po, s, quit)
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
				if s, err = openEvents(po.Netns); err == nil {
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

// events is a pod netns's conntrack event socket.
type events struct {
	f  *os.File // nonblocking, in the runtime poller; Close wakes a blocked read
	rc interface {
		Read(func(fd uintptr) bool) error
	}
}

// openEvents opens the event socket in nsPath, filtered and subscribed.
func openEvents(nsPath string) (*events, error) {
	var fd int
	err := netns.Do(nsPath, func() error {
		var err error
		fd, err = unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, unix.NETLINK_NETFILTER)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("conntrack event socket: %w", err)
	}
	if err := setupEvents(fd); err != nil {
		unix.Close(fd)
		return nil, err
	}
	f := os.NewFile(uintptr(fd), "conntrack-events")
	rc, err := f.SyscallConn()
	if err != nil {
		f.Close()
		return nil, err
	}
	return &events{f: f, rc: rc}, nil
}

func setupEvents(fd int) error {
	if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, readBuffer); err != nil {
		if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUF, readBuffer); err != nil {
			return fmt.Errorf("conntrack event socket buffer: %w", err)
		}
	}
	if err := unix.SetsockoptInt(fd, unix.SOL_NETLINK, unix.NETLINK_BROADCAST_ERROR, 1); err != nil {
		return fmt.Errorf("conntrack event socket: reliable delivery: %w", err)
	}
	prog := markFilter()
	if err := unix.SetsockoptSockFprog(fd, unix.SOL_SOCKET, unix.SO_ATTACH_FILTER, &unix.SockFprog{Len: uint16(len(prog)), Filter: &prog[0]}); err != nil {
		return fmt.Errorf("conntrack event socket: filter: %w", err)
	}
	// Binding subscribes: the filter is in place before the first event can queue.
	sa := &unix.SockaddrNetlink{Family: unix.AF_NETLINK, Groups: 1<<(nfnlgrpCTNew-1) | 1<<(nfnlgrpCTDestroy-1)}
	if err := unix.Bind(fd, sa); err != nil {
		return fmt.Errorf("conntrack event socket: subscribe: %w", err)
	}
	return nil
}

// markFilter is the socket filter: accept a message whose CTA_MARK carries Tag, drop
// the rest. SKF_AD_NLATTR finds an attribute by type from offset A (here past the
// netlink and nfgenmsg headers) and leaves its offset in A, 0 when absent; the mark is
// big-endian, which is how BPF loads words.
func markFilter() []unix.SockFilter {
	const (
		drop   = 0
		accept = 0xffffffff
	)
	return []unix.SockFilter{
		{Code: unix.BPF_LD | unix.BPF_IMM, K: unix.SizeofNlMsghdr + nfgenHdrLen},
		{Code: unix.BPF_LDX | unix.BPF_IMM, K: ctaMark},
		{Code: unix.BPF_LD | unix.BPF_B | unix.BPF_ABS, K: skfAdOff + skfAdNlattr},
		{Code: unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K, K: 0, Jt: 3, Jf: 0},
		{Code: unix.BPF_MISC | unix.BPF_TAX},
		{Code: unix.BPF_LD | unix.BPF_W | unix.BPF_IND, K: unix.SizeofNlAttr},
		{Code: unix.BPF_ALU | unix.BPF_AND | unix.BPF_K, K: TagMask},
		{Code: unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K, K: Tag, Jt: 1, Jf: 0},
		{Code: unix.BPF_RET | unix.BPF_K, K: drop},
		{Code: unix.BPF_RET | unix.BPF_K, K: accept},
	}
}

// listen reads events until quit (nil) or a socket error (returned). It closes the
// socket.
func (m *Manager) listen(po *pod, s *events, quit <-chan struct{}) error {
	done := make(chan struct{})
	defer close(done)
	go func() {
		select {
		case <-quit:
		case <-done:
		}
		s.f.Close() // wakes a blocked read
	}()
	buf := make([]byte, 64<<10)
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	for {
		// Block until the socket is readable, then drain it.
		var rerr error
		read := 0
		err := s.rc.Read(func(fd uintptr) bool {
			for {
				n, _, err := unix.Recvfrom(int(fd), buf, unix.MSG_DONTWAIT)
				switch err {
				case nil:
					read++
					m.handle(po, buf[:n])
					continue
				case unix.EAGAIN:
					return read > 0 // empty: wait for the first message, or end the batch
				case unix.EINTR:
					continue
				case unix.ENOBUFS:
					// Overrun: the kernel keeps the undelivered NEW events and sends them
					// again (reliable delivery); nothing is lost, only late. Count it.
					read++
					m.overrun(po)
					continue
				}
				rerr = err
				return true
			}
		})
		select {
		case <-quit:
			return nil
		default:
		}
		if err == nil {
			err = rerr
		}
		if err != nil {
			return err
		}
		timer.Reset(eventBatch)
		select {
		case <-quit:
			timer.Stop()
			return nil
		case <-timer.C:
		}
	}
}

// handle parses one buffer of netlink messages and records the kernel decisions in it.
func (m *Manager) handle(po *pod, b []byte) {
	for len(b) >= unix.SizeofNlMsghdr {
		l := int(binary.NativeEndian.Uint32(b[0:4]))
		if l < unix.SizeofNlMsghdr || l > len(b) {
			return
		}
		typ := binary.NativeEndian.Uint16(b[4:6])
		msg := b[unix.SizeofNlMsghdr:l]
		b = b[min(nlAlign(l), len(b)):]
		if typ>>8 != nfnlSubsysCTNetlink || len(msg) < nfgenHdrLen {
			continue
		}
		kind := typ & 0xff
		if kind != ipctnlMsgCtNew && kind != ipctnlMsgCtDelete {
			continue
		}
		mark, proto, ok := parseCT(msg[nfgenHdrLen:])
		if !ok || proto != unix.IPPROTO_TCP {
			continue
		}
		if m.record(po, mark) && kind == ipctnlMsgCtDelete {
			// A kernel-decided connection sends DESTROY only when its NEW event could
			// not be delivered (its event mask is NEW): this is its one record.
			m.late(po)
		}
	}
}

// parseCT reads the mark and the transport protocol of a ctnetlink message's attributes.
func parseCT(b []byte) (mark uint32, proto uint8, ok bool) {
	var haveMark, haveProto bool
	for len(b) >= unix.SizeofNlAttr {
		l := int(binary.NativeEndian.Uint16(b[0:2]))
		if l < unix.SizeofNlAttr || l > len(b) {
			return 0, 0, false
		}
		typ := binary.NativeEndian.Uint16(b[2:4]) & nlaTypeMask
		v := b[unix.SizeofNlAttr:l]
		switch typ {
		case ctaMark:
			if len(v) != 4 {
				return 0, 0, false
			}
			mark, haveMark = binary.BigEndian.Uint32(v), true
		case ctaTupleOrig:
			if p, ok := nested(v, ctaTupleProto); ok {
				if n, ok := nested(p, ctaProtoNum); ok && len(n) >= 1 {
					proto, haveProto = n[0], true
				}
			}
		}
		b = b[min(nlAlign(l), len(b)):]
	}
	return mark, proto, haveMark && haveProto
}

// nested returns the value of the first attribute of type typ in b.
func nested(b []byte, typ uint16) ([]byte, bool) {
	for len(b) >= unix.SizeofNlAttr {
		l := int(binary.NativeEndian.Uint16(b[0:2]))
		if l < unix.SizeofNlAttr || l > len(b) {
			return nil, false
		}
		if binary.NativeEndian.Uint16(b[2:4])&nlaTypeMask == typ {
			return b[unix.SizeofNlAttr:l], true
		}
		b = b[min(nlAlign(l), len(b)):]
	}
	return nil, false
}

func nlAlign(n int) int { return (n + 3) &^ 3 }
