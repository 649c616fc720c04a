package attach

import (
	"context"
	"log/slog"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kl-egress/kl/netns"
	"github.com/kl-egress/kl/relayd/api"
	"github.com/kl-egress/kl/relayd/relay"
	"github.com/kl-egress/kl/rules"
	"github.com/kl-egress/kl/tests/testutil"
)

// TestDecidedPolicyCarried: a transparent flow the relay decides `client` under one
// policy, with a reload to a policy that routes it elsewhere landing before the client
// exit dials, goes through: the header names the policy that decided, and the attach
// side decides again under it (under the newer one it refused E_ROUTE_MISMATCH). The
// session holds that policy already, or (it started after the reload) is sent it as an
// earlier one, which does not replace the attach side's current policy. On the event
// loop and on goroutines.
func TestDecidedPolicyCarried(t *testing.T) {
	testutil.RequireTool(t, "nft")
	pod := testutil.NewNetns(t, "klatp")
	far := testutil.NewNetns(t, "klatf")
	testutil.Link(t, pod, []string{"192.0.2.1/24"}, far, []string{"192.0.2.2/24"})
	const (
		mark     = 0x4b4d
		redirect = 15911
	)
	if err := netns.Install(pod.Path, netns.Capture{RedirectPort: redirect, Mark: mark}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { netns.Remove(pod.Path) })
	decided := mustPolicy(t, clientAll)            // the relay's decision: client
	reloaded := mustPolicy(t, "default: direct\n") // live at the dial: not client

	for i, tt := range []struct {
		name string
		// lateSession: the session starts after the reload, so it never held the
		// deciding policy; else it holds it and the reload lands between decision and
		// dial.
		lateSession bool
		loops       int
		mode        string
	}{
		{"reload before the dial, event loop", false, 1, api.ModeTransparent},
		{"reload before the dial, goroutines", false, -1, api.ModeTransparent},
		{"session started after the reload, event loop", true, 1, api.ModeTransparent},
		{"session started after the reload, goroutines", true, -1, api.ModeTransparent},
		{"reload before the dial, proxy mode", false, 1, api.ModeProxy},
		{"session started after the reload, proxy mode", true, 1, api.ModeProxy},
	} {
		t.Run(tt.name, func(t *testing.T) {
			f := newFixture(t, clientAll)
			f.policy.Store(decided)
			if tt.lateSession {
				f.policy.Store(reloaded)
			}
			echo := echoServer(t, "corp")
			c, _ := f.attach(ClientOptions{Token: testToken, dialDest: func(ctx context.Context, network, _ string) (net.Conn, error) {
				return (&net.Dialer{}).DialContext(ctx, network, echo.String())
			}}, payWorkload)

			var relayPolicy atomic.Pointer[rules.Policy]
			relayPolicy.Store(decided)
			exit := f.srv.Exit()
			var reload sync.Once
			r := relay.New(relay.Options{
				RedirectPort: redirect, HTTPPort: 15990, SOCKSPort: 15991, Mark: mark, Loops: tt.loops,
				ConnectTimeout: 5 * time.Second,
				Policy:         func() relay.Decider { return relayPolicy.Load() },
				Exits: map[string]relay.DialFunc{rules.ExitClient: func(ctx context.Context, w *api.Workload, dst relay.Dest) (net.Conn, error) {
					// The reload lands after the relay's decision, before the dial.
					reload.Do(func() {
						relayPolicy.Store(reloaded)
						f.policy.Store(reloaded)
						f.srv.Reload()
					})
					return exit(ctx, w, dst)
				}},
				Log: slog.New(slog.NewTextHandler(f.log, nil)),
			})
			defer testutil.Shutdown(t, r)
			w := api.Workload{ID: payWorkload.ID, Netns: pod.Path, Mode: tt.mode, Labels: payWorkload.Labels, Image: payWorkload.Image}
			if _, err := r.Open(w); err != nil {
				t.Fatal(err)
			}
			defer r.Close(w.ID)

			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			// Another port per case: conntrack keeps the previous case's entries.
			dst := "192.0.2.2:" + strconv.Itoa(4800+i)
			var conn net.Conn
			var err error
			if tt.mode == api.ModeProxy {
				conn, err = netns.Dial(ctx, pod.Path, 0, "tcp4", "127.0.0.1:15990")
				if err == nil {
					err = testutil.ConnectThrough(conn, dst)
				}
			} else {
				conn, err = netns.Dial(ctx, pod.Path, 0, "tcp4", dst) // unmarked: captured
			}
			if err != nil {
				t.Fatal(err)
			}
			roundTrip(t, conn, "hello from corp\n")
			if got := f.srv.live()[0].sentHash(); got != reloaded.Hash() {
				t.Errorf("the session's current policy is %s, want the reloaded %s", short(got), short(reloaded.Hash()))
			}
			// The reload's delivery is read on the control stream, maybe after the flow.
			for i := 0; c.Stats().Policy != reloaded.Hash(); i++ {
				if i == 1000 {
					t.Errorf("the attach side's current policy is %s, want the reloaded %s (the deciding one is %s)", short(c.Stats().Policy), short(reloaded.Hash()), short(decided.Hash()))
					break
				}
				time.Sleep(5 * time.Millisecond)
			}
			if t.Failed() {
				t.Logf("log:\n%s", f.log.String())
			}
		})
	}
}
