package publish

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kl-egress/kl/tests/testutil"
)

// TestBindMountFollowsPublish is the reason this package exists: in a private mount
// namespace, a read-only bind mount of the directory sees the content published after
// the mount was made, while a bind mount of the file (the old kl-runtime mount) stays
// pinned to the inode it saw.
func TestBindMountFollowsPublish(t *testing.T) {
	testutil.RequirePrivileged(t)
	testutil.RequireTool(t, "unshare", "mount")
	base := t.TempDir()
	dir := filepath.Join(base, "published")
	p := &Publisher{Dir: dir} // grace 0: the old generation is deleted at once
	if err := p.Publish([]byte("# v1\ndefault: direct\n")); err != nil {
		t.Fatal(err)
	}
	dirMnt := filepath.Join(base, "etc-kl")
	fileMnt := filepath.Join(base, "rules-file.yaml")
	if err := os.Mkdir(dirMnt, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(fileMnt, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	script := fmt.Sprintf(`set -e
mount --rbind %[1]s %[2]s
mount -o remount,bind,ro,nosuid,nodev,noexec %[2]s
mount --bind %[1]s/rules.yaml %[3]s
show() { printf 'dir=%%s file=%%s\n' "$(head -n1 %[2]s/rules.yaml)" "$(head -n1 %[3]s)"; }
show
read -r _
show
if echo x > %[2]s/rules.yaml 2>/dev/null; then echo write=ok; else echo write=refused; fi
`, dir, dirMnt, fileMnt)
	cmd := exec.Command("unshare", "--mount", "--propagation", "private", "sh", "-c", script)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	timer := time.AfterFunc(30*time.Second, func() { cmd.Process.Kill() })
	defer timer.Stop()
	defer cmd.Wait()
	defer stdin.Close()
	lines := bufio.NewScanner(stdout)
	next := func() string {
		if !lines.Scan() {
			cmd.Process.Kill()
			cmd.Wait()
			t.Fatalf("mount namespace script ended early: %v; stderr: %s", lines.Err(), stderr.String())
		}
		return lines.Text()
	}
	if got, want := next(), "dir=# v1 file=# v1"; got != want {
		t.Fatalf("before publish: %q, want %q", got, want)
	}
	if err := p.Publish([]byte("# v2\ndefault: deny\n")); err != nil {
		t.Fatal(err)
	}
	fmt.Fprintln(stdin, "go")
	// The directory mount follows the swap; the file mount still shows the deleted v1.
	if got, want := next(), "dir=# v2 file=# v1"; got != want {
		t.Fatalf("after publish: %q, want %q", got, want)
	}
	if got := next(); got != "write=refused" {
		t.Fatalf("writing through the read-only directory mount: %q", got)
	}
}
