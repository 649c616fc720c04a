package attach

import (
	"bufio"
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/kl-egress/kl/rules"
)

// TestPolicyFrameBound: a policy message carrying a rules file of the largest size the
// daemon loads (rules.MaxFileBytes), whose bytes JSON writes in base64, is within the
// bound the attach side reads policy frames with.
func TestPolicyFrameBound(t *testing.T) {
	var buf bytes.Buffer
	src := bytes.Repeat([]byte{0xff}, rules.MaxFileBytes)
	m := Control{Policy: &PolicyMsg{Name: strings.Repeat("n", 4096), Hash: strings.Repeat("h", 64), Source: src, Earlier: true}}
	if err := writeFrame(&buf, m); err != nil {
		t.Fatal(err)
	}
	var got Control
	if err := readFrame(bufio.NewReader(&buf), maxPolicyFrame, &got); err != nil {
		t.Fatalf("readFrame(a policy of %d bytes, bound %d) = %v, want it read", len(src), maxPolicyFrame, err)
	}
	if got.Policy == nil || !bytes.Equal(got.Policy.Source, src) {
		t.Fatalf("the policy read back differs from the one written")
	}
}

// TestLargePolicyAttaches: a session starts, and carries flows, under a rules file just
// under rules.MaxFileBytes; the attach side used to drop every such session (the frame
// was over its bound) and reconnect forever.
func TestLargePolicyAttaches(t *testing.T) {
	var b strings.Builder
	b.WriteString(clientAll)
	line := "# " + strings.Repeat("x", 1021) + "\n"
	for b.Len()+len(line) <= rules.MaxFileBytes-64 {
		b.WriteString(line)
	}
	f := newFixture(t, b.String())
	c, err := NewClient(ClientOptions{Server: f.addr, CAFile: f.pki.CAFile, Token: testToken, Getenv: func(string) string { return "" }})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { c.Keep(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	// Parsing the policy takes about a second on each side; more on a busy machine.
	deadline := time.Now().Add(30 * time.Second)
	for !f.srv.Live(payWorkload) || !c.Stats().Connected {
		if time.Now().After(deadline) {
			t.Fatalf("no session under a policy of %d bytes after 30s; the attach side's last error: %s", b.Len(), c.Stats().LastError)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if got, want := c.Stats().Policy, f.policy.Load().Hash(); got != want {
		t.Errorf("the attach side holds policy %.12s, want %.12s", got, want)
	}
}
