//go:build linux

package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/kl-egress/kl/tests/testutil"
)

// builderRef is the CI builder image: the seed's builder repository. The demo builds a
// one-layer busybox image locally and imports it under this name; nothing is pulled.
const builderRef = "registry.cn-hangzhou.aliyuncs.com/acme/builder/go:1.22"

// ctrNS is the containerd namespace the demo's containers live in.
const ctrNS = "kldemo"

// containerd is a containerd the demo started, with all its state under one directory.
type containerd struct {
	dir, address string
	proc         *proc
}

func (d *demo) startContainerd(ctx context.Context, env []string) (*containerd, error) {
	dir := filepath.Join(d.dir, "containerd")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	c := &containerd{dir: dir, address: filepath.Join(dir, "containerd.sock")}
	cfg := fmt.Sprintf(`version = 2
root = %q
state = %q
disabled_plugins = ["io.containerd.grpc.v1.cri", "io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper"]

[grpc]
  address = %q

[ttrpc]
  address = %q

[plugins."io.containerd.internal.v1.opt"]
  path = %q
`, filepath.Join(dir, "root"), filepath.Join(dir, "state"), c.address, c.address+".ttrpc", filepath.Join(dir, "opt"))
	cfgPath := filepath.Join(dir, "containerd.toml")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o644); err != nil {
		return nil, err
	}
	// Undo order (LIFO): unmount what is left under dir, after the shims and containerd.
	d.undo.push("unmount under "+dir, func() error { testutil.UnmountUnder(dir); return nil })
	d.undo.push("stop containerd shims", func() error {
		testutil.KillShims(c.address)
		testutil.RemoveEmptyCgroups(ctrNS)
		return nil
	})
	p, err := d.start(nil, filepath.Join(dir, "containerd.log"), env, 10*time.Second, "containerd", "--config", cfgPath)
	if err != nil {
		return nil, err
	}
	c.proc = p
	err = waitFor(ctx, 20*time.Second, func() bool {
		_, err := c.ctr(ctx, "version")
		return err == nil || p.exited()
	})
	if err != nil || p.exited() {
		return nil, fmt.Errorf("containerd did not come up:\n%s", p.tail())
	}
	return c, nil
}

func (c *containerd) ctr(ctx context.Context, args ...string) (string, error) {
	return output(ctx, "ctr", append([]string{"-a", c.address, "-n", ctrNS}, args...)...)
}

// runBuilder starts the CI builder container detached through kl-runtime (ctr's
// --runc-binary, as the packaging snippet configures containerd), in transparent mode
// (the node default of the demo's runtime.yaml), and registers its removal.
func (d *demo) runBuilder(ctx context.Context, c *containerd, id string) (pid int, err error) {
	img := filepath.Join(d.dir, "builder-image.tar")
	if err := testutil.BusyboxImage(img, testutil.Image{Ref: builderRef, Apps: []string{"sh", "cat", "echo", "sleep", "nc", "printf", "true"}}); err != nil {
		return 0, fmt.Errorf("build the builder image: %w", err)
	}
	if _, err := c.ctr(ctx, "images", "import", "--snapshotter", "native", img); err != nil {
		return 0, err
	}
	// ctr puts no image name into the OCI spec; CRI and nerdctl do. The annotation is
	// what those clients write, and what kl-runtime reads the image from.
	_, err = c.ctr(ctx, "run", "-d", "--snapshotter", "native",
		"--runtime", "io.containerd.runc.v2", "--runc-binary", filepath.Join(d.bin, "kl-runtime"),
		"--annotation", "io.containerd.image.name="+builderRef, "--annotation", "team=ci",
		builderRef, id, "sleep", "600")
	d.undo.push("delete container "+id, func() error {
		bg := context.Background()
		c.ctr(bg, "tasks", "kill", "-s", "KILL", id)
		waitFor(bg, 10*time.Second, func() bool { _, err := c.ctr(bg, "tasks", "delete", id); return err == nil })
		c.ctr(bg, "containers", "delete", id)
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("%w\ncontainerd:\n%s", err, c.proc.tail())
	}
	out, err := c.ctr(ctx, "tasks", "ls")
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) >= 2 && f[0] == id {
			return strconv.Atoi(f[1])
		}
	}
	return 0, fmt.Errorf("no task %s in:\n%s", id, out)
}
