package netns

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"sync"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// batchBuffer is the socket buffer size forced on the nf_tables socket: one transaction
// of a 10k-rule pod's maps is megabytes, more than the default limit lets one sendmsg
// carry, and splitting it would lose atomicity.
const batchBuffer = 64 << 20

// elemChunk is how many set elements go in one netlink message.
const elemChunk = 512

func bigBuffers(c *netlink.Conn) error {
	rc, err := c.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	if err := rc.Control(func(fd uintptr) {
		if e := unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_SNDBUFFORCE, batchBuffer); e != nil {
			// Without CAP_NET_ADMIN in the netns's owner: the capped size is the best we get.
			e = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_SNDBUF, batchBuffer)
			serr = e
		}
		_ = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, batchBuffer)
	}); err != nil {
		return err
	}
	return serr
}

// nftBackend programs nf_tables over netlink from a socket opened inside the target netns.
type nftBackend struct{}

var _ Backend = nftBackend{}

// errNetnsGone marks a netns path that no longer names a namespace.
var errNetnsGone = errors.New("netns is gone")

// conn opens a lasting nf_tables connection whose socket lives in nsPath.
func openConn(nsPath string) (*nftables.Conn, func(), error) {
	if isCurrent(nsPath) {
		c, err := nftables.New(nftables.AsLasting(), nftables.WithSockOptions(bigBuffers))
		if err != nil {
			return nil, nil, err
		}
		return c, func() { c.CloseLasting() }, nil
	}
	fd, err := unix.Open(nsPath, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		if errors.Is(err, unix.ENOENT) {
			return nil, nil, fmt.Errorf("open %s: %w: %w", nsPath, errNetnsGone, err)
		}
		return nil, nil, fmt.Errorf("open %s: %w", nsPath, err)
	}
	var st unix.Statfs_t
	if err := unix.Fstatfs(fd, &st); err == nil && st.Type != unix.NSFS_MAGIC && st.Type != unix.PROC_SUPER_MAGIC {
		// A leftover mount point file whose namespace was unmounted.
		unix.Close(fd)
		return nil, nil, fmt.Errorf("%s is not a network namespace: %w", nsPath, errNetnsGone)
	}
	c, err := nftables.New(nftables.WithNetNSFd(fd), nftables.AsLasting(), nftables.WithSockOptions(bigBuffers))
	if err != nil {
		unix.Close(fd)
		return nil, nil, fmt.Errorf("netlink in %s: %w", nsPath, err)
	}
	return c, func() { c.CloseLasting(); unix.Close(fd) }, nil
}

// Apply adds, deletes and re-adds the table with all its content in one batch: the kernel
// applies all of it or nothing, and packets see either the old or the new program.
func (nftBackend) Apply(nsPath string, t *Table) error {
	c, done, err := openConn(nsPath)
	if err != nil {
		return err
	}
	defer done()
	nt := &nftables.Table{Name: t.Name, Family: nftables.TableFamilyINet}
	c.AddTable(nt) // so that the delete below cannot fail on a fresh netns
	c.DelTable(nt)
	c.AddTable(nt)
	sets := map[string]*nftables.Set{}
	for _, s := range t.Sets {
		ns, elems, err := encodeSet(nt, s)
		if err != nil {
			return err
		}
		// Elements go in messages of elemChunk: one netlink attribute holds at most 64 KiB,
		// so a large set in one message would overflow it. All messages are one batch.
		first := elems[:min(len(elems), elemChunk)]
		if err := addSet(c, ns, first); err != nil {
			return fmt.Errorf("set %s: %w", s.Name, err)
		}
		for rest := elems[len(first):]; len(rest) > 0; {
			n := min(len(rest), elemChunk)
			if err := c.SetAddElements(ns, rest[:n]); err != nil {
				return fmt.Errorf("set %s: %w", s.Name, err)
			}
			rest = rest[n:]
		}
		sets[s.Name] = ns
	}
	for _, ch := range t.Chains {
		nc := c.AddChain(&nftables.Chain{
			Name:     ch.Name,
			Table:    nt,
			Type:     nftables.ChainType(ch.Type),
			Hooknum:  nftables.ChainHookOutput,
			Priority: nftables.ChainPriorityRef(nftables.ChainPriority(ch.Priority)),
			Policy:   policyRef(nftables.ChainPolicyAccept),
		})
		for i, r := range ch.Rules {
			exprs, err := encodeRule(r, sets)
			if err != nil {
				return fmt.Errorf("chain %s rule %d (%s): %w", ch.Name, i+1, r, err)
			}
			c.AddRule(&nftables.Rule{Table: nt, Chain: nc, Exprs: exprs})
		}
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("commit: %w", err)
	}
	return nil
}

