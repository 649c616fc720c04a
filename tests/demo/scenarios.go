//go:build linux

package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/kl-egress/kl/relayd/api"
)

// target is a destination a flow goes to.
type target struct {
	label string     // as printed
	host  string     // HTTP host name ("" = by address)
	addr  netip.Addr // where it is
	srv   *dest
}

func (d *demo) targets() (npm, store, storeByIP, meta target) {
	npm = target{npmHost + ":80", npmHost, npmAddr, d.npmSrv}
	store = target{storeHost + ":80", storeHost, storeAddr, d.intSrv}
	storeByIP = target{storeAddr.String() + ":80", "", storeAddr, d.intSrv}
	meta = target{metaAddr.String() + ":80 (metadata)", "", metaAddr, d.intSrv}
	return
}

// want is what a flow should do: its decision and where it should leave from.
type want struct {
	exit string
	rule int
	dim  string
	via  string // squid exit name the destination should see, "" = the pod itself
	// kernel: the pod's nftables table decides the flow and never hands it to the relay
	// (169.254.0.0/16 is exempt from capture); its one record comes from conntrack, with
	// path "kernel", when the connection ends.
	kernel bool
}

// guard is the expectation for cloud metadata: direct, decided in the kernel.
var guard = want{exit: "direct", dim: "guard", kernel: true}

func (d *demo) scenarios(ctx context.Context) error {
	npm, store, storeByIP, meta := d.targets()
	dev, test, prod, web, builder := d.pods["tenant-dev"], d.pods["tenant-test"], d.pods["prod"], d.pods["web"], d.builder

	// 1. CI builder.
	r1, err := d.example("ci-builder.yaml", `"10.0.0.0/8,172.17.0.0/16"`, `"`+internalNet+`"`)
	if err != nil {
		return err
	}
	d.heading("1. CI builder image → proxy; the internal artifact store stays direct (examples/ci-builder.yaml)")
	if err := d.useRules(ctx, "examples/ci-builder.yaml, internal range 10.0.0.0/8,172.17.0.0/16 → "+internalNet, r1); err != nil {
		return err
	}
	d.flow(ctx, builder, npm, expect("proxy", 1, "image", "egress-a"))
	d.flow(ctx, web, store, expect("direct", 2, "cidr", ""))
	d.flow(ctx, prod, storeByIP, expect("direct", 2, "cidr", ""))
	d.note("  The builder's own flows all take the proxy, its artifact store included: the image tier")
	d.note("  (200) is tried before the cidr tier (500). kl-ctl explain shows it before the flow:")
	d.explain(ctx, r1, "--image", builderRef, "--host", storeHost, "--ip", storeAddr.String(), "--port", "80")
	d.flow(ctx, builder, store, expect("proxy", 1, "image", "egress-a"))
	d.flow(ctx, builder, meta, guard)

	// 2. Two tenants by label.
	r2, err := d.example("multi-exit.yaml")
	if err != nil {
		return err
	}
	d.heading("2. Two tenants by label → two exits, with their notes (examples/multi-exit.yaml)")
	if err := d.useRules(ctx, "examples/multi-exit.yaml as is", r2); err != nil {
		return err
	}
	d.flow(ctx, dev, npm, expect("proxy", 1, "label", "egress-a"))
	d.flow(ctx, test, npm, expect("egress-b", 2, "label", "egress-b"))
	d.flow(ctx, prod, npm, expect("direct", 3, "label", ""))
	d.flow(ctx, web, npm, expect("direct", 0, "default", ""))

	// 3. Forced direct.
	r3, err := d.example("forced-direct.yaml", `"10.0.0.0/8,172.16.0.0/12,172.17.0.0/16,192.168.0.0/16"`, `"`+internalNet+`"`)
	if err != nil {
		return err
	}
	d.heading("3. Internal ranges and cloud metadata always direct, even with default: proxy (examples/forced-direct.yaml)")
	if err := d.useRules(ctx, "examples/forced-direct.yaml, private ranges → "+internalNet, r3); err != nil {
		return err
	}
	d.flow(ctx, web, npm, expect("proxy", 0, "default", "egress-a"))
	d.flow(ctx, web, storeByIP, expect("direct", 1, "cidr", ""))
	d.flow(ctx, web, store, expect("direct", 3, "domain", ""))
	d.flow(ctx, dev, meta, guard)
	d.flow(ctx, builder, meta, guard)

	// 4. Live edit.
	d.heading("4. A rules edit picked up live (no pod or daemon restarted)")
	if err := d.useRules(ctx, "back to examples/multi-exit.yaml (shown above)", r2); err != nil {
		return err
	}
	d.flow(ctx, test, npm, expect("egress-b", 2, "label", "egress-b"))
	r4 := strings.Replace(r2, "exit: egress-b", "exit: egress-a", 1)
	r4 = strings.Replace(r4, `note: "exit B / egress-b"`, `note: "exit B moved to egress-a (link maintenance)"`, 1)
	if r4 == r2 || !strings.Contains(r4, "link maintenance") {
		return fmt.Errorf("examples/multi-exit.yaml changed: cannot make the demo's edit")
	}
	d.note("  edit: the test namespace (kl.route=proxy-b) moves to egress-a; rule 2 becomes:")
	fmt.Fprint(d.out, "    - label: kl.route=proxy-b\n      exit: egress-a\n      note: \"exit B moved to egress-a (link maintenance)\"\n")
	if err := d.useRules(ctx, "the file edited in place (shown above)", r4); err != nil {
		return err
	}
	d.flow(ctx, test, npm, expect("egress-a", 2, "label", "egress-a"))
	d.flow(ctx, dev, npm, expect("proxy", 1, "label", "egress-a"))
	d.containerRules(ctx, builder)

	// 5. Broken edit.
	d.heading("5. A broken edit is rejected with its reason code; the previous rules keep working")
	broken := r4 + "\n  # a typo in the action\n  - domain: \"*.npmjs.example\"\n    action: proxyy\n"
	d.note("  edit: a rule with a typo is appended:")
	fmt.Fprint(d.out, "    - domain: \"*.npmjs.example\"\n      action: proxyy\n")
	before, _ := d.status(ctx)
	code, msg, took, how, err := d.setRules(ctx, broken)
	if err != nil {
		return err
	}
	after, _ := d.status(ctx)
	d.check(code != "" && after.Rules.Hash == before.Rules.Hash,
		fmt.Sprintf("seen by %s in %dms and refused: %s — %s; live rules still %.12s…", how, took.Milliseconds(), code, msg, after.Rules.Hash),
		fmt.Sprintf("the broken file was not refused (code %q, hash %.12s → %.12s)", code, before.Rules.Hash, after.Rules.Hash))
	d.flow(ctx, test, npm, expect("egress-a", 2, "label", "egress-a"))
	d.flow(ctx, prod, npm, expect("direct", 3, "label", ""))
	return nil
}

