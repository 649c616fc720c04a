package e2e

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/kl-egress/kl/tests/testutil"
)

// runPlugin runs the kl-cni binary as a runtime would and returns stdout, stderr.
func runPlugin(t *testing.T, cmd, netns string, stdin string) (string, string, error) {
	t.Helper()
	c := exec.Command(testutil.Bin(t, "kl-cni"))
	c.Env = append(os.Environ(), "CNI_COMMAND="+cmd, "CNI_CONTAINERID=plugin-test", "CNI_NETNS="+netns,
		"CNI_IFNAME=eth0", "CNI_PATH=/nonexistent")
	c.Stdin = strings.NewReader(stdin)
	var out, errb bytes.Buffer
	c.Stdout, c.Stderr = &out, &errb
	err := c.Run()
	return out.String(), errb.String(), err
}

// TestPluginProtocol checks the binary's protocol surface: VERSION, a CNI 1.0.0 config
// (result converted, nothing but the protocol on stdout), STATUS refused below 1.1.0 and
// errors as CNI error JSON.
func TestPluginProtocol(t *testing.T) {
	ns := testutil.NewNetns(t, "klv")
	out, _, err := runPlugin(t, "VERSION", "", `{"cniVersion":"1.1.0"}`)
	if err != nil {
		t.Fatalf("VERSION: %v", err)
	}
	var v struct {
		SupportedVersions []string `json:"supportedVersions"`
	}
	if json.Unmarshal([]byte(out), &v) != nil || strings.Join(v.SupportedVersions, ",") != "0.3.0,0.3.1,0.4.0,1.0.0,1.1.0" {
		t.Errorf("VERSION = %s", out)
	}

	// env mode: no relay needed; prevResult comes back in the config's version.
	conf := `{"cniVersion":"1.0.0","name":"n","type":"kl-cni","mode":"env","socket":"/nonexistent.sock",
"prevResult":{"cniVersion":"1.0.0","ips":[{"address":"192.0.2.9/24"}]}}`
	out, stderr, err := runPlugin(t, "ADD", ns.Path, conf)
	if err != nil {
		t.Fatalf("ADD (1.0.0, env): %v\n%s%s", err, out, stderr)
	}
	var res map[string]any
	if err := json.Unmarshal([]byte(out), &res); err != nil || res["cniVersion"] != "1.0.0" || !strings.Contains(out, "192.0.2.9/24") {
		t.Errorf("ADD stdout = %q (%v)", out, err)
	}

	// Transparent with the relay absent: a CNI error on stdout, exit status 1.
	conf = strings.Replace(conf, `"mode":"env",`, "", 1)
	out, _, err = runPlugin(t, "ADD", ns.Path, conf)
	var cerr struct {
		Code uint   `json:"code"`
		Msg  string `json:"msg"`
	}
	if err == nil || json.Unmarshal([]byte(out), &cerr) != nil || cerr.Code != 11 || !strings.Contains(cerr.Msg, "not reachable") {
		t.Errorf("ADD without relay: err %v, stdout %q", err, out)
	}
	// And DEL cleans up without it.
	if out, stderr, err := runPlugin(t, "DEL", ns.Path, conf); err != nil {
		t.Errorf("DEL without relay: %v %s %s", err, out, stderr)
	}
	if got := ns.Exec(t, "nft", "list", "tables"); strings.TrimSpace(got) != "" {
		t.Errorf("DEL left %s", got)
	}

	// STATUS is CNI 1.1.
	if out, _, err := runPlugin(t, "STATUS", "", conf); err == nil || !strings.Contains(out, "STATUS") {
		t.Errorf("STATUS on a 1.0.0 config: %v %s", err, out)
	}
}

// TestPluginLegacyVersions runs the binary with the pre-1.0 versions Calico and Flannel
// conflists declare: the prevResult (ips with "version", a result without cniVersion as
// older plugins print it) comes back in the config's version; CHECK is refused below
// 0.4.0 as the spec says.
func TestPluginLegacyVersions(t *testing.T) {
	ns := testutil.NewNetns(t, "klv")
	for _, v := range []string{"0.3.0", "0.3.1", "0.4.0"} {
		t.Run(v, func(t *testing.T) {
			prev := `{"cniVersion":"` + v + `","interfaces":[{"name":"eth0","sandbox":"` + ns.Path + `"}],` +
				`"ips":[{"version":"4","interface":0,"address":"192.0.2.9/24","gateway":"192.0.2.1"},{"version":"6","interface":0,"address":"fd00:9::9/64"}]}`
			conf := `{"cniVersion":"` + v + `","name":"n","type":"kl-cni","mode":"env","socket":"/nonexistent.sock","prevResult":` + prev + `}`
			out, stderr, err := runPlugin(t, "ADD", ns.Path, conf)
			if err != nil {
				t.Fatalf("ADD: %v\n%s%s", err, out, stderr)
			}
			var res struct {
				CNIVersion string `json:"cniVersion"`
				IPs        []struct {
					Version string `json:"version"`
					Address string `json:"address"`
				} `json:"ips"`
			}
			if err := json.Unmarshal([]byte(out), &res); err != nil || res.CNIVersion != v || len(res.IPs) != 2 ||
				res.IPs[0].Version != "4" || res.IPs[0].Address != "192.0.2.9/24" || res.IPs[1].Address != "fd00:9::9/64" {
				t.Errorf("ADD stdout = %q (%v)", out, err)
			}
			// A prevResult without its own cniVersion takes the config's.
			bare := strings.Replace(conf, `"prevResult":{"cniVersion":"`+v+`",`, `"prevResult":{`, 1)
			if out, stderr, err := runPlugin(t, "ADD", ns.Path, bare); err != nil || !strings.Contains(out, `"cniVersion": "`+v+`"`) {
				t.Errorf("ADD with a bare prevResult: %v\n%s%s", err, out, stderr)
			}
			out, _, err = runPlugin(t, "CHECK", ns.Path, conf)
			if v == "0.4.0" {
				if err != nil {
					t.Errorf("CHECK (0.4.0, env) = %v %s", err, out)
				}
			} else if err == nil || !strings.Contains(out, "CHECK") {
				t.Errorf("CHECK below 0.4.0: %v %s", err, out)
			}
			if out, stderr, err := runPlugin(t, "DEL", ns.Path, conf); err != nil {
				t.Errorf("DEL: %v %s %s", err, out, stderr)
			}
		})
	}
}
