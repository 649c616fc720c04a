package install

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Installing kl-cni again corrects only the keys kl owns in its entry ("type",
// "capabilities" and the keys of Conf): what an earlier --conf or the operator's own
// edit set there stays. redirectPort and mark must agree with the daemon's settings, so
// a plain re-run (an upgrade) that reset them would leave every new pod uncaptured. The
// second install's diff is golden (cni-reinstall/NAME.diff) when it changes anything.
func TestCNIReinstallKeepsSettings(t *testing.T) {
	settings := map[string]any{"excludeCIDRs": []any{"10.96.0.0/12"}, "redirectPort": 15011}
	// appendPlugin adds a plugin after kl's entry, the last one of a multi-line conflist.
	appendPlugin := func(s string) string {
		return strings.TrimSuffix(s, "    }\n  ]\n}\n") + "    },\n    {\n      \"type\": \"tuning\"\n    }\n  ]\n}\n"
	}
	cases := []struct {
		name  string
		file  string
		first CNI                 // the install before
		edit  func(string) string // the operator's edit of the installed file; nil: none
		again CNI                 // the install run again
		same  bool                // the second install leaves the file as it is
	}{
		{name: "conf-then-plain", file: "10-calico.conflist", first: CNI{Conf: settings}, again: CNI{}, same: true},
		{name: "conf-then-same-conf", file: "10-calico.conflist", first: CNI{Conf: settings}, again: CNI{Conf: settings}, same: true},
		{name: "hand-tuned", file: "10-calico.conflist", first: CNI{},
			edit: func(s string) string {
				return strings.Replace(s, "\"type\": \"kl-cni\",", "\"type\": \"kl-cni\",\n      \"mode\": \"proxy\",\n      \"mark\": 1337,\n      \"redirectPort\": 15011,", 1)
			},
			again: CNI{}, same: true},
		{name: "conf-changes-one-key", file: "10-calico.conflist", first: CNI{Conf: map[string]any{"mark": 1337, "redirectPort": 15011}},
			again: CNI{Conf: map[string]any{"redirectPort": 15012}}},
		{name: "conf-adds-a-key", file: "10-flannel.conflist", first: CNI{Conf: settings},
			again: CNI{Conf: map[string]any{"mode": "proxy"}}},
		{name: "capabilities-missing", file: "10-calico.conflist", first: CNI{Conf: settings},
			edit: func(s string) string {
				return strings.Replace(s, "\"capabilities\": {\n        \"io.kubernetes.cri.pod-annotations\": true\n      },\n      ", "", 1)
			},
			again: CNI{}},
		{name: "capabilities-wrong", file: "10-calico.conflist", first: CNI{Conf: settings},
			edit: func(s string) string {
				return strings.Replace(s, "\"io.kubernetes.cri.pod-annotations\": true", "\"io.kubernetes.cri.pod-annotations\": false", 1)
			},
			again: CNI{}},
		{name: "moved-to-the-end", file: "10-calico.conflist", first: CNI{Conf: settings}, edit: appendPlugin, again: CNI{}},
		{name: "compact", file: "05-compact-kl-in-middle.conflist", first: CNI{Conf: map[string]any{"mark": 1337}},
			again: CNI{Conf: map[string]any{"capabilities": map[string]any{}}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			installed, err := tc.first.Install(read(t, tc.file))
			if err != nil {
				t.Fatalf("first Install: %v", err)
			}
			if tc.edit != nil {
				edited := tc.edit(string(installed))
				if edited == string(installed) {
					t.Fatal("the test's edit changed nothing")
				}
				installed = []byte(edited)
			}
			got, err := tc.again.Install(installed)
			if err != nil {
				t.Fatalf("second Install: %v", err)
			}
			if tc.same {
				if !bytes.Equal(got, installed) {
					t.Errorf("second Install changed the file:\n%s", UnifiedDiff("first", "again", installed, got))
				}
				return
			}
			golden(t, "cni-reinstall/"+tc.name+".diff", []byte(UnifiedDiff("first", "again", installed, got)))
			again, err := tc.again.Install(got)
			if err != nil || !bytes.Equal(again, got) {
				t.Errorf("third Install = %v:\n%s", err, UnifiedDiff("second", "third", got, again))
			}
		})
	}
}

// The reviewer's repro through kl-ctl's command line: install cni with --conf, then
// again without (as an upgrade does): the second run changes nothing.
func TestRunCNIReinstall(t *testing.T) {
	dir := t.TempDir()
	netd, bin := filepath.Join(dir, "net.d"), filepath.Join(dir, "bin")
	if err := os.MkdirAll(netd, 0o755); err != nil {
		t.Fatal(err)
	}
	conf := filepath.Join(netd, "10-calico.conflist")
	if err := os.WriteFile(conf, read(t, "10-calico.conflist"), 0o644); err != nil {
		t.Fatal(err)
	}
	plugin := fakePlugin(t, dir, "0.3.1", "1.0.0")
	run := func(args ...string) string {
		t.Helper()
		var out, errb bytes.Buffer
		args = append([]string{"install", "cni", "--cni-conf-dir", netd, "--cni-bin-dir", bin, "--cni-binary", plugin}, args...)
		if err := Run(context.Background(), args, &out, &errb); err != nil {
			t.Fatalf("Run(%q): %v\n%s", args, err, errb.String())
		}
		return errb.String()
	}
	run("--conf", `{"excludeCIDRs":["10.96.0.0/12"],"redirectPort":15011}`)
	first := mustRead(t, conf)
	if msg := run(); !strings.Contains(msg, "kl is already in it; nothing to do") {
		t.Errorf("second install said:\n%s", msg)
	}
	if got := mustRead(t, conf); !bytes.Equal(got, first) {
		t.Errorf("second install changed the conflist:\n%s", UnifiedDiff("first", "second", first, got))
	}
}
