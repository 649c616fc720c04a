//go:build linux

package main

import (
	"archive/tar"
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
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
	d.undo.push("unmount under "+dir, func() error { unmountUnder(dir); return nil })
	d.undo.push("stop containerd shims", func() error { killShims(c.address); return nil })
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
	if err := buildImage(img, builderRef); err != nil {
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

// killShims ends containerd-shim processes serving the containerd at address (they
// outlive containerd by design), by PID.
func killShims(address string) {
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		args := strings.Split(string(cmdline), "\x00")
		if len(args) == 0 || !strings.Contains(args[0], "containerd-shim") {
			continue
		}
		for i, a := range args {
			if a == "-address" && i+1 < len(args) && args[i+1] == address {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
	}
}

// unmountUnder lazily unmounts everything mounted below dir, deepest first.
func unmountUnder(dir string) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return
	}
	defer f.Close()
	var mps []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) > 4 && strings.HasPrefix(unescapeMount(fields[4]), dir+"/") {
			mps = append(mps, unescapeMount(fields[4]))
		}
	}
	for i := len(mps) - 1; i >= 0; i-- {
		_ = syscall.Unmount(mps[i], syscall.MNT_DETACH)
	}
}

func unescapeMount(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// buildImage writes a one-layer busybox-static image (OCI layout) that `ctr images
// import` loads under ref.
func buildImage(path, ref string) error {
	bbPath, err := exec.LookPath("busybox")
	if err != nil {
		return err
	}
	bb, err := os.ReadFile(bbPath)
	if err != nil {
		return err
	}
	mtime := time.Unix(1700000000, 0)
	var layer bytes.Buffer
	lw := tar.NewWriter(&layer)
	for _, d := range []string{"bin/", "etc/", "tmp/", "proc/", "dev/", "sys/"} {
		lw.WriteHeader(&tar.Header{Name: d, Typeflag: tar.TypeDir, Mode: 0o755, ModTime: mtime})
	}
	lw.WriteHeader(&tar.Header{Name: "bin/busybox", Typeflag: tar.TypeReg, Mode: 0o755, Size: int64(len(bb)), ModTime: mtime})
	lw.Write(bb)
	for _, app := range []string{"sh", "cat", "echo", "sleep", "nc", "printf", "true"} {
		lw.WriteHeader(&tar.Header{Name: "bin/" + app, Typeflag: tar.TypeSymlink, Linkname: "busybox", Mode: 0o777, ModTime: mtime})
	}
	if err := lw.Close(); err != nil {
		return err
	}
	blobs := map[string][]byte{}
	put := func(b []byte) (string, int) {
		sum := sha256.Sum256(b)
		d := hex.EncodeToString(sum[:])
		blobs[d] = b
		return "sha256:" + d, len(b)
	}
	layerDigest, layerSize := put(layer.Bytes())
	cfg, _ := json.Marshal(map[string]any{
		"architecture": "amd64", "os": "linux", "created": mtime.UTC().Format(time.RFC3339),
		"config": map[string]any{"Env": []string{"PATH=/bin"}, "Cmd": []string{"sh"}},
		"rootfs": map[string]any{"type": "layers", "diff_ids": []string{layerDigest}},
	})
	cfgDigest, cfgSize := put(cfg)
	manifest, _ := json.Marshal(map[string]any{
		"schemaVersion": 2,
		"mediaType":     "application/vnd.oci.image.manifest.v1+json",
		"config":        map[string]any{"mediaType": "application/vnd.oci.image.config.v1+json", "digest": cfgDigest, "size": cfgSize},
		"layers":        []any{map[string]any{"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": layerDigest, "size": layerSize}},
	})
	mDigest, mSize := put(manifest)
	index, _ := json.Marshal(map[string]any{
		"schemaVersion": 2,
		"manifests": []any{map[string]any{
			"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": mDigest, "size": mSize,
			"annotations": map[string]string{"io.containerd.image.name": ref},
		}},
	})
	var out bytes.Buffer
	w := tar.NewWriter(&out)
	file := func(name string, b []byte) {
		w.WriteHeader(&tar.Header{Name: name, Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(b)), ModTime: mtime})
		w.Write(b)
	}
	w.WriteHeader(&tar.Header{Name: "blobs/", Typeflag: tar.TypeDir, Mode: 0o755, ModTime: mtime})
	w.WriteHeader(&tar.Header{Name: "blobs/sha256/", Typeflag: tar.TypeDir, Mode: 0o755, ModTime: mtime})
	for d, b := range blobs {
		file("blobs/sha256/"+d, b)
	}
	file("oci-layout", []byte(`{"imageLayoutVersion":"1.0.0"}`))
	file("index.json", index)
	if err := w.Close(); err != nil {
		return err
	}
	return os.WriteFile(path, out.Bytes(), 0o644)
}
