package fastpath

import (
	"encoding/binary"
	"fmt"
	"sync"
	"time"
	"unsafe"

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
//   - Events are read in batches: the sockets sit in a private epoll set that no
//     thread blocks on, polled on a timer (see poller), so a burst of connections costs
//     a wake-up per round, not one per connection (a context switch is the dearest part
//     of a short connection on a small machine). Records come at most pollIdle late,
//     and a socket is read to the end before it is closed (a pod's removal, the
//     daemon's shutdown), so the events queued meanwhile still become records.
//   - A drain reads up to recvBatch events per system call (recvmmsg(2)): netlink hands
//     out one event per datagram, and a system call per event was half of what the
//     watcher cost (kl-relayd's CPU per kernel-decided connection: 11 µs before, 6 after).
//   - Parsing reads the three attributes it needs in place, without allocating.

// readBuffer is the event socket's receive buffer (SO_RCVBUFFORCE, root): several
// batches of a connection burst.
const readBuffer = 8 << 20

// eventBatch is how long the reader lets events gather after draining the socket. Each
// round wakes the daemon, several thread switches in Go's scheduler: polling every 10 ms,
// kl-relayd made about 950 context switches a second under the bench's connection loop;
// every 50 ms, about 250. Records come later for it (see pollIdle), never fewer.
const eventBatch = 50 * time.Millisecond

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

// pollBusy and pollIdle bound how often the poller looks at the pods' sockets: every
// pollBusy while events come, backing off to pollIdle when none do.
const (
	pollBusy = eventBatch
	pollIdle = 200 * time.Millisecond
)

// watch starts watching the pod's conntrack events: a netlink socket opened inside the
// pod netns, subscribed before watch returns (so the pod's first connection is seen) and
// added to the manager's poller. A socket error other than an overrun is counted as
// lost and the socket reopened. stop reads what is queued, removes the socket and closes
// it.
func (m *Manager) watch(po *pod) (stop func(), err error) {
	var st unix.Stat_t
	if err := unix.Stat(po.Netns, &st); err != nil {
		return nil, fmt.Errorf("conntrack event socket: %w", err)
	}
	po.nsDev, po.nsIno = st.Dev, st.Ino
	fd, err := openEvents(po.Netns)
	if err != nil {
		return nil, err
	}
	p, err := m.poller()
	if err != nil {
		unix.Close(fd)
		return nil, err
	}
	if err := p.add(po, fd); err != nil {
		return nil, err
	}
	return func() { p.remove(po) }, nil
}

// rewatch opens po's event socket again if it has none: its watcher gave up reopening a
// broken one. A pod added again keeps its watcher, so this is where it comes back.
func (m *Manager) rewatch(po *pod) error {
	p, err := m.poller()
	if err != nil {
		return err
	}
	if p.has(po) {
		return nil
	}
	return m.reopen(p, po)
}

// reopen opens po's event socket in the netns under po's path and watches it, unless po
// is (or meanwhile gets) removed.
func (m *Manager) reopen(p *poller, po *pod) error {
	path, ok := m.registered(po)
	if !ok {
		return nil
	}
	fd, err := openEvents(path)
	if err != nil {
		return err
	}
	if err := p.add(po, fd); err != nil {
		return err
	}
	if _, ok := m.registered(po); !ok {
		p.remove(po) // removed meanwhile: its drop found no socket to stop
	}
	return nil
}

// inNetns reports whether path names the netns po's watcher reads: po's own path still
// does unless the sandbox was recreated under the same id and path (another netns);
// another path does when it is the same netns (a move).
func (po *pod) inNetns(path string) bool {
	var st unix.Stat_t
	return po.stop != nil && unix.Stat(path, &st) == nil && st.Dev == po.nsDev && st.Ino == po.nsIno
}

// reachable says whether path names a netns (a bind mount of one, or /proc/PID/ns/net):
// not when it is gone, or is the file a bind mount was on once unmounted.
func reachable(path string) error {
	var fs unix.Statfs_t
	if err := unix.Statfs(path, &fs); err != nil {
		return fmt.Errorf("netns %s: %w", path, err)
	}
	if fs.Type != unix.NSFS_MAGIC {
		return fmt.Errorf("netns %s: not a namespace file (gone)", path)
	}
	return nil
}

// poller returns the manager's poller, starting it on first use.
func (m *Manager) poller() (*poller, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.poll != nil {
		return m.poll, nil
	}
	ep, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("conntrack event poller: %w", err)
	}
	p := &poller{m: m, ep: ep, socks: map[int32]*watched{}, buf: newRecvBuf(), quit: make(chan struct{}), done: make(chan struct{})}
	go p.run()
	m.poll = p
	return p, nil
}

