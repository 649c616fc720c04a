package attach

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"testing"
)

// FuzzHeader feeds arbitrary bytes to the attach side's header reader: it must answer
// with a header or an error, never panic or read past its bound.
func FuzzHeader(f *testing.F) {
	frame := func(s string) []byte {
		b := make([]byte, 4, 4+len(s))
		binary.BigEndian.PutUint32(b, uint32(len(s)))
		return append(b, s...)
	}
	f.Add(frame(`{"flow":1,"at":"2026-11-30T05:00:00Z","workload":"w","dst":"203.0.113.7:443","port":443,"policy":"ab","exit":"client"}`))
	f.Add(frame(`{"flow":1,"at":"2026-11-30T05:00:00Z","workload":"w","host":"git.corp.example","port":22,"policy":"ab","exit":"client","process":{"Known":true,"Comm":"git"}}`))
	f.Add(frame(`{"flow":1,"unknown":true}`))
	f.Add(frame(`{"flow":1}{"flow":2}`))
	f.Add([]byte{0xff, 0xff, 0xff, 0xff})
	f.Add([]byte{0, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		var h Header
		if err := readFrame(bufio.NewReader(bytes.NewReader(b)), maxSmallFrame, &h); err != nil {
			return
		}
		if err := h.Check(); err != nil {
			return
		}
		fl := h.RulesFlow()
		if fl.ID != h.Flow || fl.Dst.Port() != h.Port || h.Dst.IsValid() && fl.Dst != h.Dst {
			t.Fatalf("RulesFlow lost fields: %+v from %+v", fl, h)
		}
		if h.dest() == "" {
			t.Fatalf("checked header without a destination: %+v", h)
		}
	})
}

// FuzzSelector: any selector text parses to a selector or an error, and a parsed one
// prints back to text that parses to the same selector.
func FuzzSelector(f *testing.F) {
	for _, s := range []string{"team=pay", "a,b=c", " x = y ", "=x", "a!=b", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		sel, err := ParseSelector(s)
		if err != nil {
			return
		}
		again, err := ParseSelector(sel.String())
		if err != nil || again.String() != sel.String() {
			t.Fatalf("ParseSelector(%q) = %q, which reparses to %q, %v", s, sel, again, err)
		}
	})
}
