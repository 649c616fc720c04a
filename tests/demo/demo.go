//go:build linux

package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/kl-egress/kl/relayd/api"
)

// The demo's addresses (all test ranges, all inside its own netns).
var (
	podSubnet   = "192.0.2.0/25"   // the CNI bridge network of the pods
	ctrNodeAddr = "192.0.2.129/30" // node side of the builder container's veth
	ctrAddr     = "192.0.2.130/30" // the builder container
	npmAddr     = mustAddr("203.0.113.10")
	squidAAddr  = mustAddr("203.0.113.18")
	squidBAddr  = mustAddr("203.0.113.22")
	storeAddr   = mustAddr("198.51.100.20") // the internal artifact store (internal range 198.51.100.0/24)
	metaAddr    = mustAddr("169.254.169.254")
	internalNet = "198.51.100.0/24"
)

const (
	npmHost   = "registry.npmjs.example"
	storeHost = "artifacts.internal.corp"
)

func mustAddr(s string) netip.Addr { return netip.MustParseAddr(s) }

type demo struct {
	out   io.Writer
	color bool
	root  string // module root
	bin   string // kl binaries
	cni   string // CNI plugins and cnitool
	dir   string // everything on disk
	undo  cleanups
	seq   int
	tag   string // unique per run: names of netns, veths and the container

	node, npm, internal, egA, egB *ns
	npmSrv, intSrv                *dest
	squids                        map[string]*squid // by exit name
	relayd                        *proc
	client                        *api.Client
	socket, rulesPath, netName    string
	pods                          map[string]*pod
	builder                       *pod
	ctrd                          *containerd
	lastAt                        time.Time // newest decision record already shown
	flowSeq                       int
	passed, failed                int
	noCtlStatus                   bool // kl-ctl has no working `status --json`
	stepStart                     time.Time
	inProgress                    bool // a progress line waits for its "done"
}

// pod is a workload the demo sends traffic from: a CNI pod (its own netns) or the
// builder container (reached through containerd).
type pod struct {
	name   string
	what   string // how it was made, for the summary
	ns     *ns
	addr   netip.Addr
	ctrID  string // builder container id (traffic runs inside it with ctr tasks exec)
	capArg string
}

// Run plays the whole demo. Cleanup always runs, whatever happened.
func Run(ctx context.Context, o Options) (err error) {
	if os.Geteuid() != 0 {
		return errors.New("the demo creates network namespaces and starts daemons: run it as root (sudo make demo)")
	}
	d := &demo{out: o.Out, color: o.Color, squids: map[string]*squid{}, pods: map[string]*pod{},
		tag: fmt.Sprintf("%d%d", os.Getpid()%10000, runSeq.Add(1))}
	t0 := time.Now()
	defer func() {
		start := time.Now()
		d.progress("cleaning up (pods, containers, daemons, netns, mounts, files)")
		if errs := d.undo.run(); len(errs) > 0 {
			for _, e := range errs {
				fmt.Fprintf(d.out, "    cleanup: %v\n", e)
			}
		}
		d.done(start)
		fmt.Fprintf(d.out, "\ndemo finished in %.1fs\n", time.Since(t0).Seconds())
		if ctx.Err() != nil {
			err = fmt.Errorf("interrupted (everything it had set up is removed): %w", context.Cause(ctx))
		}
	}()
	if err := d.prepare(ctx, o); err != nil {
		return err
	}
	if err := d.bringUp(ctx); err != nil {
		return err
	}
	if err := d.scenarios(ctx); err != nil {
		d.showLogs()
		return err
	}
	d.heading("kl-ctl status")
	d.showStatus(ctx)
	d.showAudit(ctx)
	fmt.Fprintf(d.out, "\n%d flows as expected, %d not\n", d.passed, d.failed)
	if d.failed > 0 {
		d.showLogs()
		return fmt.Errorf("%d flows did not match their expectation", d.failed)
	}
	return nil
}

// showLogs prints the end of the daemons' logs, to tell why something went wrong.
func (d *demo) showLogs() {
	if d.relayd != nil {
		d.heading("kl-relayd log (last lines)")
		fmt.Fprintln(d.out, lastLines(d.relayd.tail(), 25))
	}
	if data, err := os.ReadFile(filepath.Join(d.dir, "kl-runtime.log")); err == nil {
		d.heading("kl-runtime/kl-hook log (last lines)")
		fmt.Fprintln(d.out, lastLines(string(data), 10))
	}
}