// closePoller stops the poller (after every pod was removed).
func (m *Manager) closePoller() {
	m.mu.Lock()
	p := m.poll
	m.poll = nil
	m.mu.Unlock()
	if p != nil {
		close(p.quit)
		<-p.done
	}
}

// poller reads every pod's event socket on a timer. The sockets sit in a private epoll
// set that no thread ever blocks on: an event queued to a socket wakes nobody. Every
// pollBusy (pollIdle when idle) one epoll_wait without timeout says which sockets have
// events, and those are drained. So a burst of connections costs the daemon one
// wake-up per round, however many events the kernel queues meanwhile (a socket in Go's
// own poller would wake the process at every event, a context switch per connection),
// and an idle node costs a timer tick.
type poller struct {
	m     *Manager
	ep    int
	mu    sync.Mutex // the epoll set, socks and buf; held by a round
	socks map[int32]*watched
	buf   *recvBuf
	quit  chan struct{}
	done  chan struct{}
}

type watched struct {
	po *pod
	fd int
}

// add watches fd as po's socket, unless po has one already (a reopen after a socket
// error and a rewatch raced): then fd is closed, so no event is read twice.
func (p *poller) add(po *pod, fd int) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.hasLocked(po) {
		unix.Close(fd)
		return nil
	}
	if err := unix.EpollCtl(p.ep, unix.EPOLL_CTL_ADD, fd, &unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(fd)}); err != nil {
		unix.Close(fd)
		return fmt.Errorf("conntrack event poller: %w", err)
	}
	p.socks[int32(fd)] = &watched{po: po, fd: fd}
	return nil
}

func (p *poller) has(po *pod) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.hasLocked(po)
}

func (p *poller) hasLocked(po *pod) bool {
	for _, w := range p.socks {
		if w.po == po {
			return true
		}
	}
	return false
}

func (p *poller) remove(po *pod) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, w := range p.socks {
		if w.po == po {
			p.finish(w)
		}
	}
}

// finish reads what is queued in w's socket, then closes it (p.mu held). Flows the kernel
// decided up to now get their records; closing at once would drop up to a poll round of
// them at every removal and at shutdown.
func (p *poller) finish(w *watched) {
	if _, err := p.drain(w); err != nil {
		p.m.lost(w.po, 1)
	}
	p.closeSock(w)
}

func (p *poller) closeSock(w *watched) {
	_ = unix.EpollCtl(p.ep, unix.EPOLL_CTL_DEL, w.fd, nil)
	unix.Close(w.fd)
	delete(p.socks, int32(w.fd))
}

func (p *poller) run() {
	defer close(p.done)
	evs := make([]unix.EpollEvent, 128)
	wait := pollIdle
	t := time.NewTimer(wait)
	defer t.Stop()
	for {
		select {
		case <-p.quit:
			p.mu.Lock()
			for _, w := range p.socks {
				p.finish(w)
			}
			unix.Close(p.ep)
			p.mu.Unlock()
			return
		case <-t.C:
		}
		if p.round(evs) > 0 {
			wait = pollBusy
		} else {
			wait = min(2*wait, pollIdle)
		}
		t.Reset(wait)
	}
}

// round drains every socket with events queued and returns how many messages it read.
func (p *poller) round(evs []unix.EpollEvent) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	read := 0
	for {
		n, err := unix.EpollWait(p.ep, evs, 0)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			p.m.log.Error("conntrack event poller", "err", err)
			return read
		}
		for _, ev := range evs[:n] {
			if w := p.socks[ev.Fd]; w != nil {
				got, err := p.drain(w)
				read += got
				if err != nil {
					p.fail(w, err)
				}
			}
		}
		if n < len(evs) {
			return read
		}
	}
}

