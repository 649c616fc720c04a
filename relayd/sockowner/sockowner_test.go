package sockowner

import (
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"testing"
	"testing/fstest"
	"time"

	"github.com/kl-egress/kl/rules"
)

func link(target string) *fstest.MapFile {
	return &fstest.MapFile{Data: []byte(target), Mode: fs.ModeSymlink | 0o777}
}

// stat is a /proc/PID/stat of process pid named comm that started at tick start (field
// 22), the rest as Linux writes it.
func stat(pid int, comm string, start uint64) *fstest.MapFile {
	return &fstest.MapFile{Data: fmt.Appendf(nil, "%d (%s) S 1 %d %d 0 -1 4194560 99 0 0 0 0 0 0 0 20 0 1 0 %d 3133440 410 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 1 0 0 0 0 0\n", pid, comm, pid, pid, start)}
}

// procFS is a /proc with: pid 10 (curl, in netns 4001, socket 900), pid 11 (busybox
// running as "wget" via argv[0], same netns, socket 901 also held by pid 30 in
// another netns), pid 12 (a deleted executable, socket 902), pid 13 (fd unreadable),
// and "self" (not a pid).
func procFS() fstest.MapFS {
	return fstest.MapFS{
		"10/ns/net":  link("net:[4001]"),
		"10/fd/0":    link("/dev/null"),
		"10/fd/3":    link("socket:[900]"),
		"10/comm":    {Data: []byte("curl\n")},
		"10/exe":     link("/usr/bin/curl"),
		"10/cmdline": {Data: []byte("curl\x00-s\x00http://x/\x00")},
		"10/stat":    stat(10, "curl", 5000),
		"11/ns/net":  link("net:[4001]"),
		"11/fd/5":    link("socket:[901]"),
		"11/comm":    {Data: []byte("busybox\n")},
		"11/exe":     link("/usr/bin/busybox"),
		"11/cmdline": {Data: []byte("/bin/wget\x00-q\x00")},
		"11/stat":    stat(11, "busy box) S (x", 5001),
		"30/ns/net":  link("net:[4999]"),
		"30/fd/5":    link("socket:[901]"),
		"30/comm":    {Data: []byte("other\n")},
		"12/ns/net":  link("net:[4001]"),
		"12/fd/7":    link("socket:[902]"),
		"12/comm":    {Data: []byte("app\n")},
		"12/exe":     link("/opt/app/bin/app (deleted)"),
		"12/cmdline": {Data: []byte("")},
		"12/stat":    stat(12, "app", 5002),
		"13/ns/net":  link("net:[4001]"),
		"13/comm":    {Data: []byte("secret\n")},
		"self/comm":  {Data: []byte("kl-relayd\n")},
	}
}

func TestLookup(t *testing.T) {
	socks := map[netip.AddrPort]uint64{
		netip.MustParseAddrPort("192.0.2.10:40000"): 900,
		netip.MustParseAddrPort("192.0.2.10:40001"): 901,
		netip.MustParseAddrPort("[fd00::10]:40002"): 902,
		netip.MustParseAddrPort("192.0.2.10:40003"): 903, // nobody in the netns holds it
	}
	lookups := 0
	f := &Finder{
		Proc: procFS(),
		SocketInode: func(ns string, src, dst netip.AddrPort) (uint64, error) {
			lookups++
			if ino, ok := socks[src]; ok && ns == "/run/netns/pod" {
				return ino, nil
			}
			return 0, errors.New("no such socket")
		},
		NetnsInode: func(string) (uint64, error) { return 4001, nil },
	}
	dst := netip.MustParseAddrPort("198.51.100.2:443")
	for _, tc := range []struct {
		name string
		src  string
		want rules.Process
		err  error
	}{
		{"curl", "192.0.2.10:40000", rules.Process{Known: true, Comm: "curl", Exe: "curl", Argv0: "curl"}, nil},
		{"argv0 differs, other netns ignored", "192.0.2.10:40001", rules.Process{Known: true, Comm: "busybox", Exe: "busybox", Argv0: "wget"}, nil},
		{"deleted exe, empty cmdline", "[fd00::10]:40002", rules.Process{Known: true, Comm: "app", Exe: "app"}, nil},
		{"no holder", "192.0.2.10:40003", rules.Process{}, ErrNotFound},
		{"no socket", "192.0.2.10:49999", rules.Process{}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := f.Lookup(Key{Netns: "/run/netns/pod", Src: netip.MustParseAddrPort(tc.src), Dst: dst})
			if got != tc.want {
				t.Errorf("Lookup = %+v, want %+v", got, tc.want)
			}
			switch {
			case tc.err != nil && !errors.Is(err, tc.err):
				t.Errorf("err = %v, want %v", err, tc.err)
			case !tc.want.Known && err == nil:
				t.Error("unknown process without an error")
			case tc.want.Known && err != nil:
				t.Errorf("err = %v", err)
			}
		})
	}
	// Cached per tuple until forgotten.
	k := Key{Netns: "/run/netns/pod", Src: netip.MustParseAddrPort("192.0.2.10:40000"), Dst: dst}
	before := lookups
	if p, _ := f.Lookup(k); p.Comm != "curl" || lookups != before {
		t.Errorf("cached lookup: %+v, %d socket lookups", p, lookups-before)
	}
	n := f.Cached()
	f.Forget(k)
	if f.Cached() != n-1 {
		t.Errorf("Forget: %d cached, want %d", f.Cached(), n-1)
	}
	f.Lookup(k)
	if lookups != before+1 {
		t.Error("a forgotten tuple was not looked up again")
	}
}