func lastLines(s string, n int) string {
	l := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(l) > n {
		l = l[len(l)-n:]
	}
	return strings.Join(l, "\n")
}

// --- output ---

func (d *demo) style(code, s string) string {
	if !d.color {
		return s
	}
	return "\x1b[" + code + "m" + s + "\x1b[0m"
}

func (d *demo) heading(s string) { fmt.Fprintf(d.out, "\n%s\n", d.style("1", "== "+s)) }
func (d *demo) note(s string)    { fmt.Fprintf(d.out, "%s\n", d.style("2", s)) }

func (d *demo) progress(s string) {
	if d.inProgress {
		fmt.Fprintln(d.out)
	}
	fmt.Fprintf(d.out, "• %s … ", s)
	d.stepStart, d.inProgress = time.Now(), true
}

func (d *demo) done(start time.Time) {
	d.inProgress = false
	if start.IsZero() {
		start = d.stepStart
	}
	fmt.Fprintf(d.out, "%s\n", d.style("2", fmt.Sprintf("done (%.1fs)", time.Since(start).Seconds())))
}

// --- preparation ---

func (d *demo) prepare(ctx context.Context, o Options) error {
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil || strings.TrimSpace(string(out)) == "" {
		return fmt.Errorf("find the module root (go env GOMOD): %v", err)
	}
	d.root = filepath.Dir(strings.TrimSpace(string(out)))
	if !o.SkipDeps {
		fmt.Fprintf(d.out, "• dependencies (tests/deps.sh: Debian packages, CNI plugins) …\n")
		start := time.Now()
		cmd := exec.CommandContext(ctx, filepath.Join(d.root, "tests", "deps.sh"))
		cmd.Dir = d.root
		lw := &lineWriter{w: d.out, prefix: "    "}
		cmd.Stdout, cmd.Stderr = lw, lw
		if err := cmd.Run(); err != nil {
			return fmt.Errorf("tests/deps.sh: %w", err)
		}
		fmt.Fprintf(d.out, "  %s\n", d.style("2", fmt.Sprintf("dependencies ready (%.1fs)", time.Since(start).Seconds())))
	}
	for _, tool := range []string{"ip", "ss", "curl", "squid", "containerd", "ctr", "containerd-shim-runc-v2", "runc", "busybox"} {
		if _, err := exec.LookPath(tool); err != nil {
			return fmt.Errorf("%s is not installed (tests/deps.sh installs it)", tool)
		}
	}
	// A run killed with SIGKILL cannot clean up; say what it left (names differ per run, so
	// it is in nobody's way).
	if list, err := output(ctx, "ip", "netns", "list"); err == nil {
		var stale []string
		for _, l := range strings.Split(list, "\n") {
			if f := strings.Fields(l); len(f) > 0 && strings.HasPrefix(f[0], nsPrefix) {
				stale = append(stale, f[0])
			}
		}
		if len(stale) > 0 {
			d.note(fmt.Sprintf("  note: %d netns named %s* exist already (an earlier demo killed with SIGKILL, or one running now); remove them with ip netns del NAME", len(stale), nsPrefix))
		}
	}
	d.dir, err = os.MkdirTemp("", "kl-demo-")
	if err != nil {
		return err
	}
	dir := d.dir
	os.Chmod(dir, 0o755) // squid runs as its own user and needs to reach its directory
	d.undo.push("remove "+dir, func() error { return os.RemoveAll(dir) })
	if o.observe != nil {
		o.observe(d.tag, dir)
	}

	d.cni = os.Getenv("KL_CNI_BIN")
	if d.cni == "" {
		d.cni = filepath.Join(d.root, ".build", "cni")
	}
	for _, p := range []string{"bridge", "host-local", "loopback", "cnitool"} {
		if _, err := os.Stat(filepath.Join(d.cni, p)); err != nil {
			return fmt.Errorf("CNI plugin %s missing in %s (tests/deps.sh builds it): %w", p, d.cni, err)
		}
	}
	d.bin = os.Getenv("KL_BIN")
	if d.bin == "" || !allExist(d.bin, klBinaries) {
		d.progress("building kl (kl-relayd, kl-ctl, kl-cni, kl-runtime, kl-hook)")
		d.bin = filepath.Join(d.dir, "bin")
		cmd := exec.CommandContext(ctx, "go", append([]string{"build", "-o", d.bin + "/"}, klPackages...)...)
		cmd.Dir = d.root
		cmd.Env = append(os.Environ(), "GOFLAGS=-buildvcs=false")
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("go build: %w\n%s", err, out)
		}
		d.done(time.Time{})
	} else {
		fmt.Fprintf(d.out, "• kl binaries from %s (make build)\n", d.bin)
	}
	return nil
}

