package attach

import (
	"bufio"
	"context"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kl-egress/kl/rules"
)

// TestDialNotBehindControl: a flow's dial does not wait for a write on its session's
// control stream, neither for a reloaded policy the peer does not take nor for any other
// write that holds the stream; the header still names the policy the session was given.
func TestDialNotBehindControl(t *testing.T) {
	defer func(d time.Duration) { policySendTimeout = d }(policySendTimeout)
	// Long, so the stuck write is still blocked when the flow is expected through.
	policySendTimeout = 30 * time.Second
	tests := []struct {
		name   string
		reload bool // a reloaded policy larger than the stream's window is being written
	}{
		{"a reloaded policy the peer does not read", true},
		{"a write holding the control stream", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFixture(t, clientAll)
			// The attach side answers every flow but never reads its control stream.
			mux := stuckPeer(t, f)
			waitSessions(t, f, 1)
			se := f.srv.live()[0]
			headers := make(chan Header, 1)
			go func() {
				st, err := mux.AcceptStream()
				if err != nil {
					return
				}
				defer st.Close()
				var h Header
				if err := readFrame(bufio.NewReader(st), maxSmallFrame, &h); err != nil {
					return
				}
				headers <- h
				writeFrame(st, Verdict{OK: true})
			}()
			stuck := make(chan struct{}) // closed when the stuck write is over
			if tt.reload {
				f.policy.Store(mustPolicy(t, clientAll+"# big "+strings.Repeat("x", 320<<10)+"\n"))
				go func() { f.srv.Reload(); close(stuck) }()
			} else {
				se.ctrlMu.Lock() // as a write to a peer that stopped reading holds it
				defer se.ctrlMu.Unlock()
			}
			want := f.policy.Load().Hash()
			dst := echoServer(t, "corp")
			done := make(chan error, 1)
			go func() {
				conn, err := f.srv.Dial(context.Background(), payWorkload, rules.Flow{Labels: payWorkload.Labels, Dst: dst}, nil)
				if err == nil {
					conn.Close()
				}
				done <- err
			}()
			select {
			case err := <-done:
				if err != nil {
					t.Fatalf("Dial = %v", err)
				}
			case <-stuck:
				t.Fatal("the flow waited for the stuck write to end")
			case <-time.After(policySendTimeout / 2):
				t.Fatal("the flow waits behind the stuck write")
			}
			select {
			case <-stuck:
				t.Fatal("the write ended before the flow went through: the test proves nothing")
			default:
			}
			if h := <-headers; h.Policy != want {
				t.Errorf("header names policy %s, want %s (the live one the session was given)", short(h.Policy), short(want))
			}
		})
	}
}

// TestReloadOrder: of two reloads running at once, the one that read the older policy
// and sends it last does not replace the newer one, on the session nor on the attach
// side; nor does a flow that read the older policy.
func TestReloadOrder(t *testing.T) {
	tests := []struct {
		name string
		// late runs with the older policy read and held until the newer one was delivered.
		late func(f *fixture, dst netip.AddrPort)
	}{
		{"reload", func(f *fixture, _ netip.AddrPort) { f.srv.Reload() }},
		{"flow", func(f *fixture, dst netip.AddrPort) {
			conn, err := f.srv.Dial(context.Background(), payWorkload, rules.Flow{Labels: payWorkload.Labels, Dst: dst}, nil)
			if err != nil {
				f.t.Errorf("Dial = %v", err)
				return
			}
			conn.Close()
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFixture(t, clientAll)
			c, _ := f.attach(ClientOptions{Token: testToken}, payWorkload)
			older := mustPolicy(t, clientAll+"# older\n")
			newer := mustPolicy(t, clientAll+"# newer\n")
			read, release := make(chan struct{}), make(chan struct{})
			var once sync.Once
			hook := func() *rules.Policy {
				held := false
				once.Do(func() { held = true })
				if !held {
					return f.policy.Load()
				}
				close(read)
				<-release
				return older
			}
			f.policy.Store(older)
			f.policyHook.Store(&hook)
			lateDone := make(chan struct{})
			dst := echoServer(t, "corp")
			go func() { defer close(lateDone); tt.late(f, dst) }()
			<-read
			f.policy.Store(newer)
			f.srv.Reload()
			close(release)
			select {
			case <-lateDone:
			case <-time.After(10 * time.Second):
				t.Fatal("the late " + tt.name + " did not return")
			}
			se := f.srv.live()[0]
			if got := se.sentHash(); got != newer.Hash() {
				t.Errorf("the session was last sent %s, want the newer %s (older %s)", short(got), short(newer.Hash()), short(older.Hash()))
			}
			for i := 0; c.Stats().Policy != newer.Hash(); i++ {
				if i == 1000 {
					t.Fatalf("the attach side holds %s, want the newer %s (older %s)", short(c.Stats().Policy), short(newer.Hash()), short(older.Hash()))
				}
				time.Sleep(5 * time.Millisecond)
			}
		})
	}
}
