package pac

import (
	"net/netip"
	"os"
	"testing"

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
	w := <-s.p.idle
	t.Cleanup(func() {
		s.p.idle <- w
		s.Close()
	})
	return w
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
	w := <-s.p.idle
	defer func() { s.p.idle <- w }()
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
