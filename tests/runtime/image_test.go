package runtime

import (
	"testing"

	"github.com/kl-egress/kl/tests/testutil"
)

// imageRef is the name the test image is loaded under (Docker form and normalized form).
const (
	imageTag  = "kltest/busybox:e2e"
	imageNorm = "docker.io/kltest/busybox:e2e"
)

// buildImage writes the test image archive that both `ctr images import` and
// `docker load` accept.
func buildImage(t *testing.T, path string) {
	t.Helper()
	err := testutil.BusyboxImage(path, testutil.Image{Ref: imageNorm, RefName: "e2e", DockerTag: imageTag,
		Apps: []string{"sh", "cat", "env", "echo", "sleep", "wget", "nc", "ls", "grep", "true", "false", "tr", "cut"}})
	if err != nil {
		t.Fatal(err)
	}
}
