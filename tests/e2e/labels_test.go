package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kl-egress/kl/relayd/api"
)

// fakeDockerEngine answers the Docker Engine container list (the call kl-relayd makes to
// enrich a registration) with the given containers by id.
func fakeDockerEngine(t *testing.T, dir string, images map[string]string) string {
	t.Helper()
	sock := filepath.Join(dir, "docker.sock")
	ln, err := net.Listen("unix", sock)
	must(t, err)
	srv := &http.Server{ReadHeaderTimeout: 5 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var f map[string][]string
		json.Unmarshal([]byte(r.URL.Query().Get("filters")), &f)
		list := []map[string]any{}
		for _, id := range f["id"] {
			if img, ok := images[id]; ok {
				list = append(list, map[string]any{"Id": id, "Image": img, "Labels": map[string]string{"engine": "docker"}})
			}
		}
		json.NewEncoder(w).Encode(list)
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return sock
}

// TestLabelAndImageRules: pod labels passed by the runtime (CNI podLabels capability) and
// an image the daemon learns from the container engine (Docker API) each decide a flow.
func TestLabelAndImageRules(t *testing.T) {
	n := newNode(t, false)
	conf := filepath.Join(n.dir, "net.d", "10-kl.conflist")
	b, err := os.ReadFile(conf)
	must(t, err)
	b = []byte(strings.Replace(string(b), `"capabilities": {"io.kubernetes.cri.pod-annotations": true}`,
		`"capabilities": {"io.kubernetes.cri.pod-annotations": true, "podLabels": true}`, 1))
	must(t, os.WriteFile(conf, b, 0o644))
	must(t, os.WriteFile(n.rules, []byte(`default: direct
rules:
  - label: team=builders
    action: deny
    note: label rule
  - image: "registry.example/acme/*"
    action: deny
    note: image rule
`), 0o644))

	labeled := n.newPod("labeled")
	labeled.args[1] = `CAP_ARGS={"podLabels":{"team":"builders"}}`
	imaged := n.newPod("imaged")
	plain := n.newPod("plain")
	sock := fakeDockerEngine(t, n.dir, map[string]string{imaged.id: "registry.example/acme/app:1"})
	settings := filepath.Join(n.dir, "relayd.yaml")
	s, err := os.ReadFile(settings)
	must(t, err)
	must(t, os.WriteFile(settings, append(s, []byte("docker: "+sock+"\n")...), 0o600))
	n.server()
	n.startRelay()
	for _, p := range []*pod{labeled, imaged, plain} {
		if out, err := n.add(p); err != nil {
			t.Fatalf("ADD: %v\n%s\nrelay:\n%s", err, out, n.logs.String())
		}
	}
	for _, tc := range []struct {
		name      string
		p         *pod
		dim, exit string
	}{
		{"label", labeled, "label", "deny"},
		{"image from the engine", imaged, "image", "deny"},
		{"neither", plain, "default", "direct"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := visit(t, tc.p, "198.51.100.2:8080")
			if denied := errors.Is(err, syscall.ECONNRESET); denied != (tc.exit == "deny") || (!denied && err != nil) {
				t.Errorf("visit: %v, want exit %s", err, tc.exit)
			}
			if r := n.waitRecord(t, func(r api.Decision) bool { return r.Dimension == tc.dim && r.Exit == tc.exit }); r.Dimension != tc.dim || r.Exit != tc.exit {
				t.Errorf("decision %+v, want %s/%s", r, tc.exit, tc.dim)
			}
		})
	}
	reg, found, err := n.client().Get(context.Background(), imaged.id)
	if err != nil || !found || reg.Workload.Image != "registry.example/acme/app:1" || reg.Workload.Labels["engine"] != "docker" {
		t.Errorf("enriched registration = %+v %v %v", reg.Workload, found, err)
	}
}
