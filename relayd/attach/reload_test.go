package attach

import (
	"bufio"
	"crypto/tls"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/yamux"
)

// stuckPeer authenticates a session by hand and then never reads its control stream
// again: a laptop that hung, or a peer that stops reading on purpose.
func stuckPeer(t *testing.T, f *fixture) *yamux.Session {
	t.Helper()
	return rawPeer(t, f, "stuck", true)
}

// rawPeer opens a session to the daemon by hand, as a peer that does only what the test
// says: with a control stream, through which it authenticates as client when
// authenticate is set. The session ends with the test.
func rawPeer(t *testing.T, f *fixture, client string, authenticate bool) *yamux.Session {
	t.Helper()
	c, err := NewClient(ClientOptions{Server: f.addr, CAFile: f.pki.CAFile, Token: testToken})
	if err != nil {
		t.Fatal(err)
	}
	raw, err := net.Dial("tcp", f.addr)
	if err != nil {
		t.Fatal(err)
	}
	cfg := yamux.DefaultConfig()
	cfg.LogOutput = io.Discard
	mux, err := yamux.Client(tls.Client(raw, c.tls), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { mux.Close() })
	ctrl, err := mux.OpenStream()
	if err != nil {
		t.Fatal(err)
	}
	if !authenticate {
		return mux
	}
	ctrl.SetDeadline(time.Now().Add(5 * time.Second))
	writeFrame(ctrl, Hello{Version: Version, Token: testToken, Client: client})
	var w Welcome
	if err := readFrame(bufio.NewReader(ctrl), maxSmallFrame, &w); err != nil || w.Error != "" {
		t.Fatalf("welcome = %+v, %v", w, err)
	}
	return mux
}

// waitSessions waits until the daemon holds n live sessions.
func waitSessions(t *testing.T, f *fixture, n int) {
	t.Helper()
	for i := 0; len(f.srv.Sessions()) != n; i++ {
		if i == 1000 {
			t.Fatalf("%d sessions, want %d\nlog:\n%s", len(f.srv.Sessions()), n, f.log.String())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestReloadStuckSessions: a reload reaches every session at once. Sessions whose peer
// stopped reading do not hold up the policy of the others, they are ended, and Reload
// returns however many of them there are, also when a session's control stream is busy
// with another write.
func TestReloadStuckSessions(t *testing.T) {
	defer func(d time.Duration) { policySendTimeout = d }(policySendTimeout)
	policySendTimeout = 5 * time.Second
	// Larger than a stream's window, so a peer that does not read cannot take it.
	big := func(tag string) string {
		return clientAll + "# " + tag + " " + strings.Repeat("x", 320<<10) + "\n"
	}
	tests := []struct {
		name  string
		stuck int
		busy  bool // the test holds one stuck session's control stream, as a slow write would
	}{
		{"three stuck peers", 3, false},
		{"a busy control stream", 1, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFixture(t, clientAll)
			c, _ := f.attach(ClientOptions{Token: testToken}, payWorkload)
			healthy := f.srv.live()[0]
			var peers []*yamux.Session
			for range tt.stuck {
				peers = append(peers, stuckPeer(t, f))
			}
			waitSessions(t, f, 1+tt.stuck)
			if tt.busy {
				se := f.srv.live()[0] // the newest: a stuck peer
				se.ctrlMu.Lock()
				defer se.ctrlMu.Unlock()
			}
			f.policy.Store(mustPolicy(t, big(tt.name)))
			want := f.policy.Load().Hash()
			returned := make(chan struct{})
			go func() { f.srv.Reload(); close(returned) }()

			// The healthy session was sent the new policy while the stuck ones are still
			// being waited for: no stuck session delayed it.
			for i := 0; healthy.sentHash() != want; i++ {
				if i == 1000 {
					t.Fatalf("the healthy session never got the reloaded policy\nlog:\n%s", f.log.String())
				}
				time.Sleep(5 * time.Millisecond)
			}
			for i, p := range peers {
				if p.IsClosed() {
					t.Fatalf("stuck peer %d was ended before the healthy session got the policy: the sends were not concurrent", i)
				}
			}
			select {
			case <-returned:
			case <-time.After(4 * policySendTimeout):
				t.Fatal("Reload did not return")
			}
			// Every stuck session is ended; the healthy one stays.
			for i, p := range peers {
				select {
				case <-p.CloseChan():
				case <-time.After(5 * time.Second):
					t.Fatalf("stuck peer %d still has its session", i)
				}
			}
			waitSessions(t, f, 1)
			for i := 0; c.Stats().Policy != want; i++ {
				if i == 1000 {
					t.Fatalf("the healthy side holds %s, not the reloaded policy", c.Stats().Policy)
				}
				time.Sleep(5 * time.Millisecond)
			}
			if !c.Stats().Connected {
				t.Error("the healthy session was ended")
			}
		})
	}
}

// TestSessionsWhileBusy: status lists a session whose control stream is busy with a
// write to a slow peer without waiting for that write.
func TestSessionsWhileBusy(t *testing.T) {
	f := newFixture(t, clientAll)
	f.attach(ClientOptions{Token: testToken}, payWorkload)
	se := f.srv.live()[0]
	se.ctrlMu.Lock() // as a policy or abort write to a peer that stopped reading holds it
	defer se.ctrlMu.Unlock()
	got := make(chan []SessionInfo, 1)
	go func() { got <- f.srv.Sessions() }()
	select {
	case ss := <-got:
		if len(ss) != 1 || ss[0].Policy != f.policy.Load().Hash() {
			t.Errorf("Sessions() = %+v, want the session holding %s", ss, f.policy.Load().Hash())
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Sessions() waits behind the session's control stream")
	}
}