// setIDMu serialises AddSet: google/nftables numbers new sets from a package-global counter
// it increments without a lock, and the daemon applies tables in several pods at once.
// Only the numbering needs it; the batches themselves, and their commits (Flush), stay
// per connection and run in parallel.
var setIDMu sync.Mutex

func addSet(c *nftables.Conn, s *nftables.Set, elems []nftables.SetElement) error {
	setIDMu.Lock()
	defer setIDMu.Unlock()
	return c.AddSet(s, elems)
}

func policyRef(p nftables.ChainPolicy) *nftables.ChainPolicy { return &p }

// Delete removes the table; a missing table or netns is success.
func (nftBackend) Delete(nsPath, table string) error {
	c, done, err := openConn(nsPath)
	if err != nil {
		if errors.Is(err, errNetnsGone) {
			return nil
		}
		return err
	}
	defer done()
	c.DelTable(&nftables.Table{Name: table, Family: nftables.TableFamilyINet})
	if err := c.Flush(); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return nil
		}
		return err
	}
	return nil
}

// Get reads the table back and decodes it; rules kl did not write decode to raw matches
// that render as the kernel expressions, so Diff reports them.
func (nftBackend) Get(nsPath, table string) (*Table, error) {
	c, done, err := openConn(nsPath)
	if err != nil {
		return nil, err
	}
	defer done()
	nt, err := c.ListTableOfFamily(table, nftables.TableFamilyINet)
	if err != nil {
		if errors.Is(err, unix.ENOENT) {
			return nil, ErrNoTable
		}
		return nil, fmt.Errorf("list table: %w", err)
	}
	out := &Table{Name: table}
	nsets, err := c.GetSets(nt)
	if err != nil {
		return nil, fmt.Errorf("list sets: %w", err)
	}
	slices.SortFunc(nsets, func(a, b *nftables.Set) int { return cmpString(a.Name, b.Name) })
	for _, ns := range nsets {
		elems, err := c.GetSetElements(ns)
		if err != nil {
			return nil, fmt.Errorf("list elements of set %s: %w", ns.Name, err)
		}
		out.Sets = append(out.Sets, decodeSet(ns, elems))
	}
	chains, err := c.ListChainsOfTableFamily(nftables.TableFamilyINet)
	if err != nil {
		return nil, fmt.Errorf("list chains: %w", err)
	}
	for _, nc := range chains {
		if nc.Table.Name != table {
			continue
		}
		ch := Chain{Name: nc.Name, Type: ChainType(nc.Type)}
		if nc.Priority != nil {
			ch.Priority = int32(*nc.Priority)
		}
		if nc.Hooknum == nil || *nc.Hooknum != *nftables.ChainHookOutput || nc.Policy == nil || *nc.Policy != nftables.ChainPolicyAccept {
			// Not a chain kl writes: make it differ from any wanted chain.
			ch.Type = ChainType(fmt.Sprintf("%s (hook %s, policy %s)", nc.Type, hookName(nc.Hooknum), policyName(nc.Policy)))
		}
		rules, err := c.GetRules(nt, nc)
		if err != nil {
			return nil, fmt.Errorf("list rules of chain %s: %w", nc.Name, err)
		}
		for _, r := range rules {
			ch.Rules = append(ch.Rules, decodeRule(r))
		}
		out.Chains = append(out.Chains, ch)
	}
	return out, nil
}

func hookName(h *nftables.ChainHook) string {
	switch {
	case h == nil:
		return "none"
	case *h == *nftables.ChainHookOutput:
		return "output"
	}
	return fmt.Sprint(*h)
}

func policyName(p *nftables.ChainPolicy) string {
	switch {
	case p == nil:
		return "none"
	case *p == nftables.ChainPolicyAccept:
		return "accept"
	case *p == nftables.ChainPolicyDrop:
		return "drop"
	}
	return fmt.Sprint(*p)
}

