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

// install cni --check, install-cni's readiness probe, succeeds only when the conflist
// runtimes use chains kl-cni as install leaves it and the kl-cni in --cni-bin-dir
// accepts the network's cniVersion; otherwise it fails saying why (a node where pods
// would start uncaptured must not look ready). It writes nothing, not even a lock file.
func TestRunCNICheck(t *testing.T) {
	calico := read(t, "10-calico.conflist")
	chained, err := CNI{}.Install(calico)
	if err != nil {
		t.Fatal(err)
	}
	withConf, err := CNI{Conf: map[string]any{"redirectPort": 15011}}.Install(calico)
	if err != nil {
		t.Fatal(err)
	}
	notLast := []byte(strings.Replace(string(chained), "    }\n  ]\n}\n", "    },\n    {\n      \"type\": \"tuning\"\n    }\n  ]\n}\n", 1))
	noCaps := []byte(strings.Replace(string(chained), ",\n      \"capabilities\": {\n        \"io.kubernetes.cri.pod-annotations\": true\n      }", "", 1))
	multus := []byte(`{"cniVersion": "0.3.1", "name": "multus-cni-network", "type": "multus", "kubeconfig": "/etc/cni/net.d/multus.d/multus.kubeconfig"}` + "\n")
	cases := []struct {
		name     string
		files    map[string][]byte
		versions []string // kl-cni's; nil: no kl-cni in the bin dir
		args     []string
		wantOut  string // stdout on success
		wantErr  string // substring of the error; "" for none
	}{
		{name: "chained", files: map[string][]byte{"10-calico.conflist": chained}, versions: []string{"0.3.1", "1.0.0"},
			wantOut: "10-calico.conflist: kl-cni is chained, the last of 4 plugins\n"},
		{name: "chained with --conf", files: map[string][]byte{"10-calico.conflist": withConf}, versions: []string{"0.3.1"},
			args: []string{"--conf", `{"redirectPort":15011}`}, wantOut: "10-calico.conflist: kl-cni is chained, the last of 4 plugins\n"},
		{name: "operator's settings are not kl's", files: map[string][]byte{"10-calico.conflist": withConf}, versions: []string{"0.3.1"},
			wantOut: "10-calico.conflist: kl-cni is chained, the last of 4 plugins\n"},
		{name: "another --conf value", files: map[string][]byte{"10-calico.conflist": withConf}, versions: []string{"0.3.1"},
			args: []string{"--conf", `{"redirectPort":15012}`}, wantErr: "kl-cni's entry lacks kl's settings"},
		{name: "not chained", files: map[string][]byte{"10-calico.conflist": calico}, versions: []string{"0.3.1"},
			wantErr: "kl-cni is not chained: no kl-cni entry"},
		{name: "not last", files: map[string][]byte{"10-calico.conflist": notLast}, versions: []string{"0.3.1"},
			wantErr: "kl-cni is not the last plugin"},
		{name: "no capabilities", files: map[string][]byte{"10-calico.conflist": noCaps}, versions: []string{"0.3.1"},
			wantErr: "kl-cni's entry lacks kl's settings"},
		{name: "multus conf first", files: map[string][]byte{"00-multus.conf": multus, "10-calico.conflist": chained}, versions: []string{"0.3.1"},
			wantErr: "00-multus.conf: kl-cni is not chained: a single-plugin network configuration"},
		{name: "cniVersion kl-cni does not support", files: map[string][]byte{"10-calico.conflist": chained}, versions: []string{"1.0.0", "1.1.0"},
			wantErr: `kl-cni is not chained: the network's cniVersion is "0.3.1"`},
		{name: "no kl-cni binary", files: map[string][]byte{"10-calico.conflist": chained},
			wantErr: "kl-cni is not chained: kl-cni is not installed"},
		{name: "no network yet", files: map[string][]byte{}, versions: []string{"0.3.1"},
			wantErr: "kl-cni is not chained: no CNI network configuration"},
		{name: "--cni-conf-file", files: map[string][]byte{"00-multus.conf": multus, "10-calico.conflist": chained}, versions: []string{"0.3.1"},
			args: []string{"--cni-conf-file", "NETD/10-calico.conflist"}, wantOut: "10-calico.conflist: kl-cni is chained, the last of 4 plugins\n"},
		{name: "--check with --watch", files: map[string][]byte{"10-calico.conflist": chained}, versions: []string{"0.3.1"},
			args: []string{"--watch"}, wantErr: "--check changes nothing"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			netd, bin := filepath.Join(dir, "net.d"), filepath.Join(dir, "bin")
			for _, d := range []string{netd, bin} {
				if err := os.MkdirAll(d, 0o755); err != nil {
					t.Fatal(err)
				}
			}
			for n, b := range tc.files {
				if err := os.WriteFile(filepath.Join(netd, n), b, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			if tc.versions != nil {
				if _, err := CopyBinary(fakePlugin(t, dir, tc.versions...), bin, "kl-cni"); err != nil {
					t.Fatal(err)
				}
			}
			args := []string{"install", "cni", "--check", "--cni-conf-dir", netd, "--cni-bin-dir", bin}
			for _, a := range tc.args {
				args = append(args, strings.ReplaceAll(a, "NETD", netd))
			}
			var out, errb bytes.Buffer
			err := Run(context.Background(), args, &out, &errb)
			switch {
			case tc.wantErr == "" && err != nil:
				t.Fatalf("Run(%q): %v", args, err)
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Fatalf("Run(%q) error = %v, want one containing %q", args, err, tc.wantErr)
			}
			if got := strings.ReplaceAll(out.String(), netd+"/", ""); got != tc.wantOut {
				t.Errorf("stdout = %q, want %q", got, tc.wantOut)
			}
			ents, _ := os.ReadDir(netd)
			if len(ents) != len(tc.files) {
				t.Errorf("--check left %d files in the conf dir, want the %d there were", len(ents), len(tc.files))
			}
			for n, b := range tc.files {
				if got := mustRead(t, filepath.Join(netd, n)); !bytes.Equal(got, b) {
					t.Errorf("--check changed %s", n)
				}
			}
		})
	}
}
