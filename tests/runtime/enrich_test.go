package runtime

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kl-egress/kl/relayd/api"
	"github.com/kl-egress/kl/tests/testutil"
)

// TestContainerdEnrichment: kl-relayd configured with the test's containerd (Debian's)
// learns a workload's labels and image from containerd when the registration names only
// the container id, and its decisions use them. Two ctr containers, one labelled and one
// not, both from the test image; each is registered with just its id and a pod netns
// (what a CNI ADD knows), and a flow from each is decided by the label rule and the
// image rule respectively, as `kl-ctl status --json` shows.
func TestContainerdEnrichment(t *testing.T) {
	t.Parallel()
	testutil.RequirePrivileged(t)
	testutil.RequireTool(t, "curl")
	dir := t.TempDir()
	c := startContainerd(t, dir, nil)
	img := filepath.Join(dir, "image.tar")
	buildImage(t, img)
	if r := c.ctr(t, "images", "import", "--snapshotter", "native", img); r.code != 0 {
		t.Fatalf("ctr images import: %s %s", r.stdout, r.stderr)
	}
	labelled, plain := testutil.Name("kle"), testutil.Name("kle")
	for _, args := range [][]string{
		{"--label", "team=pay", "--label", "app=from-containerd", imageNorm, labelled},
		{imageNorm, plain},
	} {
		r := c.ctr(t, append([]string{"containers", "create", "--snapshotter", "native"}, args...)...)
		if r.code != 0 {
			t.Fatalf("ctr containers create %v: exit %d %s %s", args, r.code, r.stdout, r.stderr)
		}
		id := args[len(args)-1]
		t.Cleanup(func() { c.ctr(t, "containers", "delete", id) })
	}

	// Rules: the label rule and the image rule deny with their own notes; without
	// enrichment both flows would take the default (direct).
	rulesPath := filepath.Join(dir, "rules.yaml")
	os.WriteFile(rulesPath, []byte("default: direct\nrules:\n"+
		"  - label: team=pay\n    action: deny\n    note: by-label\n"+
		"  - image: \"docker.io/kltest/*\"\n    action: deny\n    note: by-image\n"), 0o644)
	sock := filepath.Join(dir, "relayd.sock")
	// k8s.io first: the lookup must pass a namespace that does not have the id.
	settings := fmt.Sprintf("socket: %s\nstateDir: %s\nrules: %s\npublishedRules: \"-\"\ndebug: true\n"+
		"containerd:\n  socket: %s\n  namespaces: [k8s.io, kltest]\n",
		sock, filepath.Join(dir, "relayd-state"), rulesPath, c.Address)
	os.WriteFile(filepath.Join(dir, "relayd.yaml"), []byte(settings), 0o600)
	rl := &relayd{Socket: sock, client: api.NewClient(sock, 5*time.Second)}
	rl.daemon = startDaemon(t, filepath.Join(dir, "relayd.log"), nil, relaydBin(t), "--settings", filepath.Join(dir, "relayd.yaml"))
	t.Cleanup(func() { rl.stop(10 * time.Second) })
	if !waitFor(10*time.Second, func() bool { return rl.client.Ping(context.Background()) == nil }) {
		t.Fatalf("kl-relayd not ready:\n%s", rl.tail())
	}

	for _, tc := range []struct {
		id, wantImage, wantDim, wantNote string
		wantLabels                       map[string]string
	}{
		{labelled, imageNorm, "label", "by-label", map[string]string{"team": "pay", "app": "from-containerd"}},
		{plain, imageNorm, "image", "by-image", nil},
	} {
		pod := testutil.NewNetns(t, "kle")
		reg, err := rl.client.Register(context.Background(), api.Workload{ID: tc.id, Netns: pod.Path, Mode: api.ModeProxy, Source: "cni"})
		if err != nil {
			t.Fatalf("register %s: %v\n%s", tc.id, err, rl.tail())
		}
		if reg.Workload.Image != tc.wantImage {
			t.Errorf("%s registered with image %q, want %q from containerd", tc.id, reg.Workload.Image, tc.wantImage)
		}
		for k, v := range tc.wantLabels {
			if reg.Workload.Labels[k] != v {
				t.Errorf("%s registered with labels %v, want %s=%s from containerd", tc.id, reg.Workload.Labels, k, v)
			}
		}
		before := len(rl.status(t).Recent)
		out, _ := testutil.Output("ip", "netns", "exec", pod.Name, "curl", "-sS", "-m", "5", "-o", "/dev/null", "-w", "%{http_code}",
			"-x", fmt.Sprintf("http://127.0.0.1:%d", reg.Listeners.HTTP), "http://192.0.2.1:8080/")
		recent := rl.status(t).Recent
		if len(recent) != before+1 {
			t.Fatalf("%s: flow (curl: %s) left %d new decisions, want 1: %+v\n%s", tc.id, out, len(recent)-before, recent, rl.tail())
		}
		if d := recent[len(recent)-1]; d.Dimension != tc.wantDim || d.Note != tc.wantNote || d.Exit != "deny" {
			t.Errorf("%s: decision %+v, want dimension %s note %s exit deny", tc.id, d, tc.wantDim, tc.wantNote)
		}
		if err := rl.client.Deregister(context.Background(), tc.id); err != nil {
			t.Errorf("deregister %s: %v", tc.id, err)
		}
	}
	if log := rl.tail(); !strings.Contains(log, "enriched from the container engine") {
		t.Errorf("relay log does not say it enriched from containerd:\n%s", log)
	}
}