// drain reads w's socket until it is empty (or a batch comes back short: what arrives
// meanwhile waits for the next round) and returns how many messages it read, and the
// socket's error if it broke (p.mu held).
func (p *poller) drain(w *watched) (int, error) {
	buf, read := p.buf, 0
	for {
		n, err := buf.recv(w.fd)
		switch err {
		case nil:
			read += n
			for i := range n {
				msg, truncated := buf.msg(i)
				if truncated {
					// An event larger than a slot (none is near): its record is lost.
					p.m.lost(w.po, 1)
					continue
				}
				p.m.handle(w.po, msg)
			}
			if n < recvBatch {
				return read, nil
			}
			continue
		case unix.EAGAIN:
			return read, nil
		case unix.EINTR:
			continue
		case unix.ENOBUFS:
			// Overrun: the kernel keeps the undelivered NEW events and sends them again
			// (reliable delivery); nothing is lost, only late. Count it.
			read++
			p.m.overrun(w.po)
			continue
		}
		return read, err
	}
}

// recvBatch is how many events one recvmmsg(2) may return; recvSlot bounds one event
// (a conntrack event is a few hundred bytes).
const (
	recvBatch = 64
	recvSlot  = 4096
)

// recvBuf is the poller's receive buffers: recvBatch slots of recvSlot bytes, each the
// one iovec of one message header.
type recvBuf struct {
	data []byte
	iov  [recvBatch]unix.Iovec
	hdrs [recvBatch]unix.Mmsghdr
}

func newRecvBuf() *recvBuf {
	b := &recvBuf{data: make([]byte, recvBatch*recvSlot)}
	for i := range b.hdrs {
		b.iov[i].Base = &b.data[i*recvSlot]
		b.iov[i].SetLen(recvSlot)
		b.hdrs[i].Hdr.Iov = &b.iov[i]
		b.hdrs[i].Hdr.SetIovlen(1)
	}
	return b
}

// recv reads up to recvBatch messages from fd without blocking.
func (b *recvBuf) recv(fd int) (int, error) {
	n, _, errno := unix.Syscall6(unix.SYS_RECVMMSG, uintptr(fd), uintptr(unsafe.Pointer(&b.hdrs[0])), recvBatch, unix.MSG_DONTWAIT, 0, 0)
	if errno != 0 {
		return 0, errno
	}
	return int(n), nil
}

// msg returns the i-th message of the last recv, and whether it was cut to fit its slot.
func (b *recvBuf) msg(i int) ([]byte, bool) {
	h := &b.hdrs[i]
	return b.data[i*recvSlot : i*recvSlot+int(h.Len)], h.Hdr.Flags&unix.MSG_TRUNC != 0
}

// fail closes a broken socket, counts it as lost and reopens it in the background (p.mu
// held).
func (p *poller) fail(w *watched, err error) {
	m, po := p.m, w.po
	m.lost(po, 1)
	m.log.Warn("conntrack events lost, reopening", "pod", po.ID, "err", err)
	p.closeSock(w)
	go func() {
		for tries := 0; tries <= 20; tries++ {
			time.Sleep(50 * time.Millisecond)
			if m.reopen(p, po) == nil {
				return
			}
		}
		m.log.Warn("conntrack watcher gave up", "pod", po.ID)
	}()
}

// openEvents opens the event socket in nsPath, filtered and subscribed, nonblocking.
func openEvents(nsPath string) (int, error) {
	var fd int
	err := netns.Do(nsPath, func() error {
		var err error
		fd, err = unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, unix.NETLINK_NETFILTER)
		return err
	})
	if err != nil {
		return -1, fmt.Errorf("conntrack event socket: %w", err)
	}
	if err := setupEvents(fd); err != nil {
		unix.Close(fd)
		return -1, err
	}
	return fd, nil
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
