package daemon

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"path/filepath"
	"reflect"
	"testing"

	containers "github.com/containerd/containerd/api/services/containers/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/kl-egress/kl/relayd/api"
	"github.com/kl-egress/kl/relayd/config"
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

// fakeContainerd serves containerd's containers service on a unix socket: a ctr
// container and a sandbox-shaped id in namespace default, a CRI pod sandbox in k8s.io.
func fakeContainerd(t *testing.T) string {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "containerd.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	containers.RegisterContainersServer(srv, &fakeContainers{byNS: map[string]map[string]*containers.Container{
		"default": {
			"ctr1":     {ID: "ctr1", Image: "busybox:1.36", Labels: map[string]string{"team": "pay", "app": "engine"}},
			"sandbox1": {ID: "sandbox1", Image: "alpine", Labels: map[string]string{"tier": "back"}},
			"badimage": {ID: "badimage", Image: "UPPER/Case:!", Labels: map[string]string{"team": "pay"}},
		},
		"k8s.io": {
			"pod1": {ID: "pod1", Image: "registry.k8s.io/pause:3.9",
				Labels: map[string]string{"shop": "cart", "io.cri-containerd.kind": "sandbox"}},
		},
	}})
	go srv.Serve(ln)
	t.Cleanup(srv.Stop)
	return sock
}

type fakeContainers struct {
	containers.UnimplementedContainersServer
	byNS map[string]map[string]*containers.Container
}

func (f *fakeContainers) Get(ctx context.Context, req *containers.GetContainerRequest) (*containers.GetContainerResponse, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	for _, ns := range md.Get("containerd-namespace") {
		if c, ok := f.byNS[ns][req.GetID()]; ok {
			return &containers.GetContainerResponse{Container: c}, nil
		}
	}
	return nil, status.Error(codes.NotFound, "not found")
}

func TestEnrich(t *testing.T) {
	withID := func(id string) func() api.Workload {
		return func() api.Workload { w := self(); w.ID = id; return w }
	}
	for _, tc := range []struct {
		name               string
		docker, containerd string // "" off, "fake", "dead"
		w                  func() api.Workload
		labels             map[string]string
		image              string
	}{
		{"docker: labels merged, registration wins, image normalized", "fake", "", self,
			map[string]string{"app": "web", "tier": "front"}, "docker.io/library/nginx:latest"},
		{"docker: unknown container", "fake", "", withID("other"), map[string]string{"app": "web"}, ""},
		{"docker: engine down", "dead", "", self, map[string]string{"app": "web"}, ""},
		{"no engine configured", "", "", self, map[string]string{"app": "web"}, ""},
		{"containerd: ctr container", "", "fake", withID("ctr1"),
			map[string]string{"app": "web", "team": "pay"}, "docker.io/library/busybox:1.36"},
		{"containerd: CRI sandbox gives the pod's labels, not the pause image", "", "fake", withID("pod1"),
			map[string]string{"app": "web", "shop": "cart", "io.cri-containerd.kind": "sandbox"}, ""},
		{"containerd: unusable image reference keeps the labels", "", "fake", withID("badimage"),
			map[string]string{"app": "web", "team": "pay"}, ""},
		{"containerd: unknown container", "", "fake", withID("other"), map[string]string{"app": "web"}, ""},
		{"containerd: engine down", "", "dead", withID("ctr1"), map[string]string{"app": "web"}, ""},
		{"both: docker asked first", "fake", "fake", self,
			map[string]string{"app": "web", "tier": "front"}, "docker.io/library/nginx:latest"},
		{"both: containerd when docker does not know the id", "fake", "fake", withID("ctr1"),
			map[string]string{"app": "web", "team": "pay"}, "docker.io/library/busybox:1.36"},
		{"both: containerd when docker is down", "dead", "fake", withID("ctr1"),
			map[string]string{"app": "web", "team": "pay"}, "docker.io/library/busybox:1.36"},
		{"registration complete: no lookup needed", "dead", "dead",
			func() api.Workload { w := self(); w.Image = "docker.io/library/x:1"; return w },
			map[string]string{"app": "web"}, "docker.io/library/x:1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig(t, t.TempDir())
			switch tc.docker {
			case "fake":
				cfg.Docker = fakeDocker(t)
			case "dead":
				cfg.Docker = filepath.Join(t.TempDir(), "nothing.sock")
			}
			switch tc.containerd {
			case "fake":
				cfg.Containerd = config.Containerd{Socket: fakeContainerd(t), Namespaces: []string{"k8s.io", "default"}}
			case "dead":
				cfg.Containerd = config.Containerd{Socket: filepath.Join(t.TempDir(), "nothing.sock"), Namespaces: []string{"default"}}
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
