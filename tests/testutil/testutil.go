// Package testutil is the one gate for tests that need root, network namespaces or
// Debian tools, and a few helpers to build throwaway netns topologies. Outside CI a test
// that cannot run skips with the reason; in CI (KL_E2E=1) it fails instead, so a broken
// environment can never turn into a green run.
package testutil

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// InCI reports whether privileged tests are mandatory (KL_E2E=1).
func InCI() bool { return os.Getenv("KL_E2E") == "1" }

// Unavailable skips the test with why, or fails it in CI (KL_E2E=1): the one way a test
// gives up on a missing part of its environment.
func Unavailable(t testing.TB, why string) {
	t.Helper()
	if InCI() {
		t.Fatalf("KL_E2E=1 but this test cannot run: %s", why)
	}
	t.Skipf("needs a privileged environment: %s (set KL_E2E=1 to make this a failure)", why)
}

// RequirePrivileged skips (or, in CI, fails) unless the test runs as root on Linux with
// `ip` able to create network namespaces.
func RequirePrivileged(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		Unavailable(t, "not root")
		return
	}
	if _, err := exec.LookPath("ip"); err != nil {
		Unavailable(t, "iproute2 (ip) is not installed")
		return
	}
	if _, err := os.Stat("/proc/self/ns/net"); err != nil {
		Unavailable(t, "no network namespaces: "+err.Error())
	}
}

// RequireTool skips (fails in CI) unless every named program is on PATH.
func RequireTool(t testing.TB, names ...string) {
	t.Helper()
	for _, n := range names {
		if _, err := exec.LookPath(n); err != nil {
			Unavailable(t, n+" is not installed (make deps installs it)")
		}
	}
}

var seq atomic.Uint64

// Name returns a short unique name with the given prefix, fit for a netns or a veth
// (interface names are at most 15 bytes).
func Name(prefix string) string {
	n := fmt.Sprintf("%s%d%x", prefix, os.Getpid()%10000, seq.Add(1))
	if len(n) > 15 {
		n = n[len(n)-15:]
	}
	return n
}

// Run runs a command and fails the test with its output when it fails.
func Run(t testing.TB, name string, args ...string) string {
	t.Helper()
	out, err := Output(name, args...)
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return out
}

// Output runs a command and returns its combined output.
func Output(name string, args ...string) (string, error) {
	var b bytes.Buffer
	cmd := exec.Command(name, args...)
	cmd.Stdout, cmd.Stderr = &b, &b
	err := cmd.Run()
	return b.String(), err
}

// Netns is a named network namespace created for one test.
type Netns struct {
	Name string
	Path string
}

// NewNetns creates a network namespace with loopback up and removes it when the test
// ends. It calls RequirePrivileged itself.
func NewNetns(t testing.TB, prefix string) *Netns {
	t.Helper()
	RequirePrivileged(t)
	name := Name(prefix)
	Run(t, "ip", "netns", "add", name)
	ns := &Netns{Name: name, Path: "/var/run/netns/" + name}
	t.Cleanup(func() {
		// Kill whatever the test left in it, then delete it.
		if out, _ := Output("ip", "netns", "pids", name); strings.TrimSpace(out) != "" {
			for _, pid := range strings.Fields(out) {
				_, _ = Output("kill", "-9", pid)
			}
			time.Sleep(50 * time.Millisecond)
		}
		if out, err := Output("ip", "netns", "del", name); err != nil {
			t.Logf("ip netns del %s: %v %s", name, err, out)
		}
	})
	ns.Exec(t, "ip", "link", "set", "lo", "up")
	return ns
}

// Exec runs a command inside the namespace and fails the test if it fails.
func (n *Netns) Exec(t testing.TB, name string, args ...string) string {
	t.Helper()
	return Run(t, "ip", append([]string{"netns", "exec", n.Name, name}, args...)...)
}

// Command returns an unstarted command that runs inside the namespace.
func (n *Netns) Command(name string, args ...string) *exec.Cmd {
	return exec.Command("ip", append([]string{"netns", "exec", n.Name, name}, args...)...)
}

// Start starts a long-running command in the namespace and kills it (by PID) when the
// test ends.
func (n *Netns) Start(t testing.TB, name string, args ...string) *exec.Cmd {
	t.Helper()
	cmd := n.Command(name, args...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s in %s: %v", name, n.Name, err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("output of %s in %s:\n%s", name, n.Name, out.String())
		}
	})
	return cmd
}

