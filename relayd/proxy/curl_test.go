package proxy

import (
	"encoding/json"
	"os/exec"
	"strings"
	"testing"

	"github.com/kl-egress/kl/tests/testutil"
)

// curl is the client most workloads' scripts use; these drive both proxies with it.
func TestWithCurl(t *testing.T) {
	testutil.RequireTool(t, "curl")
	w := newWorld()
	w.httpOrigin(t, "web.test")
	httpAddr, socksAddr := w.serve(t, nil)
	w.mu.Lock()
	webAddr := w.names["web.test"]
	w.mu.Unlock()
	tests := []struct {
		name     string
		args     []string
		wantURI  string
		wantBody string
		wantDial string
		wantFail string // curl's stderr contains this
	}{
		{name: "http forward", args: []string{"-x", "http://" + httpAddr, "http://web.test/fwd?x=1"}, wantURI: "/fwd?x=1", wantDial: "web.test:80"},
		{name: "http CONNECT tunnel", args: []string{"-p", "-x", "http://" + httpAddr, "http://web.test/tunnel"}, wantURI: "/tunnel", wantDial: "web.test:80"},
		{name: "http forward with Expect", args: []string{"-x", "http://" + httpAddr, "-H", "Expect: 100-continue", "--data-binary", "payload", "http://web.test/post"},
			wantURI: "/post", wantBody: "payload", wantDial: "web.test:80"},
		{name: "socks5 hostname", args: []string{"--socks5-hostname", socksAddr, "http://web.test/s5h"}, wantURI: "/s5h", wantDial: "web.test:80"},
		{name: "socks5 ip", args: []string{"--socks5", socksAddr, "http://" + webAddr + "/s5"}, wantURI: "/s5", wantDial: webAddr},
		{name: "http denied", args: []string{"-f", "-x", "http://" + httpAddr, "http://denied.test/"}, wantFail: "403"},
		{name: "CONNECT denied", args: []string{"-p", "-x", "http://" + httpAddr, "http://denied.test/"}, wantFail: "403"},
		{name: "socks5 denied", args: []string{"--socks5-hostname", socksAddr, "http://denied.test/"}, wantFail: "SOCKS5 connection to denied.test. (2)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := len(w.dialed())
			cmd := exec.Command("curl", append([]string{"-sS", "--max-time", "10", "--noproxy", ""}, tt.args...)...)
			var stderr strings.Builder
			cmd.Stderr = &stderr
			out, err := cmd.Output()
			if tt.wantFail != "" {
				if err == nil || !strings.Contains(stderr.String(), tt.wantFail) {
					t.Fatalf("curl %v: err %v, stderr %q; want a failure mentioning %q", tt.args, err, stderr.String(), tt.wantFail)
				}
				return
			}
			if err != nil {
				t.Fatalf("curl %v: %v\n%s", tt.args, err, stderr.String())
			}
			var s seen
			if err := json.Unmarshal(out, &s); err != nil {
				t.Fatalf("curl output %q: %v", out, err)
			}
			if s.RequestURI != tt.wantURI || s.Body != tt.wantBody {
				t.Fatalf("origin saw %+v, want URI %q body %q", s, tt.wantURI, tt.wantBody)
			}
			d := w.dialed()
			if len(d) != before+1 || d[before] != tt.wantDial {
				t.Fatalf("dials %v, want one more: %s", d[before:], tt.wantDial)
			}
		})
	}
	if strings.Contains(w.logs.String(), "web.test") {
		t.Fatalf("logs above debug name a destination:\n%s", w.logs.String())
	}
}
