package attach

import (
	"bufio"
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kl-egress/kl/netns"
	"github.com/kl-egress/kl/relayd/api"
	"github.com/kl-egress/kl/relayd/relay"
	"github.com/kl-egress/kl/rules"
	"github.com/kl-egress/kl/tests/testutil"
)

// TestExitDialsHandedAddress: the client exit carries a flow the relay decided to the
// address it is handed for this dial, not to the one the decided flow names first. The
// relay tries every address a proxied name was checked for (nothing listens on the
// first here, the echo server on the second); each attempt must reach the attach side
// with its own address.
func TestExitDialsHandedAddress(t *testing.T) {
	f := newFixture(t, "default: client\nrules:\n  - cidr: 192.0.2.0/24\n    action: deny\n")
	echo := echoServer(t, "corp") // 127.0.0.1
	var mu sync.Mutex
	var dialed []string
	f.attach(ClientOptions{Token: testToken, dialDest: func(ctx context.Context, network, addr string) (net.Conn, error) {
		mu.Lock()
		dialed = append(dialed, addr)
		mu.Unlock()
		return (&net.Dialer{}).DialContext(ctx, network, addr)
	}}, payWorkload)
	pod := testutil.NewNetns(t, "klatx")
	pol := f.policy.Load()
	exit := f.srv.Exit()
	refused := netip.AddrPortFrom(netip.MustParseAddr("127.0.0.9"), echo.Port())
	r := relay.New(relay.Options{HTTPPort: 15992, SOCKSPort: 15993, ConnectTimeout: 3 * time.Second,
		Policy: func() relay.Decider { return pol },
		Exits: map[string]relay.DialFunc{rules.ExitClient: func(ctx context.Context, w *api.Workload, dst relay.Dest) (net.Conn, error) {
			// The flow is decided for 127.0.0.9; both attempts keep its context, as
			// they would for a name that resolved to both addresses.
			return netns.DialFirst(ctx, []netip.AddrPort{dst.Addr, echo}, func(ctx context.Context, ap netip.AddrPort) (net.Conn, error) {
				return exit(ctx, w, relay.Dest{Addr: ap, Port: ap.Port()})
			})
		}},
		Log: slog.New(slog.DiscardHandler), Audit: f.audit})
	defer testutil.Shutdown(t, r)
	w := *payWorkload
	w.Netns, w.Mode = pod.Path, api.ModeProxy
	if _, err := r.Open(w); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	conn, err := netns.Dial(ctx, pod.Path, 0, "tcp4", "127.0.0.1:15992")
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(5 * time.Second))
	fmt.Fprintf(conn, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", refused, refused)
	line, _ := bufio.NewReader(conn).ReadString('\n')
	mu.Lock()
	defer mu.Unlock()
	if want := []string{refused.String(), echo.String()}; !strings.Contains(line, " 200") || fmt.Sprint(dialed) != fmt.Sprint(want) {
		t.Errorf("CONNECT answered %q, the attach side dialed %q; want 200 after dialing %q", line, dialed, want)
	}
}
