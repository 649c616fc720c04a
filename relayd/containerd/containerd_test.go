package containerd

import (
	"context"
	"errors"
	"net"
	"path/filepath"
	"reflect"
	"sync"
	"testing"
	"time"

	containers "github.com/containerd/containerd/api/services/containers/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// fakeContainers is containerd's containers service holding a fixed set of containers
// per namespace; it records the namespaces it was asked in.
type fakeContainers struct {
	containers.UnimplementedContainersServer
	byNS map[string]map[string]*containers.Container
	fail codes.Code // answer every Get with this code when set

	mu    sync.Mutex
	asked []string
}

func (f *fakeContainers) Get(ctx context.Context, req *containers.GetContainerRequest) (*containers.GetContainerResponse, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	ns := ""
	if v := md.Get(namespaceHeader); len(v) == 1 {
		ns = v[0]
	}
	f.mu.Lock()
	f.asked = append(f.asked, ns)
	f.mu.Unlock()
	if f.fail != codes.OK {
		return nil, status.Error(f.fail, "injected")
	}
	if ns == "" {
		return nil, status.Error(codes.FailedPrecondition, "namespace is required")
	}
	c, ok := f.byNS[ns][req.GetID()]
	if !ok {
		return nil, status.Errorf(codes.NotFound, "container %q in namespace %q: not found", req.GetID(), ns)
	}
	return &containers.GetContainerResponse{Container: c}, nil
}

func (f *fakeContainers) Asked() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.asked...)
}

func serve(t *testing.T, f *fakeContainers) string {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "containerd.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	containers.RegisterContainersServer(srv, f)
	go srv.Serve(ln)
	t.Cleanup(srv.Stop)
	return sock
}

func TestLookup(t *testing.T) {
	fake := &fakeContainers{byNS: map[string]map[string]*containers.Container{
		"k8s.io": {
			"pod1": {ID: "pod1", Image: "registry.k8s.io/pause:3.9",
				Labels: map[string]string{"app": "web", criKindLabel: criKindSandbox}},
		},
		"default": {
			"ctr1": {ID: "ctr1", Image: "docker.io/library/busybox:latest", Labels: map[string]string{"team": "pay"}},
			"pod1": {ID: "pod1", Image: "never-reached"},
		},
	}}
	sock := serve(t, fake)
	for _, tc := range []struct {
		name       string
		namespaces []string
		id         string
		want       Container
		found      bool
		asked      []string
	}{
		{"default namespaces, found in the second", nil, "ctr1",
			Container{ID: "ctr1", Namespace: "default", Image: "docker.io/library/busybox:latest", Labels: map[string]string{"team": "pay"}},
			true, []string{"k8s.io", "default"}},
		{"first namespace wins, CRI sandbox marked", nil, "pod1",
			Container{ID: "pod1", Namespace: "k8s.io", Image: "registry.k8s.io/pause:3.9",
				Labels: map[string]string{"app": "web", criKindLabel: criKindSandbox}, Sandbox: true},
			true, []string{"k8s.io"}},
		{"only the configured namespaces", []string{"default"}, "pod1",
			Container{ID: "pod1", Namespace: "default", Image: "never-reached"}, true, []string{"default"}},
		{"unknown everywhere", []string{"k8s.io", "default", "moby"}, "nope",
			Container{}, false, []string{"k8s.io", "default", "moby"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := len(fake.Asked())
			ct, found, err := Client{Socket: sock, Namespaces: tc.namespaces, Timeout: 5 * time.Second}.Lookup(context.Background(), tc.id)
			if err != nil || found != tc.found {
				t.Fatalf("Lookup(%s) = found %v, %v; want found %v", tc.id, found, err, tc.found)
			}
			if ct.Labels == nil && tc.want.Labels == nil {
				ct.Labels = nil
			}
			if !reflect.DeepEqual(ct, tc.want) {
				t.Errorf("Lookup(%s) = %+v\nwant %+v", tc.id, ct, tc.want)
			}
			if asked := fake.Asked()[before:]; !reflect.DeepEqual(asked, tc.asked) {
				t.Errorf("namespaces asked %v, want %v", asked, tc.asked)
			}
		})
	}
}

func TestLookupErrors(t *testing.T) {
	t.Run("no socket", func(t *testing.T) {
		start := time.Now()
		_, found, err := Client{Socket: filepath.Join(t.TempDir(), "none.sock"), Timeout: 5 * time.Second}.Lookup(context.Background(), "x")
		if found || !errors.Is(err, ErrUnavailable) {
			t.Errorf("Lookup on a missing socket = %v, %v; want ErrUnavailable", found, err)
		}
		// A missing socket fails at once, it does not wait out the timeout.
		if d := time.Since(start); d > 4*time.Second {
			t.Errorf("Lookup on a missing socket took %v", d)
		}
	})
	t.Run("not a containerd", func(t *testing.T) {
		sock := serve(t, &fakeContainers{fail: codes.PermissionDenied})
		_, found, err := Client{Socket: sock}.Lookup(context.Background(), "x")
		if found || err == nil || errors.Is(err, ErrUnavailable) || status.Code(errors.Unwrap(err)) != codes.PermissionDenied {
			t.Errorf("Lookup with a refusing service = %v, %v; want the PermissionDenied error", found, err)
		}
	})
	t.Run("does not answer in time", func(t *testing.T) {
		// A socket that accepts and never speaks: the lookup ends at its timeout.
		sock := filepath.Join(t.TempDir(), "mute.sock")
		ln, err := net.Listen("unix", sock)
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				defer c.Close()
			}
		}()
		_, found, err := Client{Socket: sock, Timeout: 200 * time.Millisecond}.Lookup(context.Background(), "x")
		if found || !errors.Is(err, ErrUnavailable) {
			t.Errorf("Lookup on a mute socket = %v, %v; want ErrUnavailable", found, err)
		}
	})
	t.Run("empty id", func(t *testing.T) {
		if _, _, err := (Client{Socket: "/nonexistent"}).Lookup(context.Background(), ""); err == nil {
			t.Error("Lookup(\"\"): no error")
		}
	})
}

func TestCheckNamespace(t *testing.T) {
	for _, tc := range []struct {
		name string
		ok   bool
	}{
		{"k8s.io", true}, {"default", true}, {"moby", true}, {"a-b_c.d", true},
		{"", false}, {"-a", false}, {"a..b", false}, {"a/b", false}, {"a b", false},
		{string(make([]byte, 77)), false},
	} {
		if err := CheckNamespace(tc.name); (err == nil) != tc.ok {
			t.Errorf("CheckNamespace(%q) = %v, want ok %v", tc.name, err, tc.ok)
		}
	}
}
