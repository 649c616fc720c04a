package testutil

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"time"
)

// Image describes a one-layer busybox-static test image (nothing is pulled).
type Image struct {
	Ref       string   // the name `ctr images import` loads it under (io.containerd.image.name)
	RefName   string   // org.opencontainers.image.ref.name, when set
	DockerTag string   // when set, also a Docker manifest.json so `docker load` (20.10) accepts it
	Apps      []string // busybox applets linked into /bin
}

// BusyboxImage writes img as an image archive at path: an OCI image layout (and, with a
// DockerTag, a Docker manifest.json pointing at the same blobs) whose one layer holds the
// host's static busybox.
func BusyboxImage(path string, img Image) error {
	bbPath, err := exec.LookPath("busybox")
	if err != nil {
		return fmt.Errorf("busybox: %w", err)
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
	for _, app := range img.Apps {
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
	annotations := map[string]string{"io.containerd.image.name": img.Ref}
	if img.RefName != "" {
		annotations["org.opencontainers.image.ref.name"] = img.RefName
	}
	index, _ := json.Marshal(map[string]any{
		"schemaVersion": 2,
		"manifests": []any{map[string]any{
			"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": mDigest, "size": mSize,
			"annotations": annotations,
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
	if img.DockerTag != "" {
		hexOf := func(d string) string { return d[len("sha256:"):] }
		dockerManifest, _ := json.Marshal([]any{map[string]any{
			"Config":   "blobs/sha256/" + hexOf(cfgDigest),
			"RepoTags": []string{img.DockerTag},
			"Layers":   []string{"blobs/sha256/" + hexOf(layerDigest)},
		}})
		file("manifest.json", dockerManifest)
	}
	if err := w.Close(); err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	return os.WriteFile(path, out.Bytes(), 0o644)
}
