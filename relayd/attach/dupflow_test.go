package attach

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/hashicorp/yamux"

	"github.com/kl-egress/kl/rules"
)

// TestDuplicateFlowAttachSide: a second stream naming the id of a flow the attach side
// is carrying is refused with E_DUPLICATE_FLOW, and the first flow keeps its entry in
// the live table: the daemon's abort of that id still ends it.
func TestDuplicateFlowAttachSide(t *testing.T) {
	f := newFixture(t, clientAll)
	dst := echoServer(t, "corp")
	f.attach(ClientOptions{Token: testToken}, payWorkload)
	se := f.srv.pick(payWorkload)
	const id = 77
	open := func() (*yamux.Stream, *bufio.Reader, Verdict) {
		t.Helper()
		st, err := se.mux.OpenStream()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { st.Close() })
		st.SetDeadline(time.Now().Add(5 * time.Second))
		h := Header{Flow: id, At: time.Now(), Workload: payWorkload.ID, Labels: payWorkload.Labels, Dst: dst, Port: dst.Port(), Policy: f.policy.Load().Hash(), Exit: rules.ExitClient}
		if err := writeFrame(st, h); err != nil {
			t.Fatal(err)
		}
		br := bufio.NewReader(st)
		var v Verdict
		if err := readFrame(br, maxSmallFrame, &v); err != nil {
			t.Fatal(err)
		}
		return st, br, v
	}
	first, br, v := open()
	if !v.OK {
		t.Fatalf("first flow: %+v", v)
	}
	greeting := make([]byte, len("hello from corp\n"))
	if _, err := io.ReadFull(br, greeting); err != nil {
		t.Fatal(err)
	}
	tests := []struct{ name string }{{"while the first is carried"}, {"again"}}
	for _, tt := range tests {
		if _, _, v := open(); v.OK || v.Code != RefuseDuplicate {
			t.Fatalf("%s: second stream with flow %d: %+v, want %s", tt.name, id, v, RefuseDuplicate)
		}
	}
	// The first flow still carries bytes, and the abort of its id ends it.
	first.Write([]byte("ping"))
	buf := make([]byte, 4)
	if _, err := io.ReadFull(br, buf); err != nil || string(buf) != "ping" {
		t.Fatalf("first flow after the duplicates: %q, %v", buf, err)
	}
	se.abort(id)
	first.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := br.Read(buf); errors.Is(err, yamux.ErrTimeout) {
		t.Fatal("the abort of the first flow's id did not end it: the duplicates took its table entry")
	}
}

// TestDuplicateFlowDaemonSide: Dial refuses a flow whose id is live on the session (the
// attach side's aborts name flows by id) and keeps the first flow; every id a flow
// held, or a failed Dial reserved, is given up again.
func TestDuplicateFlowDaemonSide(t *testing.T) {
	f := newFixture(t, clientAll)
	dst := echoServer(t, "corp")
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := ln.Addr().(*net.TCPAddr).AddrPort()
	ln.Close()
	f.attach(ClientOptions{Token: testToken}, payWorkload)
	first, err := f.srv.Dial(context.Background(), payWorkload, rules.Flow{Labels: payWorkload.Labels, Dst: dst, ID: 42}, nil)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		id   uint64
		dst  netip.AddrPort
		want error
	}{
		{"the live id", 42, dst, ErrDuplicateFlow},
		{"another id", 43, dst, nil},
		{"refused by the attach side", 44, closed, ErrRefused},
	}
	for _, tt := range tests {
		c, err := f.srv.Dial(context.Background(), payWorkload, rules.Flow{Labels: payWorkload.Labels, Dst: tt.dst, ID: tt.id}, nil)
		if !errors.Is(err, tt.want) {
			t.Fatalf("%s: Dial = %v, want %v", tt.name, err, tt.want)
		}
		if c != nil {
			roundTrip(t, c, "hello from corp\n")
		}
	}
	roundTrip(t, first, "hello from corp\n") // closes it
	se := f.srv.pick(payWorkload)
	se.liveMu.Lock()
	defer se.liveMu.Unlock()
	if len(se.live) != 0 {
		t.Errorf("ids still held after every flow ended: %v", se.live)
	}
}