// useRules installs a rules file live and prints it.
func (d *demo) useRules(ctx context.Context, what, body string) error {
	d.note("  rules: " + what)
	if !strings.Contains(what, "(shown above)") {
		fmt.Fprint(d.out, rulesBody(body))
	}
	code, msg, took, how, err := d.setRules(ctx, body)
	if err != nil {
		return err
	}
	if code != "" || msg != "" {
		return fmt.Errorf("kl-relayd refused the demo's rules (%s): %s", code, msg)
	}
	st, _ := d.status(ctx)
	d.note(fmt.Sprintf("  picked up live by kl-relayd (%s) in %dms, hash %.12s…", how, took.Milliseconds(), st.Rules.Hash))
	return nil
}

// explain prints kl-ctl explain's answer for one connection through a rules body.
func (d *demo) explain(ctx context.Context, body string, args ...string) {
	f := filepath.Join(d.dir, "explain.yaml")
	if err := writeFile(f, body); err != nil {
		return
	}
	fmt.Fprintf(d.out, "    $ kl-ctl explain --rules rules.yaml %s\n", strings.Join(args, " "))
	out, _ := exec.CommandContext(ctx, filepath.Join(d.bin, "kl-ctl"), append([]string{"explain", "--rules", f}, args...)...).CombinedOutput()
	for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		fmt.Fprintf(d.out, "    %s\n", d.style("2", strings.ReplaceAll(l, f, "rules.yaml")))
	}
}

// check prints a ✓ or ✗ line and counts it.
func (d *demo) check(ok bool, good, bad string) {
	if ok {
		d.passed++
		fmt.Fprintf(d.out, "  %s %s\n", d.style("32", "✓"), good)
		return
	}
	d.failed++
	fmt.Fprintf(d.out, "  %s %s\n", d.style("31", "✗"), bad)
}

