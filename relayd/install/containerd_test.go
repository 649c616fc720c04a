package install

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/kl-egress/kl/relayd/api/wire"
)

func klRuntime(t *testing.T, data []byte, path ...string) any {
	t.Helper()
	d, err := parseTOML(data, 0)
	if err != nil {
		t.Fatalf("installed config does not parse: %v\n%s", err, data)
	}
	rp, err := RuntimesPath(d.version)
	if err != nil {
		t.Fatal(err)
	}
	return lookup(d.value, append(append(rp, "kl"), path...)...)
}

// containerd copies a pod annotation into the OCI spec only when the runtime allow-lists
// it in pod_annotations: without it kl-runtime never sees a pod's kl.egress.mode while
// kl-cni (which gets every annotation) does, and the two disagree about the pod's mode.
func TestContainerdPodAnnotations(t *testing.T) {
	if ModeAnnotation != wire.LabelMode {
		t.Fatalf("ModeAnnotation = %q, want %q", ModeAnnotation, wire.LabelMode)
	}
	const v2 = "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.kl]\n  runtime_type = \"io.containerd.runc.v2\"\n"
	const opts = "\n  [plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.kl.options]\n    BinaryName = \"/usr/bin/kl-runtime\"\n"
	tests := []struct {
		name string
		in   string
		want []any
	}{
		{"fresh v1", string(read(t, "containerd-v1.toml")), []any{"kl.egress.mode"}},
		{"fresh v2", string(read(t, "containerd-v2-kubeadm.toml")), []any{"kl.egress.mode"}},
		{"fresh v3", string(read(t, "containerd-v3.toml")), []any{"kl.egress.mode"}},
		{"fresh empty", "version = 2\n", []any{"kl.egress.mode"}},
		{"kl without it", v2 + opts, []any{"kl.egress.mode"}},
		{"kl without it or a newline at the end", strings.TrimSuffix(v2, "\n"), []any{"kl.egress.mode"}},
		{"merged with the operator's", v2 + "  pod_annotations = [\"example.com/*\", 'io.x']  # ours\n" + opts, []any{"example.com/*", "io.x", "kl.egress.mode"}},
		{"merged across lines", v2 + "  pod_annotations = [\n    \"a\",\n    \"b\",\n  ]\n" + opts, []any{"a", "b", "kl.egress.mode"}},
		{"empty list", v2 + "  pod_annotations = []\n" + opts, []any{"kl.egress.mode"}},
		{"already there", v2 + "  pod_annotations = [\"kl.egress.mode\", \"x\"]\n" + opts, []any{"kl.egress.mode", "x"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Containerd{}.Install([]byte(tt.in))
			if err != nil {
				t.Fatalf("Install: %v", err)
			}
			if pa := klRuntime(t, got, "pod_annotations"); !reflect.DeepEqual(pa, tt.want) {
				t.Errorf("pod_annotations = %v, want %v:\n%s", pa, tt.want, got)
			}
			if again, err := (Containerd{}).Install(got); err != nil || !bytes.Equal(again, got) {
				t.Errorf("second Install = %v:\n%s", err, UnifiedDiff("once", "twice", got, again))
			}
			if strings.Contains(tt.in, "# ours") && !bytes.Contains(got, []byte("# ours")) {
				t.Errorf("the comment after the operator's list was lost:\n%s", got)
			}
		})
	}
	if _, err := (Containerd{}).Install([]byte(v2 + "  pod_annotations = \"kl.egress.mode\"\n")); err == nil || !strings.Contains(err.Error(), "pod_annotations") {
		t.Errorf("pod_annotations not a list: %v, want an error naming it", err)
	}
}

