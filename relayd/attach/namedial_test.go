package attach

import (
	"bufio"
	"context"
	"net"
	"net/netip"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/kl-egress/kl/rules"
)

// TestDialsWhatDecided: the attach side dials a flow's hostname only when its own
// decision rested on that name (relay.NameDecided's rule), else the address that was
// checked, whatever the header carries; a header with a name alone is dialled by it.
func TestDialsWhatDecided(t *testing.T) {
	echo := echoServer(t, "corp")
	// The flows claim 127.0.0.1 at echo's port: the address a cidr rule checked.
	checked := echo
	tests := []struct {
		name   string
		policy string
		host   string
		dst    netip.AddrPort
		want   string // what the attach side dials
	}{
		{"default: the name decided nothing", clientAll, "elsewhere.example", checked, checked.String()},
		{"cidr rule: the address decided", "default: deny\nrules:\n  - cidr: 127.0.0.0/8\n    action: client\n", "elsewhere.example", checked, checked.String()},
		{"port rule", "default: deny\nrules:\n  - port: \"" + strconv.Itoa(int(checked.Port())) + "\"\n    action: client\n", "elsewhere.example", checked, checked.String()},
		{"pattern prefix", "mode: proxy\ndefault: deny\nrules:\n  - pattern: \"127.0.0.0/8\"\n    route: client\n", "elsewhere.example", checked, checked.String()},
		{"domain rule: the name decided", "default: deny\nrules:\n  - domain: \"*.corp.example\"\n    action: client\n", "git.corp.example", checked, net.JoinHostPort("git.corp.example", strconv.Itoa(int(checked.Port())))},
		{"pattern host glob: the name decided", "mode: proxy\ndefault: deny\nrules:\n  - pattern: \"*.corp.example\"\n    route: client\n", "git.corp.example", checked, net.JoinHostPort("git.corp.example", strconv.Itoa(int(checked.Port())))},
		{"script answers by the address", "default: deny\nscript: |\n  function FindProxyForURL(url, host) { return isInNet(host, \"127.0.0.0\", \"255.0.0.0\") ? \"CLIENT\" : \"DIRECT\"; }\n", "elsewhere.example", checked, checked.String()},
		{"script answers by the name", "default: deny\nscript: |\n  function FindProxyForURL(url, host) { return dnsDomainIs(host, \".corp.example\") ? \"CLIENT\" : \"DIRECT\"; }\n", "git.corp.example", checked, net.JoinHostPort("git.corp.example", strconv.Itoa(int(checked.Port())))},
		{"address only", clientAll, "", checked, checked.String()},
		{"name only", clientAll, "git.corp.example", netip.AddrPort{}, net.JoinHostPort("git.corp.example", strconv.Itoa(int(checked.Port())))},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFixture(t, tt.policy)
			var mu sync.Mutex
			var dialled []string
			dial := func(ctx context.Context, network, addr string) (net.Conn, error) {
				mu.Lock()
				dialled = append(dialled, addr)
				mu.Unlock()
				return (&net.Dialer{}).DialContext(ctx, network, echo.String())
			}
			f.attach(ClientOptions{Token: testToken, dialDest: dial}, payWorkload)
			// The header as a daemon could write it (a correct relay drops a name that
			// did not decide; this side must not rely on that).
			st, err := f.srv.pick(payWorkload).mux.OpenStream()
			if err != nil {
				t.Fatal(err)
			}
			defer st.Close()
			st.SetDeadline(time.Now().Add(5 * time.Second))
			h := Header{Flow: 5, At: time.Now(), Workload: payWorkload.ID, Labels: payWorkload.Labels, Host: tt.host, Dst: tt.dst, Port: checked.Port(),
				Policy: f.policy.Load().Hash(), Exit: rules.ExitClient}
			if err := writeFrame(st, h); err != nil {
				t.Fatal(err)
			}
			var v Verdict
			if err := readFrame(bufio.NewReader(st), maxSmallFrame, &v); err != nil || !v.OK {
				t.Fatalf("verdict = %+v, %v", v, err)
			}
			mu.Lock()
			defer mu.Unlock()
			if len(dialled) != 1 || dialled[0] != tt.want {
				t.Errorf("dialled %q, want [%s]", dialled, tt.want)
			}
		})
	}
}