// Link joins two namespaces with a veth pair and assigns the given addresses (CIDR
// notation, any number, IPv4 or IPv6) to each end. IPv6 addresses are added with
// nodad so they are usable at once.
func Link(t testing.TB, a *Netns, aAddrs []string, b *Netns, bAddrs []string) (aIf, bIf string) {
	t.Helper()
	aIf, bIf = Name("kv"), Name("kv")
	Run(t, "ip", "link", "add", aIf, "netns", a.Name, "type", "veth", "peer", "name", bIf, "netns", b.Name)
	for _, side := range []struct {
		ns    *Netns
		ifc   string
		addrs []string
	}{{a, aIf, aAddrs}, {b, bIf, bAddrs}} {
		for _, ad := range side.addrs {
			args := []string{"addr", "add", ad, "dev", side.ifc}
			if strings.Contains(ad, ":") {
				args = append(args, "nodad")
			}
			side.ns.Exec(t, "ip", args...)
		}
		side.ns.Exec(t, "ip", "link", "set", side.ifc, "up")
	}
	return aIf, bIf
}

// WaitPort waits until something listens on addr (host:port) inside ns, or fails.
func (n *Netns) WaitPort(t testing.TB, network, addr string, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		out, _ := Output("ip", "netns", "exec", n.Name, "ss", "-Hltn")
		if network == "udp" {
			out, _ = Output("ip", "netns", "exec", n.Name, "ss", "-Hlun")
		}
		if strings.Contains(out, addr) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("nothing listens on %s in %s after %v:\n%s", addr, n.Name, timeout, out)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Bin returns the path of one of kl's binaries. `make` exports KL_BIN with freshly
// built binaries; a plain `go test` builds them once into a temporary directory.
func Bin(t testing.TB, name string) string {
	t.Helper()
	dir := os.Getenv("KL_BIN")
	if dir == "" {
		binOnce.Do(func() {
			binDir, binErr = os.MkdirTemp("", "kl-bin-")
			if binErr != nil {
				return
			}
			root, err := moduleRoot()
			if err != nil {
				binErr = err
				return
			}
			cmd := exec.Command("go", "build", "-o", binDir+"/", "./...")
			cmd.Dir = root
			if out, err := cmd.CombinedOutput(); err != nil {
				binErr = fmt.Errorf("go build: %v\n%s", err, out)
			}
		})
		if binErr != nil {
			t.Fatalf("build kl binaries: %v", binErr)
		}
		dir = binDir
	}
	p := dir + "/" + name
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("binary %s: %v", name, err)
	}
	return p
}

var (
	binOnce sync.Once
	binDir  string
	binErr  error
)

// ModuleRoot is the directory holding go.mod (tests use it to find testdata shared
// across packages, like examples/).
func ModuleRoot(t testing.TB) string {
	t.Helper()
	r, err := moduleRoot()
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func moduleRoot() (string, error) {
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOMOD: %w", err)
	}
	return strings.TrimSuffix(strings.TrimSpace(string(out)), "/go.mod"), nil
}

// SkipShort skips a test that is too long for `go test -short` (never in CI, which does
// not pass -short).
func SkipShort(t testing.TB, why string) {
	t.Helper()
	if testing.Short() {
		t.Skip(why + ": not a -short test")
	}
}

// CNIPlugins returns the directory of the CNI reference plugins and cnitool that
// tests/deps.sh builds ($KL_CNI_BIN, else .build/cni of the module), after checking that
// each named one is there.
func CNIPlugins(t testing.TB, names ...string) string {
	t.Helper()
	dir := os.Getenv("KL_CNI_BIN")
	if dir == "" {
		dir = filepath.Join(ModuleRoot(t), ".build", "cni")
	}
	for _, p := range names {
		if _, err := os.Stat(filepath.Join(dir, p)); err != nil {
			Unavailable(t, fmt.Sprintf("CNI plugin %s missing in %s (run tests/deps.sh): %v", p, dir, err))
		}
	}
	return dir
}

// Buffer is a bytes.Buffer safe for one writer (a daemon's output, a logger) and a
// reading test at once.
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *Buffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *Buffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// ShutdownWait is how long Shutdown lets a relay's flows drain.
const ShutdownWait = 10 * time.Second

// Shutdown stops s (a relay), letting its flows drain for at most ShutdownWait; a flow
// still open then fails the test. A stalled flow, what many relay tests look for, so
// fails the test instead of hanging it until the package's timeout.
func Shutdown(t testing.TB, s interface{ Shutdown(context.Context) error }) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), ShutdownWait)
	defer cancel()
	if err := s.Shutdown(ctx); err != nil {
		t.Errorf("shutdown: flows still open after %v: %v", ShutdownWait, err)
	}
}