// Re-running install keeps whatever the operator added under runtime kl, and corrects
// only the keys kl owns, in place.
func TestContainerdReinstallKeepsOperatorKeys(t *testing.T) {
	in := []byte(`version = 2
[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"
  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
    SystemdCgroup = true

[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.kl]
  runtime_type = "io.containerd.runc.v1"  # stale
  # the operator's own settings
  privileged_without_host_devices = true
  container_annotations = ["io.example/*"]

  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.kl.options]
    BinaryName = "/opt/old/kl-runtime"
    Root = "/run/kl-runc"
`)
	out, err := Containerd{}.Install(in)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]any{
		"runtime_type":                    "io.containerd.runc.v2",
		"privileged_without_host_devices": true,
		"container_annotations":           []any{"io.example/*"},
		"pod_annotations":                 []any{"kl.egress.mode"},
		"options":                         map[string]any{"BinaryName": "/usr/bin/kl-runtime", "Root": "/run/kl-runc", "SystemdCgroup": true},
	}
	if got := klRuntime(t, out); !reflect.DeepEqual(got, want) {
		t.Errorf("runtime kl after re-install = %v, want %v:\n%s", got, want, UnifiedDiff("before", "after", in, out))
	}
	if !bytes.Contains(out, []byte("# the operator's own settings")) || !bytes.Contains(out, []byte(`runtime_type = "io.containerd.runc.v2"  # stale`)) {
		t.Errorf("comments inside kl's table were lost:\n%s", out)
	}
	if again, err := (Containerd{}).Install(out); err != nil || !bytes.Equal(again, out) {
		t.Errorf("third Install = %v:\n%s", err, UnifiedDiff("twice", "thrice", out, again))
	}

	// The reviewer's case: a table kl wrote itself (pod_annotations included) is left
	// exactly as it is.
	same := []byte(`version = 2
[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"
  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
    SystemdCgroup = true

[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.kl]
  runtime_type = "io.containerd.runc.v2"
  pod_annotations = ["kl.egress.mode"]
  snapshotter = "stargz"

  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.kl.options]
    BinaryName = "/usr/bin/kl-runtime"
    SystemdCgroup = true
`)
	if got, err := (Containerd{}).Install(same); err != nil || !bytes.Equal(got, same) {
		t.Errorf("Install of an installed config = %v:\n%s", err, UnifiedDiff("before", "after", same, got))
	}

	// SystemdCgroup follows the default runtime, also when that changed since.
	flipped := bytes.Replace(same, []byte("SystemdCgroup = true\n\n"), []byte("SystemdCgroup = false\n\n"), 1)
	got, err := Containerd{}.Install(flipped)
	if err != nil {
		t.Fatal(err)
	}
	if v := klRuntime(t, got, "options", "SystemdCgroup"); v != false {
		t.Errorf("SystemdCgroup = %v, want false like runc's:\n%s", v, got)
	}
	if v := klRuntime(t, got, "snapshotter"); v != "stargz" {
		t.Errorf("operator's snapshotter = %v, want kept", v)
	}

	// A layout kl cannot edit in place is rewritten only when nothing of the
	// operator's would be lost.
	inline := []byte("version = 2\n[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes]\n  kl = { runtime_type = \"io.containerd.runc.v2\", snapshotter = \"x\" }\n")
	if _, err := (Containerd{}).Install(inline); err == nil || !strings.Contains(err.Error(), "snapshotter") {
		t.Errorf("inline table with an operator key: %v, want an error naming the key", err)
	}
	inline = []byte("version = 2\n[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes]\n  kl = { runtime_type = \"io.containerd.runc.v2\" }\n")
	got, err = Containerd{}.Install(inline)
	if err != nil {
		t.Fatal(err)
	}
	if v := klRuntime(t, got, "options", "BinaryName"); v != "/usr/bin/kl-runtime" {
		t.Errorf("inline table of kl's own keys not replaced:\n%s", got)
	}
}

