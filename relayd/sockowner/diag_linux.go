package sockowner

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"os"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/kl-egress/kl/netns"
)

// New returns a Finder on the real /proc and netlink.
func New() *Finder {
	return &Finder{Proc: os.DirFS("/proc"), SocketInode: SocketInode, NetnsInode: NetnsInode}
}

// NetnsInode returns the inode of the netns file at nsPath.
func NetnsInode(nsPath string) (uint64, error) {
	var st unix.Stat_t
	if err := unix.Stat(nsPath, &st); err != nil {
		return 0, fmt.Errorf("stat %s: %w", nsPath, err)
	}
	return st.Ino, nil
}

// SocketInode asks inet sock_diag (SOCK_DIAG_BY_FAMILY, an exact lookup, not a dump)
// inside the netns at nsPath for the TCP socket src -> dst and returns its inode.
func SocketInode(nsPath string, src, dst netip.AddrPort) (uint64, error) {
	var ino uint64
	err := netns.Do(nsPath, func() error {
		var err error
		ino, err = diag(src, dst)
		return err
	})
	return ino, err
}

// inet_diag_req_v2 and inet_diag_msg (linux/inet_diag.h).
const (
	sockDiagByFamily = 20
	reqLen           = 56
	msgInodeOff      = 4 + 48 + 16 // family..retrans, id, expires..uid
)

func putAddr(b []byte, a netip.Addr) {
	if a.Is4() {
		v := a.As4()
		copy(b, v[:])
		return
	}
	v := a.As16()
	copy(b, v[:])
}

func diag(src, dst netip.AddrPort) (uint64, error) {
	s, d := src.Addr().Unmap(), dst.Addr().Unmap()
	family := byte(unix.AF_INET6)
	if s.Is4() && d.Is4() {
		family = unix.AF_INET
	} else {
		s, d = netip.AddrFrom16(src.Addr().As16()), netip.AddrFrom16(dst.Addr().As16())
	}
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, unix.NETLINK_SOCK_DIAG)
	if err != nil {
		return 0, fmt.Errorf("sock_diag socket: %w", err)
	}
	defer unix.Close(fd)
	tv := unix.Timeval{Sec: 1}
	_ = unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv)

	msg := make([]byte, unix.NLMSG_HDRLEN+reqLen)
	ne := binary.NativeEndian
	ne.PutUint32(msg[0:], uint32(len(msg)))
	ne.PutUint16(msg[4:], sockDiagByFamily)
	ne.PutUint16(msg[6:], unix.NLM_F_REQUEST)
	ne.PutUint32(msg[8:], 1)
	r := msg[unix.NLMSG_HDRLEN:]
	r[0] = family
	r[1] = unix.IPPROTO_TCP
	ne.PutUint32(r[4:], 0xffffffff) // any state
	id := r[8:]
	binary.BigEndian.PutUint16(id[0:], src.Port())
	binary.BigEndian.PutUint16(id[2:], dst.Port())
	putAddr(id[4:20], s)
	putAddr(id[20:36], d)
	ne.PutUint32(id[40:], 0xffffffff) // INET_DIAG_NOCOOKIE
	ne.PutUint32(id[44:], 0xffffffff)
	if err := unix.Sendto(fd, msg, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return 0, fmt.Errorf("sock_diag send: %w", err)
	}
	buf := make([]byte, 8192)
	n, _, err := unix.Recvfrom(fd, buf, 0)
	if err != nil {
		return 0, fmt.Errorf("sock_diag receive: %w", err)
	}
	msgs, err := syscall.ParseNetlinkMessage(buf[:n])
	if err != nil {
		return 0, fmt.Errorf("sock_diag answer: %w", err)
	}
	for _, m := range msgs {
		switch m.Header.Type {
		case syscall.NLMSG_ERROR:
			if len(m.Data) >= 4 {
				if e := int32(ne.Uint32(m.Data)); e != 0 {
					return 0, fmt.Errorf("sock_diag: %w", unix.Errno(-e))
				}
			}
		case sockDiagByFamily:
			if len(m.Data) < msgInodeOff+4 {
				return 0, fmt.Errorf("sock_diag answer: %d bytes, too short", len(m.Data))
			}
			return uint64(ne.Uint32(m.Data[msgInodeOff:])), nil
		}
	}
	return 0, fmt.Errorf("sock_diag: no socket in the answer")
}
