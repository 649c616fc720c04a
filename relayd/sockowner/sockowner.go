// Package sockowner finds the program behind a TCP connection a workload opened, for
// process rules: the client socket's inode from inet sock_diag run inside the
// workload's network namespace, then the process holding that inode among the
// processes of that namespace (/proc/PID/ns/net, /proc/PID/fd), then its comm,
// executable basename and argv[0] basename.
//
// It is not a process monitor: one lookup per connection, cached under the
// connection's tuple until the caller forgets it when the connection ends. A lookup
// that fails (the process already exited, its pid was reused meanwhile, no permission,
// the socket is gone, sock_diag failed) is an explicit unknown
// (rules.Process{Known: false}) with an error saying why; it never panics, and it is
// cached only briefly, so a later lookup of the same connection tries again. /proc is
// read through an fs.FS so tests feed it from testdata.
package sockowner

import (
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"path"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/kl-egress/kl/rules"
)

// Key is one connection as its client socket sees it, in one netns.
type Key struct {
	Netns string         // the workload's netns path
	Src   netip.AddrPort // the client socket's own address (the relay's peer)
	Dst   netip.AddrPort // where the client connected (the original destination)
}

// Finder looks up and caches connection owners. Its methods are safe for concurrent use.
type Finder struct {
	// Proc is /proc; it must implement fs.ReadLinkFS (os.DirFS does).
	Proc fs.FS
	// SocketInode returns the inode of the TCP socket with local address src and remote
	// address dst inside the netns at nsPath (inet sock_diag).
	SocketInode func(nsPath string, src, dst netip.AddrPort) (uint64, error)
	// NetnsInode returns the inode of the netns file at nsPath.
	NetnsInode func(nsPath string) (uint64, error)
	// MaxCached bounds the cache (default 65536): beyond it, lookups are not cached.
	MaxCached int

	mu    sync.Mutex
	cache map[Key]result
	busy  map[Key]*inFlight // lookups under way, so a Forget meanwhile keeps them out of the cache
	hints map[uint64][]int  // per netns inode: pids that owned its sockets lately
	now   func() time.Time  // time.Now when nil; tests set it
}

// failureTTL is how long a failed lookup is cached: long enough that the requests of
// one kept-alive proxy connection do not each scan /proc again while the owner cannot
// be found, short enough that a transient failure (sock_diag interrupted or out of
// buffers, the netns busy) does not leave the connection unknown for its whole life.
const failureTTL = time.Second

// Hints bound the per-netns memory of recent owners: a workload's connections mostly
// come from the same few processes, which are checked before a full /proc scan.
const (
	maxHintPids   = 8
	maxHintNetnss = 4096
)

type result struct {
	p     rules.Process
	err   error
	until time.Time // a failure's expiry; a success is kept until forgotten
}

// inFlight counts the lookups of one key under way; forgotten is set when the key is
// forgotten meanwhile.
type inFlight struct {
	n         int
	forgotten bool
}

// ErrNotFound is returned when no process of the netns holds the socket (it exited, or
// handed the socket to a process in another netns).
var ErrNotFound = errors.New("no process holds the socket")

// ErrOwnerChanged is returned when the process found holding the socket was gone, or
// its pid taken by another process, before its names were read: the names read may not
// be the owner's.
var ErrOwnerChanged = errors.New("the owning process changed while it was read")

// Lookup returns the owner of connection k, from the cache when k was looked up
// before and not forgotten since. On failure the Process is unknown and the error says
// why; a failure is cached for failureTTL only, so a later lookup can still succeed.
func (f *Finder) Lookup(k Key) (rules.Process, error) {
	f.mu.Lock()
	if r, ok := f.cache[k]; ok {
		if r.err == nil || f.clock().Before(r.until) {
			f.mu.Unlock()
			return r.p, r.err
		}
		delete(f.cache, k)
	}
	if f.busy == nil {
		f.busy = map[Key]*inFlight{}
	}
	st := f.busy[k]
	if st == nil {
		st = &inFlight{}
		f.busy[k] = st
	}
	st.n++
	f.mu.Unlock()
	p, err := f.lookup(k)
	max := f.MaxCached
	if max <= 0 {
		max = 1 << 16
	}
	f.mu.Lock()
	if st.n--; st.n == 0 {
		delete(f.busy, k)
	}
	if f.cache == nil {
		f.cache = map[Key]result{}
	}
	// A connection that ended while it was looked up (Forget ran meanwhile) is not
	// cached: the entry would outlive it and answer for the next connection that reuses
	// its source port to the same destination.
	if !st.forgotten && len(f.cache) < max {
		r := result{p: p, err: err}
		if err != nil {
			r.until = f.clock().Add(failureTTL)
		}
		f.cache[k] = r
	}
	f.mu.Unlock()
	return p, err
}

// Forget drops k from the cache (call it when the connection ends), also the answer of
// a lookup of k still under way.
func (f *Finder) Forget(k Key) {
	f.mu.Lock()
	delete(f.cache, k)
	if st := f.busy[k]; st != nil {
		st.forgotten = true
	}
	f.mu.Unlock()
}

func (f *Finder) clock() time.Time {
	if f.now != nil {
		return f.now()
	}
	return time.Now()
}

// Cached is the number of cached connections.
func (f *Finder) Cached() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.cache)
}

func (f *Finder) lookup(k Key) (rules.Process, error) {
	if f.SocketInode == nil || f.NetnsInode == nil || f.Proc == nil {
		return rules.Process{}, errors.ErrUnsupported
	}
	sock, err := f.SocketInode(k.Netns, k.Src, k.Dst)
	if err != nil {
		return rules.Process{}, fmt.Errorf("socket lookup: %w", err)
	}
	ns, err := f.NetnsInode(k.Netns)
	if err != nil {
		return rules.Process{}, fmt.Errorf("netns: %w", err)
	}
	pid, err := f.Owner(ns, sock)
	if err != nil {
		return rules.Process{}, err
	}
	return f.describeOwner(pid, ns, sock)
}

