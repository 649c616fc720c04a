package relay_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/kl-egress/kl/netns"
	"github.com/kl-egress/kl/relayd/api"
	"github.com/kl-egress/kl/relayd/audit"
	"github.com/kl-egress/kl/relayd/relay"
	"github.com/kl-egress/kl/rules"
	"github.com/kl-egress/kl/tests/testutil"
)

// TestAuditKeepsDestinationsOut runs failed flows through the relay as the daemon builds
// it (its own netns handles and dials, which the package's other tests replace): a
// captured transparent flow, CONNECT and forwarded requests to an address, CONNECT to a
// name, a SOCKS5 request for a name that does not resolve. Neither their audit records
// nor the relay's log (debug off) may name the destination (SPEC §5). Once with a policy
// that resolves proxied names before deciding (a cidr rule), once with one that does not.
func TestAuditKeepsDestinationsOut(t *testing.T) {
	testutil.RequireTool(t, "nft")
	pod := testutil.NewNetns(t, "klaud")
	srv := testutil.NewNetns(t, "klauds")
	testutil.Link(t, pod, []string{"192.0.2.1/24"}, srv, []string{"192.0.2.2/24"})
	const (
		mark     = 0x4b4c
		redirect = 15901
	)
	if err := netns.Install(pod.Path, netns.Capture{RedirectPort: redirect, Mark: mark}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { netns.Remove(pod.Path) })

	for _, tt := range []struct {
		name, policy string
		port         uint16 // nothing listens there: refused
	}{
		{"names dialed", "default: direct\n", 4711},
		// Another port: the first case's refused dials leave conntrack entries.
		{"names resolved first", "default: direct\nrules:\n  - cidr: 198.51.100.0/24\n    action: deny\n", 4712},
	} {
		t.Run(tt.name, func(t *testing.T) {
			dead := fmt.Sprintf("192.0.2.2:%d", tt.port)
			secrets := []string{"192.0.2.2", fmt.Sprintf(":%d", tt.port), "localhost", "no-such-name"}
			pol, err := rules.Parse("t", []byte(tt.policy), rules.LoadOptions{})
			if err != nil {
				t.Fatal(err)
			}
			aud, err := audit.New("", 0, 0, 64)
			if err != nil {
				t.Fatal(err)
			}
			var logs testutil.Buffer
			r := relay.New(relay.Options{
				RedirectPort: redirect, HTTPPort: 15980, SOCKSPort: 15981, Mark: mark,
				ConnectTimeout: 2 * time.Second,
				Policy:         func() relay.Decider { return pol },
				Audit:          aud,
				Log:            slog.New(slog.NewTextHandler(&logs, nil)),
			})
			defer testutil.Shutdown(t, r)
			for _, w := range []api.Workload{
				{ID: "t", Netns: pod.Path, Mode: api.ModeTransparent},
				{ID: "p", Netns: pod.Path, Mode: api.ModeProxy},
			} {
				if _, err := r.Open(w); err != nil {
					t.Fatal(err)
				}
			}
			flows := []struct {
				name, to, send string
			}{
				{"transparent", dead, ""},
				{"connect address", "127.0.0.1:15980", "CONNECT " + dead + " HTTP/1.1\r\n\r\n"},
				{"connect name", "127.0.0.1:15980", fmt.Sprintf("CONNECT localhost:%d HTTP/1.1\r\n\r\n", tt.port)},
				{"forward", "127.0.0.1:15980", "GET http://" + dead + "/ HTTP/1.1\r\nHost: " + dead + "\r\n\r\n"},
				{"socks name", "127.0.0.1:15981", socksConnect("no-such-name.invalid", tt.port)},
			}
			for _, f := range flows {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				c, err := netns.Dial(ctx, pod.Path, 0, "tcp4", f.to) // unmarked: captured
				cancel()
				if err != nil {
					// The relay may have refused the flow (a reset) before the connect
					// returned; the record count below still says whether it was seen.
					t.Logf("%s: %v", f.name, err)
					continue
				}
				c.SetDeadline(time.Now().Add(5 * time.Second))
				io.WriteString(c, f.send)
				io.Copy(io.Discard, bufio.NewReader(c)) // the refusal, then the end
				c.Close()
			}
			var recs []audit.Record
			for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
				if recs = aud.Recent(64); len(recs) >= len(flows) {
					break
				}
			}
			if len(recs) != len(flows) {
				t.Fatalf("%d audit records, want %d: %+v", len(recs), len(flows), recs)
			}
			for _, rec := range recs {
				if rec.Reason == "" {
					t.Errorf("record %+v has no reason", rec)
				}
				for _, s := range secrets {
					if strings.Contains(rec.Reason, s) {
						t.Errorf("audit record reason %q names %q", rec.Reason, s)
					}
				}
			}
			for _, s := range secrets {
				if strings.Contains(logs.String(), s) {
					t.Errorf("relay log names %q:\n%s", s, logs.String())
				}
			}
		})
	}
}

// socksConnect is a SOCKS5 greeting (no auth) and a CONNECT request for host:port.
func socksConnect(host string, port uint16) string {
	req := append([]byte{5, 1, 0, 5, 1, 0, 3, byte(len(host))}, host...)
	return string(append(req, byte(port>>8), byte(port)))
}
