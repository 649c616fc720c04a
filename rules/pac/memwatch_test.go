package pac

import (
	"reflect"
	"runtime"
	"strings"
	"testing"
	"time"
)

// TestIdleCostsNothing: a loaded PAC policy whose runtimes wait in their pool costs an
// idle daemon nothing: no goroutine of the package is awake (the heap watch ticked 200
// times a second for as long as a runtime existed). The only goroutines left are the
// hand-off runtimes' own, parked on their request channel. Goroutines are told apart
// by their stacks; the wait for the pool to settle is a bounded number of polls.
func TestIdleCostsNothing(t *testing.T) {
	for _, inline := range []bool{true, false} {
		s, err := compile("idle.pac", corporatePAC(t), Options{Deadline: 10 * time.Second}, inline)
		if err != nil {
			t.Fatalf("compile: %v", err)
		}
		t.Cleanup(s.Close)
		if p, _ := s.Path(); (p == PathInline) != inline {
			t.Fatalf("Path() = %q, want inline %v", p, inline)
		}
		for i := 0; i < 100; i++ {
			if r := s.Eval(Call{Host: "www.example.org"}); r.Failed {
				t.Fatalf("Eval: %+v", r)
			}
		}
	}
	var busy []string
	for i := 0; i < 500; i++ {
		if busy = busyGoroutines(); len(busy) == 0 {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Errorf("with no call running, %d goroutines of the package are not parked runtimes:\n\n%s",
		len(busy), strings.Join(busy, "\n\n"))
}

// busyGoroutines returns the stacks of the goroutines, other than the caller's, that
// run code of this package and are not a runtime's loop waiting for a request.
func busyGoroutines() []string {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	// "github.com/kl-egress/kl/rules/pac.", as stacks name the package's functions.
	pkg := strings.TrimSuffix(runtime.FuncForPC(reflect.ValueOf(busyGoroutines).Pointer()).Name(), "busyGoroutines")
	var busy []string
	for _, g := range strings.Split(string(buf), "\n\n")[1:] { // [0] is the caller
		lines := strings.Split(g, "\n")
		parked := strings.Contains(lines[0], "[chan receive")
		ours := false
		for _, l := range lines[1:] {
			if !strings.Contains(l, pkg) || strings.HasPrefix(l, "created by ") {
				continue
			}
			ours = true
			if !strings.Contains(l, pkg+"(*worker).loop(") {
				parked = false
			}
		}
		if ours && !parked {
			busy = append(busy, g)
		}
	}
	return busy
}
