package runtime

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

// imageRef is the name the test image is loaded under (Docker form and normalized form).
const (
	imageTag  = "kltest/busybox:e2e"
	imageNorm = "docker.io/kltest/busybox:e2e"
)

// buildImage writes a one-layer busybox-static image archive that both `ctr images
// import` and `docker load` (20.10, which needs manifest.json) accept: an OCI image
// layout plus a Docker manifest.json pointing at the same blobs.
func buildImage(t *testing.T, path string) {
	t.Helper()
	bbPath, err := exec.LookPath("busybox")
	if err != nil {
		t.Fatalf("busybox: %v", err)
	}
	bb, err := os.ReadFile(bbPath)
	if err != nil {
		t.Fatal(err)
	}
	mtime := time.Unix(1700000000, 0)
	var layer bytes.Buffer
	lw := tar.NewWriter(&layer)
	for _, d := range []string{"bin/", "etc/", "tmp/", "proc/", "dev/", "sys/"} {
		lw.WriteHeader(&tar.Header{Name: d, Typeflag: tar.TypeDir, Mode: 0o755, ModTime: mtime})
	}
	lw.WriteHeader(&tar.Header{Name: "bin/busybox", Typeflag: tar.TypeReg, Mode: 0o755, Size: int64(len(bb)), ModTime: mtime})
	lw.Write(bb)
	for _, app := range []string{"sh", "cat", "env", "echo", "sleep", "wget", "nc", "ls", "grep", "true", "false", "tr", "cut"} {
		lw.WriteHeader(&tar.Header{Name: "bin/" + app, Typeflag: tar.TypeSymlink, Linkname: "busybox", Mode: 0o777, ModTime: mtime})
	}
	if err := lw.Close(); err != nil {
		t.Fatal(err)
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
			"annotations": map[string]string{"io.containerd.image.name": imageNorm, "org.opencontainers.image.ref.name": "e2e"},
		}},
	})
	hexOf := func(d string) string { return d[len("sha256:"):] }
	dockerManifest, _ := json.Marshal([]any{map[string]any{
		"Config":   "blobs/sha256/" + hexOf(cfgDigest),
		"RepoTags": []string{imageTag},
		"Layers":   []string{"blobs/sha256/" + hexOf(layerDigest)},
	}})

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
	file("manifest.json", dockerManifest)
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, out.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
}