// The binaries the demo runs, and their packages.
var (
	klBinaries = []string{"kl-relayd", "kl-ctl", "kl-cni", "kl-runtime", "kl-hook"}
	klPackages = []string{"./relayd/kl-relayd", "./relayd/kl-ctl", "./plugins/kl-cni", "./shim/kl-runtime", "./shim/kl-hook"}
)

func allExist(dir string, names []string) bool {
	for _, n := range names {
		if _, err := os.Stat(filepath.Join(dir, n)); err != nil {
			return false
		}
	}
	return true
}

// --- bring-up ---

func (d *demo) bringUp(ctx context.Context) error {
	var err error
	d.progress("network namespaces: node, npm registry, internal (artifact store + metadata), egress-a, egress-b")
	for _, r := range []struct {
		p    **ns
		role string
	}{{&d.node, "node"}, {&d.npm, "npm"}, {&d.internal, "internal"}, {&d.egA, "egress-a"}, {&d.egB, "egress-b"}} {
		if *r.p, err = d.newNS(ctx, r.role); err != nil {
			return err
		}
	}
	if _, err := d.node.exec(ctx, "sysctl", "-qw", "net.ipv4.ip_forward=1"); err != nil {
		return err
	}
	links := []struct {
		peer       *ns
		node, addr []string
		gw         string
	}{
		{d.npm, []string{"203.0.113.9/30"}, []string{npmAddr.String() + "/30"}, "203.0.113.9"},
		{d.egA, []string{"203.0.113.17/30"}, []string{squidAAddr.String() + "/30"}, "203.0.113.17"},
		{d.egB, []string{"203.0.113.21/30"}, []string{squidBAddr.String() + "/30"}, "203.0.113.21"},
		{d.internal, []string{"198.51.100.1/24"}, []string{storeAddr.String() + "/24", metaAddr.String() + "/32"}, "198.51.100.1"},
	}
	for _, l := range links {
		if err := d.link(ctx, d.node, l.node, l.peer, l.addr); err != nil {
			return err
		}
		if _, err := l.peer.exec(ctx, "ip", "route", "add", "default", "via", l.gw); err != nil {
			return err
		}
	}
	if _, err := d.node.exec(ctx, "ip", "route", "add", metaAddr.String()+"/32", "via", storeAddr.String()); err != nil {
		return err
	}
	d.done(time.Time{})

	d.progress("destination servers (they answer with the source address they saw) and two squid upstreams")
	if d.npmSrv, err = d.serveDest(d.npm, "npm-registry"); err != nil {
		return err
	}
	if d.intSrv, err = d.serveDest(d.internal, "internal"); err != nil {
		return err
	}
	hosts := fmt.Sprintf("%s %s\n%s %s\n", npmAddr, npmHost, storeAddr, storeHost)
	for _, s := range []struct {
		name string
		n    *ns
		addr netip.Addr
	}{{"egress-a", d.egA, squidAAddr}, {"egress-b", d.egB, squidBAddr}} {
		sq, err := d.startSquid(s.n, s.name, s.addr, hosts)
		if err != nil {
			return err
		}
		d.squids[s.name] = sq
	}
	// squid takes a couple of seconds to stop: both get SIGTERM at once (their own undo
	// steps then only wait).
	d.undo.push("signal squids", func() error {
		for _, sq := range d.squids {
			sq.proc.cmd.Process.Signal(syscall.SIGTERM)
		}
		return nil
	})
	for _, sq := range d.squids {
		if err := sq.ready(ctx); err != nil {
			return err
		}
	}
	d.done(time.Time{})

	d.progress("kl-relayd in the node netns (proxy → egress-a; named exits egress-a, egress-b)")
	if err := d.startRelayd(ctx); err != nil {
		return err
	}
	d.done(time.Time{})

	d.progress("pods through the CNI chain bridge + host-local + loopback + kl-cni (cnitool ADD)")
	for _, p := range []struct{ name, label string }{
		{"tenant-dev", "kl.route=proxy"}, {"tenant-test", "kl.route=proxy-b"}, {"prod", "kl.route=direct"}, {"web", ""},
	} {
		if err := d.addPod(ctx, p.name, p.label); err != nil {
			return err
		}
	}
	d.done(time.Time{})

	d.progress("containerd, and the CI builder container (image " + builderRef + ") through kl-runtime")
	if err := d.startBuilder(ctx); err != nil {
		return err
	}
	d.done(time.Time{})

	var regs []api.Registration
	if regs, err = d.client.List(ctx); err != nil {
		return fmt.Errorf("list registrations: %w", err)
	}
	sort.Slice(regs, func(i, j int) bool { return regs[i].Workload.Name < regs[j].Workload.Name })
	d.note(fmt.Sprintf("  kl-relayd serves %d workloads:", len(regs)))
	for _, r := range regs {
		w := r.Workload
		who := w.Name
		if who == "" {
			who = w.ID
		}
		extra := ""
		if len(w.Labels) > 0 {
			var ls []string
			for k, v := range w.Labels {
				ls = append(ls, k+"="+v)
			}
			sort.Strings(ls)
			extra += " labels " + strings.Join(ls, ",")
		}
		if w.Image != "" {
			extra += " image " + w.Image
		}
		fmt.Fprintf(d.out, "    %-14s source %-4s mode %-11s %v%s\n", who, w.Source, w.Mode, w.Addrs, extra)
	}
	return nil
}