func TestCacheBound(t *testing.T) {
	f := &Finder{Proc: procFS(), MaxCached: 2,
		SocketInode: func(string, netip.AddrPort, netip.AddrPort) (uint64, error) { return 900, nil },
		NetnsInode:  func(string) (uint64, error) { return 4001, nil }}
	for i := range 5 {
		f.Lookup(Key{Src: netip.AddrPortFrom(netip.MustParseAddr("192.0.2.1"), uint16(1000+i))})
	}
	if f.Cached() != 2 {
		t.Errorf("cached %d, want the bound 2", f.Cached())
	}
}

// TestForgetDuringLookup: a connection that ends while its owner is looked up (Forget
// meanwhile, as proxy mode does when the client closes) leaves nothing in the cache for
// the next connection that reuses its source port to answer from.
func TestForgetDuringLookup(t *testing.T) {
	started, release := make(chan struct{}), make(chan struct{})
	f := &Finder{Proc: procFS(),
		SocketInode: func(string, netip.AddrPort, netip.AddrPort) (uint64, error) {
			close(started)
			<-release
			return 900, nil
		},
		NetnsInode: func(string) (uint64, error) { return 4001, nil }}
	k := Key{Netns: "/run/netns/pod", Src: netip.MustParseAddrPort("192.0.2.10:40000"), Dst: netip.MustParseAddrPort("127.0.0.1:15080")}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if p, err := f.Lookup(k); err != nil || p.Comm != "curl" {
			t.Errorf("Lookup = %+v, %v; want curl", p, err)
		}
	}()
	<-started
	f.Forget(k)
	close(release)
	<-done
	if n := f.Cached(); n != 0 {
		t.Errorf("%d cached after the connection was forgotten during its lookup, want 0", n)
	}
	// The next lookup of the key is cached as usual.
	f.SocketInode = func(string, netip.AddrPort, netip.AddrPort) (uint64, error) { return 900, nil }
	f.Lookup(k)
	if n := f.Cached(); n != 1 {
		t.Errorf("%d cached after a later lookup, want 1", n)
	}
}

func TestUnsupportedIsUnknown(t *testing.T) {
	var f Finder
	p, err := f.Lookup(Key{})
	if p.Known || !errors.Is(err, errors.ErrUnsupported) {
		t.Errorf("zero Finder: %+v, %v", p, err)
	}
}

func TestOwnerHints(t *testing.T) {
	proc := procFS()
	f := &Finder{Proc: proc}
	if pid, err := f.Owner(4001, 901); pid != 11 || err != nil {
		t.Fatalf("Owner = %d, %v; want 11", pid, err)
	}
	// A lower pid of the netns now holds it too: the recent owner is checked first.
	proc["5/ns/net"] = link("net:[4001]")
	proc["5/fd/9"] = link("socket:[901]")
	if pid, _ := f.Owner(4001, 901); pid != 11 {
		t.Errorf("Owner = %d, want the hinted 11", pid)
	}
	// The hinted process let go of it: the full scan finds the other holder.
	delete(proc, "11/fd/5")
	if pid, _ := f.Owner(4001, 901); pid != 5 {
		t.Errorf("Owner = %d, want 5 from the scan", pid)
	}
	// Hints are per netns: another netns does not see them.
	if _, err := f.Owner(4999, 902); !errors.Is(err, ErrNotFound) {
		t.Errorf("Owner in another netns: %v, want ErrNotFound", err)
	}
}

// hookFS is a /proc whose files run a hook (once) when first read, to change the
// processes between the reads of one lookup.
type hookFS struct {
	m  fstest.MapFS
	on map[string]func()
}

func (h *hookFS) hook(name string) {
	if fn := h.on[name]; fn != nil {
		delete(h.on, name)
		fn()
	}
}

