package daemon

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/kl-egress/kl/relayd/api"
)

// fakeDocker serves /containers/json on a unix socket with one known container.
func fakeDocker(t *testing.T) string {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "docker.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var f map[string][]string
		json.Unmarshal([]byte(r.URL.Query().Get("filters")), &f)
		list := []map[string]any{}
		if len(f["id"]) == 1 && f["id"][0] == "sandbox1" {
			list = append(list, map[string]any{"Id": "sandbox1", "Names": []string{"/web"}, "Image": "nginx",
				"Labels": map[string]string{"app": "engine", "tier": "front"}})
		}
		json.NewEncoder(w).Encode(list)
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return sock
}

func TestEnrichFromDocker(t *testing.T) {
	for _, tc := range []struct {
		name   string
		docker string // "" off, "fake", "dead"
		w      func() api.Workload
		labels map[string]string
		image  string
	}{
		{"labels merged, registration wins, image normalized", "fake", self,
			map[string]string{"app": "web", "tier": "front"}, "docker.io/library/nginx:latest"},
		{"unknown container", "fake", func() api.Workload { w := self(); w.ID = "other"; return w },
			map[string]string{"app": "web"}, ""},
		{"engine down", "dead", self, map[string]string{"app": "web"}, ""},
		{"not configured", "", self, map[string]string{"app": "web"}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig(t, t.TempDir())
			switch tc.docker {
			case "fake":
				cfg.Docker = fakeDocker(t)
			case "dead":
				cfg.Docker = filepath.Join(t.TempDir(), "nothing.sock")
			}
			c, _ := start(t, cfg)
			reg, err := c.Register(context.Background(), tc.w())
			if err != nil {
				t.Fatalf("Register = %v", err)
			}
			if !reflect.DeepEqual(reg.Workload.Labels, tc.labels) || reg.Workload.Image != tc.image {
				t.Errorf("registered labels %v image %q; want %v %q", reg.Workload.Labels, reg.Workload.Image, tc.labels, tc.image)
			}
		})
	}
}