func cmpString(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

func encodeSet(nt *nftables.Table, s Set) (*nftables.Set, []nftables.SetElement, error) {
	ns := &nftables.Set{Table: nt, Name: s.Name}
	if s.Map {
		ns.IsMap = true
		ns.DataType = nftables.TypeMark
		n := len(s.Addrs) + len(s.PortRanges)
		if len(s.Marks) != n {
			return nil, nil, fmt.Errorf("map %s: %d marks for %d elements", s.Name, len(s.Marks), n)
		}
	}
	val := func(i int) []byte {
		if !s.Map {
			return nil
		}
		return binaryutil.NativeEndian.PutUint32(s.Marks[i])
	}
	var elems []nftables.SetElement
	switch s.Type {
	case SetIPv4, SetIPv6:
		ns.Interval = true
		ns.KeyType = nftables.TypeIPAddr
		if s.Type == SetIPv6 {
			ns.KeyType = nftables.TypeIP6Addr
		}
		for i, r := range s.Addrs {
			if r.From.Is4() != (s.Type == SetIPv4) || r.To.Is4() != (s.Type == SetIPv4) {
				return nil, nil, fmt.Errorf("set %s: range %s is not %s", s.Name, r, s.Type)
			}
			if i > 0 && s.Addrs[i-1].To.Compare(r.From) >= 0 {
				return nil, nil, fmt.Errorf("set %s: range %s overlaps or is out of order", s.Name, r)
			}
			elems = append(elems, nftables.SetElement{Key: r.From.AsSlice(), Val: val(i)})
			// The end element is exclusive; a range up to the last address has none. A
			// range the next one starts right after still has its end (the kernel wants
			// it, as nft sends it: an end and a start element with the same key).
			if next := r.To.Next(); next.IsValid() {
				elems = append(elems, nftables.SetElement{Key: next.AsSlice(), IntervalEnd: true})
			}
		}
	case SetPort:
		ns.KeyType = nftables.TypeInetService
		for _, p := range s.Ports {
			elems = append(elems, nftables.SetElement{Key: binaryutil.BigEndian.PutUint16(p)})
		}
	case SetPortRange:
		ns.Interval = true
		ns.KeyType = nftables.TypeInetService
		for i, r := range s.PortRanges {
			if r.From > r.To || i > 0 && s.PortRanges[i-1].To >= r.From {
				return nil, nil, fmt.Errorf("set %s: port range %s is backwards, overlaps or is out of order", s.Name, r)
			}
			elems = append(elems, nftables.SetElement{Key: binaryutil.BigEndian.PutUint16(r.From), Val: val(i)})
			if r.To < 65535 {
				elems = append(elems, nftables.SetElement{Key: binaryutil.BigEndian.PutUint16(r.To + 1), IntervalEnd: true})
			}
		}
	default:
		return nil, nil, fmt.Errorf("set %s: unknown type %v", s.Name, s.Type)
	}
	return ns, elems, nil
}

func decodeSet(ns *nftables.Set, elems []nftables.SetElement) Set {
	s := Set{Name: ns.Name, Map: ns.IsMap}
	if ns.IsMap && ns.DataType.Name != nftables.TypeMark.Name {
		s.Type = 0 // not a map kl writes
		return s
	}
	switch ns.KeyType.Name {
	case nftables.TypeIPAddr.Name:
		s.Type = SetIPv4
	case nftables.TypeIP6Addr.Name:
		s.Type = SetIPv6
	case nftables.TypeInetService.Name:
		s.Type = SetPort
		if ns.Interval {
			s.Type = SetPortRange
		}
	}
	if s.Type == SetPort {
		for _, e := range elems {
			if len(e.Key) == 2 {
				s.Ports = append(s.Ports, binary.BigEndian.Uint16(e.Key))
			}
		}
		slices.Sort(s.Ports)
		return s
	}
	if s.Type == 0 || !ns.Interval {
		s.Type = 0 // differs from every wanted set type
		return s
	}
	// Interval elements come back in no useful order: sort by key, then each start runs to
	// the next end element (exclusive), the next start, or the end of the key space.
	slices.SortFunc(elems, func(a, b nftables.SetElement) int {
		if c := bytes.Compare(a.Key, b.Key); c != 0 {
			return c
		}
		// An end at the same key closes the range before it: it sorts first.
		switch {
		case a.IntervalEnd && !b.IntervalEnd:
			return -1
		case !a.IntervalEnd && b.IntervalEnd:
			return 1
		}
		return 0
	})
	var open []byte
	var mark uint32
	closeAt := func(endExcl []byte) {
		if open == nil {
			return
		}
		if s.Type == SetPortRange {
			from := binary.BigEndian.Uint16(open)
			to := uint16(65535)
			if endExcl != nil {
				to = binary.BigEndian.Uint16(endExcl) - 1
			}
			s.PortRanges = append(s.PortRanges, PortRange{from, to})
		} else {
			from, _ := netip.AddrFromSlice(open)
			to := lastAddr(netip.PrefixFrom(from, 0))
			if endExcl != nil {
				a, _ := netip.AddrFromSlice(endExcl)
				to = a.Prev()
			}
			s.Addrs = append(s.Addrs, AddrRange{From: from, To: to})
		}
		if s.Map {
			s.Marks = append(s.Marks, mark)
		}
		open = nil
	}
	want := 4
	switch s.Type {
	case SetIPv6:
		want = 16
	case SetPortRange:
		want = 2
	}
	for _, e := range elems {
		if len(e.Key) != want {
			continue
		}
		if e.IntervalEnd {
			closeAt(e.Key)
			continue
		}
		if !s.Map && open != nil {
			continue // a plain set's adjacent start (kl merges those; keep the first)
		}
		closeAt(e.Key)
		open = e.Key
		if s.Map && len(e.Val) == 4 {
			mark = binaryutil.NativeEndian.Uint32(e.Val)
		}
	}
	closeAt(nil)
	return s
}
