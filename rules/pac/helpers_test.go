package pac

import (
	"net/netip"
	"os"
	"testing"
	"time"

	"github.com/dop251/goja"
)

// testWorker borrows one initialised runtime of a trivial script, so a test can
// evaluate expressions in the sandbox directly. It goes back to the pool afterwards.
func testWorker(t testing.TB, o Options) *worker {
	t.Helper()
	s, err := Compile("test.pac", "function FindProxyForURL(url, host) { return null; }", o)
	if err != nil {
		t.Fatalf("Compile: %v", err)
	}
	w, put := borrow(t, s)
	t.Cleanup(func() {
		put()
		s.Close()
	})
	return w
}

// borrow takes an idle runtime of the script's pool, whichever path it uses; put gives
// it back.
func borrow(t testing.TB, s *Script) (w *worker, put func()) {
	t.Helper()
	until := sinceBase() + 10*time.Second
	timer := time.NewTimer(firstTick(10 * time.Second))
	defer timer.Stop()
	if s.p.inline {
		h := s.p.getInline(&timer, until)
		if h == nil {
			t.Fatal("no idle runtime")
		}
		return h.w, func() { s.p.putInline(h) }
	}
	if w = s.p.acquire(timer, until); w == nil {
		t.Fatal("no idle runtime")
	}
	return w, func() { s.p.release(w) }
}

// eval runs a JavaScript expression in the worker's sandbox as if during call c.
func (w *worker) eval(c Call, expr string) (goja.Value, error) {
	w.call = c
	w.rng = c.Seed
	_, w.host = BuildURL(c)
	return w.vm.RunString(expr)
}

// evalString is eval with the value as a string ("EXC: ..." for an exception).
func (w *worker) evalString(c Call, expr string) string {
	v, err := w.eval(c, expr)
	if err != nil {
		if ex, ok := err.(*goja.Exception); ok {
			return "EXC: " + ex.Value().String()
		}
		return "ERR: " + err.Error()
	}
	return v.String()
}

// rawEval returns what FindProxyForURL returned, as a string, without the mapping.
func rawEval(t testing.TB, s *Script, c Call) string {
	t.Helper()
	w, put := borrow(t, s)
	defer put()
	if err := w.resetState(); err != nil {
		t.Fatalf("resetState: %v", err)
	}
	url, host := BuildURL(c)
	w.call, w.host, w.rng = c, host, c.Seed
	v, err := w.fn(goja.Undefined(), w.vm.ToValue(url), w.vm.ToValue(host))
	if err != nil {
		t.Fatalf("FindProxyForURL: %v", err)
	}
	return v.String()
}

func corporatePAC(t testing.TB) string {
	t.Helper()
	b, err := os.ReadFile("testdata/corporate.pac")
	if err != nil {
		t.Fatalf("read corporate.pac: %v", err)
	}
	return string(b)
}

func mustAddr(s string) netip.Addr { return netip.MustParseAddr(s) }