func (d *demo) startRelayd(ctx context.Context) error {
	d.socket = filepath.Join(d.dir, "relayd.sock")
	d.rulesPath = filepath.Join(d.dir, "rules.yaml")
	if err := os.WriteFile(d.rulesPath, []byte("default: direct\n"), 0o644); err != nil {
		return err
	}
	settings := fmt.Sprintf(`socket: %s
stateDir: %s
rules: %s
idleTimeout: 30s
rulesPoll: 500ms
connectTimeout: 3s
audit: {path: %s}
proxy: {url: "http://%s:3128"}
exits:
  egress-a: {url: "http://%s:3128"}
  egress-b: {url: "http://%s:3128"}
`, d.socket, filepath.Join(d.dir, "relayd-state"), d.rulesPath, filepath.Join(d.dir, "audit.jsonl"), squidAAddr, squidAAddr, squidBAddr)
	sp := filepath.Join(d.dir, "relayd.yaml")
	if err := os.WriteFile(sp, []byte(settings), 0o600); err != nil {
		return err
	}
	p, err := d.start(d.node, filepath.Join(d.dir, "relayd.log"), nil, 10*time.Second, filepath.Join(d.bin, "kl-relayd"), "--settings", sp)
	if err != nil {
		return err
	}
	d.relayd = p
	d.client = api.NewClient(d.socket, 3*time.Second)
	if err := waitFor(ctx, 10*time.Second, func() bool { return p.exited() || d.client.Ping(ctx) == nil }); err != nil || p.exited() {
		return fmt.Errorf("kl-relayd not ready:\n%s", p.tail())
	}
	return nil
}

var addrRE = regexp.MustCompile(`"address":\s*"([^"/]+)/`)

