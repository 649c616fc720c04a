package cni

import (
	"encoding/json"
	"errors"
	"testing"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
)

// FuzzCommands feeds arbitrary stdin to every command (unguarded, so a panic fails the
// fuzzer): each either succeeds or returns a CNI error, and prints nothing on error. A
// successful ADD prints one JSON document.
func FuzzCommands(f *testing.F) {
	f.Add(string(conf("", true)))
	f.Add(string(conf(`,"excludeCIDRs":["10.96.0.0/12","192.0.2.53"],"excludePorts":[53],"ipv6":false,"rejectQUIC":false,"timeout":"1s"`, true)))
	f.Add(string(conf(`,"runtimeConfig":{"io.kubernetes.cri.pod-annotations":{"kl.egress.mode":"proxy"}}`, true)))
	f.Add(`{"cniVersion":"0.3.1","name":"n","type":"kl-cni","prevResult":{"cniVersion":"0.3.1","ips":[{"version":"4","interface":7,"address":"192.0.2.1/24"}]}}`)
	f.Add(`{"cniVersion":"1.1.0","name":"n","type":"kl-cni","cni.dev/valid-attachments":[{"containerID":"x"}]}`)
	f.Add(`{"cniVersion":"9.9.9","prevResult":{"cniVersion":"9.9.9"}}`)
	f.Add(`{"timeout":"-1s","mode":"","excludeCIDRs":["::ffff:1.2.3.4/128","0.0.0.0/0","10.0.0.1/8"]}`)
	f.Add(string(conf(`,"timeout":5,"excludeCIDRs":"10.96.0.0/12","ipv6":"false","excludePorts":[70000]`, true)))
	f.Add(`null`)
	f.Fuzz(func(t *testing.T, stdin string) {
		for _, cmd := range []struct {
			name string
			fn   func(*Plugin) func(*skel.CmdArgs) error
		}{
			{"ADD", func(p *Plugin) func(*skel.CmdArgs) error { return p.Add }},
			{"DEL", func(p *Plugin) func(*skel.CmdArgs) error { return p.Del }},
			{"CHECK", func(p *Plugin) func(*skel.CmdArgs) error { return p.Check }},
			{"STATUS", func(p *Plugin) func(*skel.CmdArgs) error { return p.Status }},
			{"GC", func(p *Plugin) func(*skel.CmdArgs) error { return p.GC }},
		} {
			p, _, _, out := newPlugin()
			err := cmd.fn(p)(args([]byte(stdin)))
			if err != nil {
				var e *types.Error
				if !errors.As(err, &e) || e.Code == 0 {
					t.Fatalf("%s: error %v is not a CNI error with a code", cmd.name, err)
				}
				if out.Len() != 0 {
					t.Fatalf("%s: stdout on error: %q", cmd.name, out)
				}
				continue
			}
			if cmd.name == "ADD" && !json.Valid(out.Bytes()) {
				t.Fatalf("ADD printed %q, not one JSON document", out)
			}
		}
	})
}
