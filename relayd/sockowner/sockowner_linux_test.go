package sockowner

import (
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"testing"
)

// TestRealSocket looks up a loopback connection of the test process itself in its own
// netns: real sock_diag, real /proc.
func TestRealSocket(t *testing.T) {
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	c, err := net.Dial("tcp4", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	f := New()
	k := Key{Netns: "/proc/self/ns/net", Src: c.LocalAddr().(*net.TCPAddr).AddrPort(), Dst: c.RemoteAddr().(*net.TCPAddr).AddrPort()}
	p, err := f.Lookup(k)
	if err != nil {
		t.Fatalf("Lookup: %v", err)
	}
	exe, _ := os.Executable()
	if !p.Known || p.Exe != filepath.Base(exe) || p.Argv0 != filepath.Base(os.Args[0]) {
		t.Errorf("Lookup = %+v, want this test binary %s", p, filepath.Base(exe))
	}
	// The server side of the same connection is another socket, also ours.
	ino1, err1 := SocketInode(k.Netns, k.Src, k.Dst)
	ino2, err2 := SocketInode(k.Netns, k.Dst, k.Src)
	if err1 != nil || err2 != nil || ino1 == ino2 || ino1 == 0 {
		t.Errorf("inodes %d (%v), %d (%v): want two distinct sockets", ino1, err1, ino2, err2)
	}
	if _, err := SocketInode(k.Netns, k.Src, netipMustPort(t, "127.0.0.1:1")); err == nil {
		t.Error("lookup of a tuple nobody uses succeeded")
	}
}

func netipMustPort(t *testing.T, s string) netip.AddrPort {
	t.Helper()
	ap, err := netip.ParseAddrPort(s)
	if err != nil {
		t.Fatal(err)
	}
	return ap
}

// BenchmarkRealLookup: one uncached owner lookup of a loopback connection on this
// machine's /proc (the cost a flow pays once when the rules have process rules).
func BenchmarkRealLookup(b *testing.B) {
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	c, err := net.Dial("tcp4", ln.Addr().String())
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	f := New()
	k := Key{Netns: "/proc/self/ns/net", Src: c.LocalAddr().(*net.TCPAddr).AddrPort(), Dst: c.RemoteAddr().(*net.TCPAddr).AddrPort()}
	for b.Loop() {
		if _, err := f.Lookup(k); err != nil {
			b.Fatal(err)
		}
		f.Forget(k)
	}
}