// describeOwner reads the names of process pid, found holding socket sockIno in the
// netns nsIno, and makes sure they are that process's: a pid is reused once its process
// exits, and the names of another program must not decide the flow. The process's start
// time is the same before and after the names are read (the same process all along),
// and it still holds the socket afterwards (it is the process found, not a newcomer
// that took its pid before the first look at its start time).
func (f *Finder) describeOwner(pid int, nsIno, sockIno uint64) (rules.Process, error) {
	before, err := f.startTime(pid)
	if err != nil {
		return rules.Process{}, fmt.Errorf("process %d: %w: %w", pid, ErrOwnerChanged, err)
	}
	p, err := f.Describe(pid)
	if err != nil {
		return rules.Process{}, err
	}
	after, err := f.startTime(pid)
	if err != nil || after != before {
		return rules.Process{}, fmt.Errorf("process %d: %w", pid, ErrOwnerChanged)
	}
	if !f.holds(strconv.Itoa(pid), "net:["+strconv.FormatUint(nsIno, 10)+"]", "socket:["+strconv.FormatUint(sockIno, 10)+"]") {
		return rules.Process{}, fmt.Errorf("process %d: %w", pid, ErrOwnerChanged)
	}
	return p, nil
}

// startTime returns field 22 of /proc/PID/stat, the process's start time in clock ticks
// since boot: with the pid, it names one process.
func (f *Finder) startTime(pid int) (uint64, error) {
	b, err := fs.ReadFile(f.Proc, strconv.Itoa(pid)+"/stat")
	if err != nil {
		return 0, err
	}
	// "pid (comm) state ppid ...": comm may hold spaces and parentheses, so the fields
	// are counted from the last ")"; starttime is the 20th after it.
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return 0, fmt.Errorf("stat: no \")\" in %q", b)
	}
	fields := strings.Fields(string(b[i+1:]))
	if len(fields) < 20 {
		return 0, fmt.Errorf("stat: %d fields after the name, want at least 20", len(fields))
	}
	t, err := strconv.ParseUint(fields[19], 10, 64)
	if err != nil {
		return 0, fmt.Errorf("stat: start time: %w", err)
	}
	return t, nil
}

// Owner returns the pid of a process in the netns with inode nsIno that holds the
// socket with inode sockIno: one of the netns's recent owners when one holds it,
// otherwise the lowest such pid of a full scan.
func (f *Finder) Owner(nsIno, sockIno uint64) (int, error) {
	wantNS := "net:[" + strconv.FormatUint(nsIno, 10) + "]"
	wantSock := "socket:[" + strconv.FormatUint(sockIno, 10) + "]"
	f.mu.Lock()
	hinted := append([]int(nil), f.hints[nsIno]...)
	f.mu.Unlock()
	for _, pid := range hinted {
		if f.holds(strconv.Itoa(pid), wantNS, wantSock) {
			return pid, nil
		}
	}
	ents, err := fs.ReadDir(f.Proc, ".")
	if err != nil {
		return 0, fmt.Errorf("read proc: %w", err)
	}
	best := 0
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid <= 0 || (best != 0 && pid > best) {
			continue
		}
		if f.holds(e.Name(), wantNS, wantSock) {
			best = pid
		}
	}
	if best == 0 {
		return 0, ErrNotFound
	}
	f.hint(nsIno, best)
	return best, nil
}

// holds reports whether process dir is in the netns wantNS and has wantSock open.
func (f *Finder) holds(dir, wantNS, wantSock string) bool {
	if l, err := fs.ReadLink(f.Proc, dir+"/ns/net"); err != nil || l != wantNS {
		return false
	}
	fds, err := fs.ReadDir(f.Proc, dir+"/fd")
	if err != nil {
		return false // exited, or not ours to read
	}
	for _, fd := range fds {
		if l, err := fs.ReadLink(f.Proc, dir+"/fd/"+fd.Name()); err == nil && l == wantSock {
			return true
		}
	}
	return false
}

func (f *Finder) hint(nsIno uint64, pid int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.hints == nil || len(f.hints) >= maxHintNetnss {
		f.hints = map[uint64][]int{}
	}
	h := f.hints[nsIno]
	if len(h) >= maxHintPids {
		h = h[1:]
	}
	f.hints[nsIno] = append(h, pid)
}

// Describe reads the identity of process pid: comm, executable basename and argv[0]
// basename. A process whose exe cannot be read (a kernel thread, no permission) still
// has its comm.
func (f *Finder) Describe(pid int) (rules.Process, error) {
	dir := strconv.Itoa(pid)
	comm, err := fs.ReadFile(f.Proc, dir+"/comm")
	if err != nil {
		return rules.Process{}, fmt.Errorf("process %d: %w", pid, err)
	}
	p := rules.Process{Known: true, Comm: strings.TrimRight(string(comm), "\n")}
	if exe, err := fs.ReadLink(f.Proc, dir+"/exe"); err == nil {
		p.Exe = path.Base(strings.TrimSuffix(exe, " (deleted)"))
	}
	if cmd, err := fs.ReadFile(f.Proc, dir+"/cmdline"); err == nil && len(cmd) > 0 {
		arg0, _, _ := strings.Cut(string(cmd), "\x00")
		if arg0 != "" {
			p.Argv0 = path.Base(arg0)
		}
	}
	return p, nil
}