// addPod creates a pod netns and runs the CNI chain's ADD for it with cnitool, passing its
// labels as the runtime's podLabels capability.
func (d *demo) addPod(ctx context.Context, name, label string) error {
	if d.netName == "" {
		if err := d.writeConflist(); err != nil {
			return err
		}
	}
	n, err := d.newNS(ctx, "pod-"+name)
	if err != nil {
		return err
	}
	labels := map[string]string{"app": name}
	if k, v, ok := strings.Cut(label, "="); ok {
		labels[k] = v
	}
	capArgs, _ := json.Marshal(map[string]any{"podLabels": labels})
	env := []string{
		"CNI_ARGS=IgnoreUnknown=1;K8S_POD_NAMESPACE=demo;K8S_POD_NAME=" + name,
		"CAP_ARGS=" + string(capArgs),
	}
	out, err := d.cnitool(ctx, env, "add", n.Path)
	if err != nil {
		return err
	}
	p := &pod{name: name, ns: n, what: "CNI pod", capArg: string(capArgs)}
	d.undo.push("cnitool del "+name, func() error {
		_, err := d.cnitool(context.Background(), env, "del", n.Path)
		return err
	})
	if m := addrRE.FindStringSubmatch(out); m != nil {
		p.addr, _ = netip.ParseAddr(m[1])
	}
	if !p.addr.IsValid() {
		return fmt.Errorf("cnitool add %s: no address in the result:\n%s", name, out)
	}
	d.pods[name] = p
	return nil
}

func (d *demo) writeConflist() error {
	d.netName = "kldemo"
	conf := fmt.Sprintf(`{
  "cniVersion": "1.1.0",
  "name": %q,
  "plugins": [
    {"type": "bridge", "bridge": "kldemo0", "isGateway": true, "ipMasq": false,
     "ipam": {"type": "host-local", "dataDir": %q, "ranges": [[{"subnet": %q}]], "routes": [{"dst": "0.0.0.0/0"}]}},
    {"type": "loopback"},
    {"type": "kl-cni", "socket": %q, "ipv6": false, "timeout": "3s",
     "capabilities": {"io.kubernetes.cri.pod-annotations": true, "podLabels": true}}
  ]
}`, d.netName, filepath.Join(d.dir, "ipam"), podSubnet, d.socket)
	dir := filepath.Join(d.dir, "net.d")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "10-kl.conflist"), []byte(conf), 0o644)
}

// cnitool runs cnitool inside the node netns (where the bridge lives).
func (d *demo) cnitool(ctx context.Context, env []string, verb, nsPath string) (string, error) {
	cmd := exec.CommandContext(ctx, "ip", "netns", "exec", d.node.Name, filepath.Join(d.cni, "cnitool"), verb, d.netName, nsPath)
	cmd.Env = append(os.Environ(), "CNI_PATH="+d.bin+":"+d.cni, "NETCONFPATH="+filepath.Join(d.dir, "net.d"))
	cmd.Env = append(cmd.Env, env...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("cnitool %s: %w\n%s", verb, err, out)
	}
	return string(out), nil
}

// startBuilder starts containerd with kl-runtime's settings in its environment, runs the
// builder container and gives its netns a veth to the node.
func (d *demo) startBuilder(ctx context.Context) error {
	rtCfg := filepath.Join(d.dir, "runtime.yaml")
	body := fmt.Sprintf("runtime: runc\nmode: transparent\nrules: %s\nhook: %s\nrelaySocket: %s\nrelayTimeout: 3s\nlogFile: %s\ndockerSocket: \"-\"\n",
		d.rulesPath, filepath.Join(d.bin, "kl-hook"), d.socket, filepath.Join(d.dir, "kl-runtime.log"))
	if err := os.WriteFile(rtCfg, []byte(body), 0o644); err != nil {
		return err
	}
	c, err := d.startContainerd(ctx, []string{"KL_RUNTIME_CONFIG=" + rtCfg})
	if err != nil {
		return err
	}
	d.ctrd = c
	id := "ci-builder-" + d.tag
	pid, err := d.runBuilder(ctx, c, id)
	if err != nil {
		return err
	}
	// The container's netns (made by runc, captured by kl-runtime's hook) gets a veth to
	// the node, as a CNI plugin would give it.
	ctrNs := &ns{Name: fmt.Sprint(pid), Path: fmt.Sprintf("/proc/%d/ns/net", pid)}
	nodeIf, ctrIf := d.vethNames()
	if _, err := output(ctx, "ip", "link", "add", nodeIf, "netns", d.node.Name, "type", "veth", "peer", "name", ctrIf, "netns", fmt.Sprint(pid)); err != nil {
		return err
	}
	nsenter := func(args ...string) error {
		_, err := output(ctx, "nsenter", append([]string{"--net=" + ctrNs.Path}, args...)...)
		return err
	}
	for _, step := range []error{
		func() error { _, err := d.node.exec(ctx, "ip", "addr", "add", ctrNodeAddr, "dev", nodeIf); return err }(),
		func() error { _, err := d.node.exec(ctx, "ip", "link", "set", nodeIf, "up"); return err }(),
		nsenter("ip", "addr", "add", ctrAddr, "dev", ctrIf),
		nsenter("ip", "link", "set", ctrIf, "up"),
		nsenter("ip", "route", "add", "default", "via", strings.Split(ctrNodeAddr, "/")[0]),
	} {
		if step != nil {
			return step
		}
	}
	d.builder = &pod{name: "ci-builder", what: "containerd + kl-runtime", ns: ctrNs, addr: mustAddr(strings.Split(ctrAddr, "/")[0]), ctrID: id}
	return nil
}