func (h *hookFS) Open(name string) (fs.File, error) { h.hook(name); return h.m.Open(name) }
func (h *hookFS) ReadLink(name string) (string, error) {
	h.hook(name)
	return h.m.ReadLink(name)
}
func (h *hookFS) Lstat(name string) (fs.FileInfo, error) { h.hook(name); return h.m.Lstat(name) }

// TestOwnerChanged: the process found holding the socket exits and another takes its
// pid before its names are read; the names read must not be given as the owner's.
func TestOwnerChanged(t *testing.T) {
	// reuse replaces pid 10 with "evil", started later, holding no socket of the netns.
	reuse := func(m fstest.MapFS) func() {
		return func() {
			for _, n := range []string{"10/fd/3", "10/exe"} {
				delete(m, n)
			}
			m["10/comm"] = &fstest.MapFile{Data: []byte("evil\n")}
			m["10/cmdline"] = &fstest.MapFile{Data: []byte("evil\x00")}
			m["10/stat"] = stat(10, "evil", 9000)
		}
	}
	exit := func(m fstest.MapFS) func() {
		return func() {
			for n := range m {
				if n[:3] == "10/" {
					delete(m, n)
				}
			}
		}
	}
	for _, tc := range []struct {
		name   string
		at     string // the file whose first read runs the change
		change func(fstest.MapFS) func()
		want   rules.Process
		err    error
	}{
		{"unchanged", "", nil, rules.Process{Known: true, Comm: "curl", Exe: "curl", Argv0: "curl"}, nil},
		{"reused before the names", "10/comm", reuse, rules.Process{}, ErrOwnerChanged},
		{"reused between the names", "10/cmdline", reuse, rules.Process{}, ErrOwnerChanged},
		{"reused before the start time", "10/stat", reuse, rules.Process{}, ErrOwnerChanged},
		{"exited after the names", "10/cmdline", exit, rules.Process{}, ErrOwnerChanged},
		{"exited before the start time", "10/stat", exit, rules.Process{}, ErrOwnerChanged},
		{"socket handed on after the names", "10/cmdline", func(m fstest.MapFS) func() {
			return func() { delete(m, "10/fd/3") }
		}, rules.Process{}, ErrOwnerChanged},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := procFS()
			h := &hookFS{m: m, on: map[string]func(){}}
			if tc.change != nil {
				h.on[tc.at] = tc.change(m)
			}
			f := &Finder{Proc: h,
				SocketInode: func(string, netip.AddrPort, netip.AddrPort) (uint64, error) { return 900, nil },
				NetnsInode:  func(string) (uint64, error) { return 4001, nil }}
			got, err := f.Lookup(Key{Netns: "/run/netns/pod", Src: netip.MustParseAddrPort("192.0.2.10:40000")})
			if got != tc.want {
				t.Errorf("Lookup = %+v, want %+v", got, tc.want)
			}
			if (tc.err == nil) != (err == nil) || tc.err != nil && !errors.Is(err, tc.err) {
				t.Errorf("err = %v, want %v", err, tc.err)
			}
			if len(h.on) != 0 {
				t.Errorf("%s was never read: the change did not happen", tc.at)
			}
		})
	}
}

// TestFailureRetried: a failed lookup (here a transient sock_diag failure) is cached
// only briefly: the requests of a kept-alive proxy connection right after it share the
// failure, a later one looks the owner up again and finds it.
func TestFailureRetried(t *testing.T) {
	clock := time.Unix(1e9, 0)
	calls := 0
	f := &Finder{Proc: procFS(),
		SocketInode: func(string, netip.AddrPort, netip.AddrPort) (uint64, error) {
			if calls++; calls == 1 {
				return 0, fmt.Errorf("sock_diag receive: %w", errors.New("no buffer space available"))
			}
			return 900, nil
		},
		NetnsInode: func(string) (uint64, error) { return 4001, nil },
		now:        func() time.Time { return clock }}
	k := Key{Netns: "/run/netns/pod", Src: netip.MustParseAddrPort("192.0.2.10:40000"), Dst: netip.MustParseAddrPort("127.0.0.1:15080")}
	curl := rules.Process{Known: true, Comm: "curl", Exe: "curl", Argv0: "curl"}
	for _, step := range []struct {
		name    string
		advance time.Duration
		want    rules.Process
		calls   int // socket lookups made so far
	}{
		{"transient failure", 0, rules.Process{}, 1},
		{"shared right after", failureTTL / 2, rules.Process{}, 1},
		{"retried later", failureTTL, curl, 2},
		{"success kept", 10 * failureTTL, curl, 2},
	} {
		clock = clock.Add(step.advance)
		got, err := f.Lookup(k)
		if got != step.want || (err == nil) != got.Known || calls != step.calls {
			t.Errorf("%s: Lookup = %+v, %v after %d socket lookups; want %+v after %d", step.name, got, err, calls, step.want, step.calls)
		}
	}
}
