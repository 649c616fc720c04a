package runtime

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/kl-egress/kl/shim/config"
	"github.com/kl-egress/kl/shim/oci"
	"github.com/kl-egress/kl/shim/workload"
	"github.com/kl-egress/kl/tests/testutil"
)

// With real namespaces: a bind mount of the host's netns (what dockerd gives a
// --network host container, /var/run/docker/netns/default) gets no proxy-mode variables,
// a netns of its own (what dockerd gives a bridged container) does.
func TestPrepareNetnsPath(t *testing.T) {
	own := testutil.NewNetns(t, "klrt")
	host := filepath.Join(t.TempDir(), "default")
	if err := os.WriteFile(host, nil, 0o444); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("/proc/self/ns/net", host, "", unix.MS_BIND, ""); err != nil {
		testutil.Unavailable(t, "bind mount a netns: "+err.Error())
	}
	t.Cleanup(func() { unix.Unmount(host, unix.MNT_DETACH) })
	dockerFrom = func(*config.Config) workload.Lookup { return nil }
	for _, tt := range []struct {
		name, path string
		wantVars   bool
	}{
		{"host netns bind mount", host, false},
		{"own netns", own.Path, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			cfg := testConfig(t, "mode: proxy\n")
			b := writeBundle(t, netnsSpec(tt.path))
			if err := Prepare(context.Background(), cfg, Invocation{Command: "create", ContainerID: "c1", Bundle: b}, nil, config.Discard()); err != nil {
				t.Fatal(err)
			}
			s, err := oci.Load(b)
			if err != nil {
				t.Fatal(err)
			}
			env, _ := s.Env()
			if tt.wantVars {
				checkEnv(t, env, []string{"HTTP_PROXY=http://127.0.0.1:15080"}, nil)
			} else {
				checkEnv(t, env, nil, []string{"HTTP_PROXY="})
			}
		})
	}
}