// Uninstalling leaves no default_runtime_name naming a runtime that is gone: containerd's
// CRI plugin refuses to start with one. It goes back to runc, as Docker's uninstall does
// with "default-runtime", and kl-ctl says so.
func TestContainerdUninstallResetsDefaultRuntime(t *testing.T) {
	in := []byte(`version = 2
[plugins."io.containerd.grpc.v1.cri".containerd]
  default_runtime_name = "kl"  # all pods through kl
  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
    runtime_type = "io.containerd.runc.v2"
`)
	inst, err := Containerd{}.Install(in)
	if err != nil {
		t.Fatal(err)
	}
	out, err := Containerd{}.Uninstall(inst)
	if err != nil {
		t.Fatal(err)
	}
	want := bytes.Replace(in, []byte(`default_runtime_name = "kl"`), []byte(`default_runtime_name = "runc"`), 1)
	if !bytes.Equal(out, want) {
		t.Errorf("uninstall:\n%s", UnifiedDiff("want", "got", want, out))
	}
	if again, err := (Containerd{}).Uninstall(out); err != nil || !bytes.Equal(again, out) {
		t.Errorf("second Uninstall = %v:\n%s", err, UnifiedDiff("once", "twice", out, again))
	}
	// Another default is not kl's business.
	other := bytes.Replace(inst, []byte(`"kl"  #`), []byte(`"runsc"  #`), 1)
	if got, err := (Containerd{}).Uninstall(other); err != nil || !bytes.Contains(got, []byte(`default_runtime_name = "runsc"`)) {
		t.Errorf("Uninstall changed another default runtime: %v\n%s", err, got)
	}

	dir := t.TempDir()
	p := filepath.Join(dir, "config.toml")
	if err := os.WriteFile(p, inst, 0o644); err != nil {
		t.Fatal(err)
	}
	var stdout, stderr bytes.Buffer
	if err := Run(context.Background(), []string{"uninstall", "containerd", "--config", p}, &stdout, &stderr); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(stderr.String(), `default_runtime_name was "kl"; set to "runc"`) {
		t.Errorf("kl-ctl did not say it reset the default runtime:\n%s", stderr.String())
	}
	if cur, _ := os.ReadFile(p); !bytes.Equal(cur, want) {
		t.Errorf("file after uninstall:\n%s", UnifiedDiff("want", "got", want, cur))
	}
}

// The operator's pod_annotations keep their layout and comments when kl adds its own:
// the docs promise comments survive, and a second install changes nothing.
func TestContainerdPodAnnotationsKeepComments(t *testing.T) {
	const head = "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.kl]\n  runtime_type = \"io.containerd.runc.v2\"\n"
	const opts = "\n  [plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.kl.options]\n    BinaryName = \"/usr/bin/kl-runtime\"\n"
	tests := []struct {
		name, in, want string
	}{
		{"one per line, trailing comma",
			"  pod_annotations = [\n    \"a.example/team\",  # who to call\n    'b.example/cost', # billing\n  ]\n",
			"  pod_annotations = [\n    \"a.example/team\",  # who to call\n    'b.example/cost', \"kl.egress.mode\", # billing\n  ]\n"},
		{"one per line, no trailing comma",
			"  pod_annotations = [\n    \"a\", # first\n    \"b\"  # second\n  ]  # the list\n",
			"  pod_annotations = [\n    \"a\", # first\n    \"b\", \"kl.egress.mode\"  # second\n  ]  # the list\n"},
		{"empty with a comment",
			"  pod_annotations = [ # none yet\n  ]\n",
			"  pod_annotations = [\"kl.egress.mode\" # none yet\n  ]\n"},
		{"one line",
			"  pod_annotations = [\"x\", \"y\"] # ours\n",
			"  pod_annotations = [\"x\", \"y\", \"kl.egress.mode\"] # ours\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Containerd{}.Install([]byte(head + tt.in + opts))
			if err != nil {
				t.Fatalf("Install: %v", err)
			}
			if want := head + tt.want + opts; string(got) != want {
				t.Errorf("Install:\n%s", UnifiedDiff("want", "got", []byte(want), got))
			}
			again, err := Containerd{}.Install(got)
			if err != nil || !bytes.Equal(again, got) {
				t.Errorf("second Install = %v:\n%s", err, UnifiedDiff("once", "twice", got, again))
			}
		})
	}
}
