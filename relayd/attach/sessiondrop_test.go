package attach

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kl-egress/kl/rules"
	"github.com/kl-egress/kl/tests/testutil"
)

// TestSessionDropResets: a flow whose session dies under it (kl-ctl stopped or killed, the
// laptop asleep, the daemon ending the session) fails on the daemon's side with
// ECONNRESET, reading and writing, so the relay resets the workload's connection: a clean
// end of stream there would make a cut download look complete. A flow the destination
// ended cleanly before the session died still ends cleanly, with all its bytes.
func TestSessionDropResets(t *testing.T) {
	const part = "part 1 of a long download\n"
	tests := []struct {
		name string
		// closeDst: the destination sends part and closes, and its end reaches the
		// daemon before the session dies; else it sends part and stays open.
		closeDst bool
		// byDaemon: the daemon ends the session; else the attach side stops.
		byDaemon bool
		wantRead error // what a read after part returns
	}{
		{"the attach side stops mid-transfer", false, false, syscall.ECONNRESET},
		{"the daemon ends the session mid-transfer", false, true, syscall.ECONNRESET},
		{"the destination ended before the session did", true, false, io.EOF},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFixture(t, clientAll)
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			release := make(chan struct{})
			testutil.Serve(t, ln, func(c net.Conn) {
				io.WriteString(c, part)
				if !tt.closeDst {
					<-release
				}
			})
			// The destination's handler returns at the test's end, before ln closes.
			t.Cleanup(func() { close(release) })
			_, stop := f.attach(ClientOptions{Token: testToken}, payWorkload)
			conn, err := f.srv.Dial(context.Background(), payWorkload, rules.Flow{Labels: payWorkload.Labels, Dst: ln.Addr().(*net.TCPAddr).AddrPort()}, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			conn.SetDeadline(time.Now().Add(5 * time.Second))
			if tt.closeDst {
				// Wait until the attach side's end of the stream reached the daemon, then
				// end the session before reading anything.
				fc := conn.(*flowConn)
				deadline := time.Now().Add(5 * time.Second)
				for !fc.fin.Load() {
					if time.Now().After(deadline) {
						t.Fatal("the destination's end never reached the daemon")
					}
					time.Sleep(5 * time.Millisecond)
				}
			} else {
				buf := make([]byte, len(part))
				if _, err := io.ReadFull(conn, buf); err != nil {
					t.Fatalf("reading the first part: %v", err)
				}
			}
			if tt.byDaemon {
				f.srv.pick(payWorkload).mux.Close()
			} else {
				stop()
			}
			f.waitLive(payWorkload, false)
			b, err := io.ReadAll(bufio.NewReader(conn))
			if err == nil {
				err = io.EOF // ReadAll's clean end
			}
			if !errors.Is(err, tt.wantRead) {
				t.Errorf("read after the session died = %v, want %v", err, tt.wantRead)
			}
			if tt.closeDst && string(b) != part {
				t.Errorf("read %q before the end, want %q", b, part)
			}
			if tt.wantRead == syscall.ECONNRESET {
				if _, err := conn.Write([]byte(strings.Repeat("x", 1024))); !errors.Is(err, syscall.ECONNRESET) {
					t.Errorf("write after the session died = %v, want ECONNRESET", err)
				}
			}
		})
	}
}