// --- rules ---

// setRules writes the rules file atomically (write + rename, as an editor or a ConfigMap
// update does) and waits for kl-relayd to pick it up on its own: its watcher compares the
// file's content on change notifications and every rulesPoll. If nothing happens within
// 3s it falls back to SIGHUP. It returns the reload's error code ("" when the new rules
// are live), its message, how long it took and what triggered it.
func (d *demo) setRules(ctx context.Context, body string) (code, msg string, took time.Duration, how string, err error) {
	before, err := d.status(ctx)
	if err != nil {
		return "", "", 0, "", err
	}
	tmp := d.rulesPath + ".new"
	if err := os.WriteFile(tmp, []byte(body), 0o644); err != nil {
		return "", "", 0, "", err
	}
	sum := sha256.Sum256([]byte(body))
	want := hex.EncodeToString(sum[:])
	start := time.Now()
	if err := os.Rename(tmp, d.rulesPath); err != nil {
		return "", "", 0, "", err
	}
	var st api.Status
	picked := func() bool {
		st, err = d.status(ctx)
		if err != nil {
			return false
		}
		return st.Rules.Hash == want || st.Rules.LastErrorAt.After(before.Rules.LastErrorAt)
	}
	how = "its file watcher"
	if waitFor(ctx, 3*time.Second, picked) != nil {
		how = "SIGHUP (the watcher did not react within 3s)"
		if err := d.relayd.cmd.Process.Signal(syscall.SIGHUP); err != nil {
			return "", "", 0, "", fmt.Errorf("SIGHUP kl-relayd: %w", err)
		}
		if err := waitFor(ctx, 5*time.Second, picked); err != nil {
			return "", "", time.Since(start), how, fmt.Errorf("kl-relayd did not reload its rules: %w", err)
		}
	}
	took = time.Since(start)
	if st.Rules.Hash == want {
		return "", "", took, how, nil
	}
	return st.Rules.LastErrorCode, st.Rules.LastError, took, how, nil
}

func (d *demo) status(ctx context.Context) (api.Status, error) {
	var st api.Status
	err := d.client.Call(ctx, "GET", "/v1/status", nil, &st)
	return st, err
}

// example reads examples/NAME and applies the demo's address substitutions, failing if
// the file no longer holds what is replaced.
func (d *demo) example(name string, repl ...string) (string, error) {
	data, err := os.ReadFile(filepath.Join(d.root, "examples", name))
	if err != nil {
		return "", err
	}
	s := string(data)
	for i := 0; i+1 < len(repl); i += 2 {
		if !strings.Contains(s, repl[i]) {
			return "", fmt.Errorf("examples/%s no longer contains %q (the demo adapts it)", name, repl[i])
		}
		s = strings.ReplaceAll(s, repl[i], repl[i+1])
	}
	return s, nil
}

// rulesBody is the file without its comment header, for printing.
func rulesBody(s string) string {
	var b strings.Builder
	started := false
	for _, l := range strings.Split(strings.TrimRight(s, "\n"), "\n") {
		if !started && (strings.HasPrefix(l, "#") || strings.TrimSpace(l) == "") {
			continue
		}
		started = true
		b.WriteString("    " + l + "\n")
	}
	return b.String()
}

func writeFile(path, body string) error { return os.WriteFile(path, []byte(body), 0o644) }