// flow sends one HTTP request from p to t, then prints the relay's decision record for it
// next to the address the destination saw, and whether both match w.
func (d *demo) flow(ctx context.Context, p *pod, t target, w want) {
	d.flowSeq++
	id := fmt.Sprintf("%d-%d", d.flowSeq, time.Now().UnixNano()%1e6)
	before := d.lastAt
	host := t.host
	if host == "" {
		host = t.addr.String()
	}
	logLines := map[string]int{}
	for name, sq := range d.squids {
		logLines[name] = len(sq.accessLog())
	}
	ferr := d.send(ctx, p, t, host, id)
	if ctx.Err() != nil {
		return // interrupted: no verdict
	}
	// The decision: the audit records that appeared since the previous flow.
	var recs []api.Decision
	waitFor(ctx, 3*time.Second, func() bool {
		st, err := d.ctlStatus(ctx)
		if err != nil {
			return false
		}
		recs = recs[:0]
		for _, r := range st.Recent {
			if r.At.After(before) {
				recs = append(recs, r)
			}
		}
		return len(recs) > 0
	})
	var dec *api.Decision
	if len(recs) > 0 {
		dec = &recs[len(recs)-1]
		d.lastAt = dec.At
	}
	v, seenOK := t.srv.seen(id)

	line := fmt.Sprintf("%s → %s : ", p.name, t.label)
	if dec != nil {
		line += fmt.Sprintf("%s (rule %d, %s", dec.Exit, dec.Rule, dec.Dimension)
		if dec.Note != "" {
			line += fmt.Sprintf(", %q", dec.Note)
		}
		if dec.Reason != "" {
			line += ", reason " + dec.Reason
		}
		line += ")"
	} else {
		line += "no decision record"
	}
	wantSeen, seenName := p.addr, "the pod itself"
	if w.via != "" {
		wantSeen, seenName = d.squids[w.via].addr, "squid "+w.via
	}
	if seenOK {
		line += fmt.Sprintf(" ; destination saw %s", v.Peer)
		if v.Peer == p.addr {
			line += " (the pod itself)"
		}
		for name, sq := range d.squids {
			if v.Peer == sq.addr {
				line += " (squid " + name + ")"
			}
		}
	} else {
		line += " ; destination saw nothing"
		if ferr != nil {
			line += fmt.Sprintf(" (%v)", ferr)
		}
	}
	ok := dec != nil && dec.Exit == w.exit && dec.Rule == w.rule && dec.Dimension == w.dim && len(recs) == 1
	if w.kernel {
		ok = ok && dec.Path == "kernel"
	}
	ok = ok && seenOK && v.Peer == wantSeen
	if dec != nil && dec.Path != "" {
		line += " [decided in the " + dec.Path + "]"
	}
	bad := line + fmt.Sprintf("\n      expected %s (rule %d, %s) and the destination to see %s (%s)", w.exit, w.rule, w.dim, wantSeen, seenName)
	if w.kernel {
		bad += ", decided in the kernel"
	}
	if len(recs) > 1 {
		bad += fmt.Sprintf("; got %d decision records for one connection", len(recs))
	}
	d.check(ok, line, bad)
	// For a flow that left through a squid, that squid's own access log says so too.
	for name, sq := range d.squids {
		if seenOK && v.Peer == sq.addr {
			if l, err := sq.logged(ctx, logLines[name]); err == nil {
				d.note(fmt.Sprintf("      squid %s access.log: %s", name, l))
			}
		}
	}
}

// send makes one HTTP request from the pod: curl inside a CNI pod's netns, busybox nc
// inside the builder container (ctr tasks exec).
func (d *demo) send(ctx context.Context, p *pod, t target, host, id string) error {
	ctx, cancel := context.WithTimeout(ctx, 8*time.Second)
	defer cancel()
	path := "/flow/" + id
	if p.ctrID != "" {
		// stdin stays open a moment after the request: a CONNECT tunnel through squid is
		// torn down at the client's first FIN, which would drop the answer.
		script := fmt.Sprintf(`(printf 'GET %s HTTP/1.0\r\nHost: %s\r\n\r\n'; sleep 1) | nc %s 80`, path, host, t.addr)
		out, err := d.ctrd.ctr(ctx, "tasks", "exec", "--exec-id", "flow"+id, p.ctrID, "sh", "-c", script)
		if err != nil {
			return err
		}
		if !strings.Contains(out, " saw ") {
			return fmt.Errorf("unexpected answer %q", out)
		}
		return nil
	}
	url := fmt.Sprintf("http://%s%s", host, path)
	args := []string{"-sS", "-m", "5", "--noproxy", "*", url}
	if t.host != "" {
		args = append(args, "--resolve", fmt.Sprintf("%s:80:%s", t.host, t.addr))
	}
	_, err := p.ns.exec(ctx, "curl", args...)
	return err
}

// ctlStatus is `kl-ctl status --json`: the decision records come from the CLI an
// operator uses.
// An older kl-ctl without `status` makes the demo read the same object from the API.
func (d *demo) ctlStatus(ctx context.Context) (api.Status, error) {
	var st api.Status
	if !d.noCtlStatus {
		out, err := exec.CommandContext(ctx, filepath.Join(d.bin, "kl-ctl"), "status", "--json", "--socket", d.socket).Output()
		if err == nil && json.Unmarshal(out, &st) == nil {
			return st, nil
		}
		if ctx.Err() != nil {
			return st, ctx.Err()
		}
		d.noCtlStatus = true
		d.note(fmt.Sprintf("  (kl-ctl status --json failed: %v; decisions come from GET /v1/status instead)", err))
	}
	return d.status(ctx)
}

