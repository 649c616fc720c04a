//go:build linux

package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kl-egress/kl/tests/testutil"
)

// requireDemo skips (fails under KL_E2E=1) unless everything the demo starts is here.
func requireDemo(t *testing.T) {
	t.Helper()
	testutil.RequirePrivileged(t)
	testutil.RequireTool(t, "ss", "curl", "squid", "containerd", "ctr", "containerd-shim-runc-v2", "runc", "busybox", "nsenter")
	testutil.CNIPlugins(t, "bridge", "host-local", "loopback", "cnitool")
}

var (
	binOnce sync.Once
	binDir  string
	binErr  error
)

// useBins points KL_BIN at kl's binaries: make's (KL_BIN) when complete, else one build
// shared by the tests of this package.
func useBins(t *testing.T) {
	t.Helper()
	if d := os.Getenv("KL_BIN"); d != "" && allExist(d, klBinaries) {
		return
	}
	binOnce.Do(func() {
		if binDir, binErr = os.MkdirTemp("", "kl-demo-test-bin-"); binErr != nil {
			return
		}
		cmd := exec.Command("go", append([]string{"build", "-o", binDir + "/"}, klPackages...)...)
		cmd.Dir = testutil.ModuleRoot(t)
		if out, err := cmd.CombinedOutput(); err != nil {
			binErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if binErr != nil {
		t.Fatal(binErr)
	}
	t.Setenv("KL_BIN", binDir)
}

func TestMain(m *testing.M) {
	code := m.Run()
	if binDir != "" {
		os.RemoveAll(binDir)
	}
	os.Exit(code)
}

// syncBuffer is an output the demo writes while the test reads it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
	// on is called with everything written so far after each write.
	on func(string)
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	n, _ := s.b.Write(p)
	all := s.b.String()
	s.mu.Unlock()
	if s.on != nil {
		s.on(all)
	}
	return n, nil
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestDemo runs the whole demo and checks that every flow matched its expectation, that
// every scenario ran, and that nothing is left behind.
func TestDemo(t *testing.T) {
	requireDemo(t)
	useBins(t)
	var tag, dir string
	out := &syncBuffer{}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	start := time.Now()
	err := Run(ctx, Options{Out: out, SkipDeps: true, observe: func(tg, d string) { tag, dir = tg, d }})
	t.Logf("demo took %v; output:\n%s", time.Since(start), out)
	if err != nil {
		t.Fatalf("demo failed: %v", err)
	}
	text := out.String()
	for _, want := range []string{
		"== 1. CI builder", "== 2. Two tenants", "== 3. Internal ranges", "== 4. A rules edit", "== 5. A broken edit",
		"E_BAD_ACTION", "squid egress-b", "== kl-ctl status", " 0 not\n",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("output lacks %q", want)
		}
	}
	if n := strings.Count(text, "✓"); n < 20 {
		t.Errorf("%d checks passed, want at least 20", n)
	}
	if strings.Contains(text, "✗") {
		t.Errorf("a check failed")
	}
	checkClean(t, tag, dir)
}

// TestDemoInterrupted cancels the demo (as Ctrl-C does) while it brings the node up and
// checks that it stops with an error and leaves nothing behind.
func TestDemoInterrupted(t *testing.T) {
	requireDemo(t)
	useBins(t)
	var tag, dir string
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	out := &syncBuffer{on: func(s string) {
		if strings.Contains(s, "• containerd") {
			cancel()
		}
	}}
	err := Run(ctx, Options{Out: out, SkipDeps: true, observe: func(tg, d string) { tag, dir = tg, d }})
	t.Logf("output:\n%s", out)
	if err == nil {
		t.Fatal("an interrupted demo returned no error")
	}
	if !strings.Contains(out.String(), "cleaning up") {
		t.Error("no cleanup after the interruption")
	}
	checkClean(t, tag, dir)
}

// checkClean verifies that no netns, process or file of the run is left.
func checkClean(t *testing.T, tag, dir string) {
	t.Helper()
	if tag == "" || dir == "" {
		t.Fatal("the demo did not report its tag and directory")
	}
	list, _ := testutil.Output("ip", "netns", "list")
	if strings.Contains(list, nsPrefix+tag+"-") {
		t.Errorf("netns left behind:\n%s", list)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("directory %s left behind (%v)", dir, err)
	}
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%s/cmdline", e.Name()))
		if err == nil && bytes.Contains(cmdline, []byte(dir)) {
			t.Errorf("process %s left behind: %s", e.Name(), bytes.ReplaceAll(cmdline, []byte{0}, []byte{' '}))
		}
	}
	mounts, _ := os.ReadFile("/proc/self/mountinfo")
	if bytes.Contains(mounts, []byte(dir)) {
		t.Errorf("mounts left under %s", dir)
	}
}