// showStatus prints `kl-ctl status` when the CLI has it, else the same facts from the
// daemon's status API.
func (d *demo) showStatus(ctx context.Context) {
	cmd := exec.CommandContext(ctx, filepath.Join(d.bin, "kl-ctl"), "status", "--socket", d.socket)
	fmt.Fprintf(d.out, "$ kl-ctl status --socket %s\n", d.socket)
	if out, err := cmd.CombinedOutput(); err == nil {
		fmt.Fprint(d.out, string(out))
		return
	}
	st, err := d.status(ctx)
	if err != nil {
		fmt.Fprintf(d.out, "  status: %v\n", err)
		return
	}
	d.note("  (kl-ctl status failed: the same from GET /v1/status on " + d.socket + ")")
	fmt.Fprintf(d.out, "  ready %v, up since %s, %d workloads\n", st.Ready, st.StartedAt.Format(time.TimeOnly), st.Workloads)
	fmt.Fprintf(d.out, "  rules %s, hash %.12s…, loaded %s\n", st.Rules.Path, st.Rules.Hash, st.Rules.LoadedAt.Format(time.TimeOnly))
	if st.Rules.LastError != "" {
		fmt.Fprintf(d.out, "  last reload refused (%s) at %s: %s\n", st.Rules.LastErrorCode, st.Rules.LastErrorAt.Format(time.TimeOnly), st.Rules.LastError)
	}
	byExit, _ := json.Marshal(st.Flows.ByExit)
	fmt.Fprintf(d.out, "  flows: %d total, %d active, by exit %s\n", st.Flows.Total, st.Flows.Active, byExit)
	fmt.Fprintf(d.out, "  hits:")
	for _, h := range st.Hits {
		fmt.Fprintf(d.out, "  rule %d/%s %d", h.Rule, h.Dimension, h.Count)
	}
	fmt.Fprintf(d.out, "\n  daemon: %d fds of %d, %d goroutines\n", st.FDs, st.FDLimit, st.Goroutines)
}

func expect(exit string, rule int, dim, via string) want {
	return want{exit: exit, rule: rule, dim: dim, via: via}
}

// showAudit prints the end of the audit file: the same records as JSON lines, which carry
// no destination, payload or identity and can be shipped as they are.
func (d *demo) showAudit(ctx context.Context) {
	path := filepath.Join(d.dir, "audit.jsonl")
	var lines []string
	// The daemon flushes the file about once a second.
	waitFor(ctx, 3*time.Second, func() bool {
		data, _ := os.ReadFile(path)
		lines = strings.Split(strings.TrimSpace(string(data)), "\n")
		return len(lines) >= d.passed-1 && lines[0] != ""
	})
	d.heading(fmt.Sprintf("audit file (%d JSON lines; the last 3)", len(lines)))
	for i := max(0, len(lines)-3); i < len(lines); i++ {
		fmt.Fprintf(d.out, "  %s\n", lines[i])
	}
}

// containerRules checks that the rules file kl-runtime mounted read-only into the builder
// container (/etc/kl/rules.yaml, for hops that re-evaluate the policy) is the live one:
// kl-relayd publishes every good load into a directory that containers mount at /etc/kl,
// so a reload reaches containers that were started before it.
func (d *demo) containerRules(ctx context.Context, p *pod) {
	out, err := d.ctrd.ctr(ctx, "tasks", "exec", "--exec-id", fmt.Sprintf("cat%d", d.flowSeq), p.ctrID, "cat", "/etc/kl/rules.yaml")
	if err != nil {
		d.check(false, "", fmt.Sprintf("cannot read /etc/kl/rules.yaml in %s: %v", p.name, err))
		return
	}
	st, err := d.status(ctx)
	if err != nil {
		d.check(false, "", fmt.Sprintf("kl-relayd status: %v", err))
		return
	}
	raw := sha256.Sum256([]byte(out))
	sum := hex.EncodeToString(raw[:])
	d.check(sum == st.Rules.Hash,
		fmt.Sprintf("%s's read-only /etc/kl/rules.yaml is the live file (%.12s…), published by kl-relayd", p.name, st.Rules.Hash),
		fmt.Sprintf("%s's read-only /etc/kl/rules.yaml is %.12s…, not the live %.12s…", p.name, sum, st.Rules.Hash))
}
