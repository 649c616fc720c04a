// Package daemon is kl-relayd: it loads the daemon's settings and the rules file, restores
// the persisted registrations (reopening listeners in every pod netns that still exists),
// serves the registration and status API on its unix socket and runs the relay.
//
// It is not the data path (package relay), the rule engine (package rules) or the wire
// contract (package api); it wires them together and owns the process-wide concerns:
// descriptor limits, readiness, signals and shutdown.
package daemon

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/kl-egress/kl/relayd/api"
	"github.com/kl-egress/kl/relayd/attach"
	"github.com/kl-egress/kl/relayd/audit"
	"github.com/kl-egress/kl/relayd/config"
	"github.com/kl-egress/kl/relayd/fastpath"
	"github.com/kl-egress/kl/relayd/metrics"
	"github.com/kl-egress/kl/relayd/publish"
	"github.com/kl-egress/kl/relayd/registry"
	"github.com/kl-egress/kl/relayd/relay"
	"github.com/kl-egress/kl/rules"
	"github.com/kl-egress/kl/rules/pac"
)

// reapInterval is how often registrations whose netns disappeared (a DEL that never
// reached the daemon) are looked for; one is dropped at the second sweep that finds it
// gone (sweep).
var reapInterval = 30 * time.Second

// retryInterval is how often a saved registration that a shortage kept from being
// restored (transient) is tried again.
var retryInterval = 2 * time.Second

// ErrUsage is Run's error for a command line the flag package refused: it has printed
// what is wrong and the usage already (main exits 2 without printing it again).
var ErrUsage = errors.New("usage")

// Run is kl-relayd's main: `kl-relayd [--settings FILE] [--config RULES] [--debug]` runs the
// daemon until ctx is done; `kl-relayd check ...` loads everything and reports.
func Run(ctx context.Context, args []string) error {
	return run(ctx, args, os.Stdout, os.Stderr)
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	name := "kl-relayd"
	if len(args) > 0 {
		args = args[1:]
	}
	check := false
	if len(args) > 0 && args[0] == "check" {
		check, args = true, args[1:]
	}
	var hup chan os.Signal
	if !check {
		// Until a handler is installed, SIGHUP's default action ends the process; catch it
		// before anything slow (compiling the rules, restoring registrations), so that a
		// reload asked for while the daemon starts waits for it instead of killing it.
		// kl-relayd's main catches SIGTERM before calling Run.
		hup = notifyHUP()
		defer stopHUP(hup)
	}
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	settings := fs.String("settings", config.DefaultPath, "the daemon's settings file (root only)")
	rulesPath := fs.String("config", "", "the rules file (default: the settings' rules, "+api.DefaultRulesPath+")")
	debug := fs.Bool("debug", false, "debug logging, including flow destinations")
	attachPath := fs.String("attach", attach.DefaultSettingsPath, "the attach listener's settings (root only; a missing default file = no listener)")
	var routes routeFlags
	fs.Var(&routes, "egress-route", "a pattern-form rule `PATTERN=ROUTE` instead of the rules file (repeatable, first match)")
	routeDefault := fs.String("egress-default", "", "the default `ROUTE` of --egress-route or --egress-pac (cluster when absent)")
	pacPath := fs.String("egress-pac", "", "a PAC script `FILE` (FindProxyForURL) instead of the rules file; reloaded when it changes")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil // -h: the usage is printed, and asking for it is no failure
		}
		return ErrUsage // the flag package printed what is wrong, and the usage
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "unexpected arguments: %q\n", fs.Args())
		fs.Usage()
		return ErrUsage
	}
	cfg, err := config.Load(*settings)
	if err != nil {
		return err
	}
	if *rulesPath != "" && (*pacPath != "" || len(routes) > 0 || *routeDefault != "") {
		return fmt.Errorf("--config and --egress-route/--egress-default/--egress-pac are two ways to give a policy; use one")
	}
	if *pacPath != "" && len(routes) > 0 {
		return fmt.Errorf("--egress-pac and --egress-route are two ways to give a policy; use one")
	}
	if *rulesPath != "" {
		cfg.Rules = *rulesPath
	}
	cfg.Routes, cfg.RouteDefault, cfg.PAC = routes, *routeDefault, *pacPath
	switch {
	case cfg.PAC != "":
		cfg.Rules = cfg.PAC
	case cfg.FlagRoutes():
		cfg.Rules = "--egress-route"
	}
	if *debug {
		cfg.Debug = true
	}
	cfg.Gateway = os.Getenv("KL_EGRESS_GATEWAY") == "1"
	level := slog.LevelInfo
	if cfg.Debug {
		level = slog.LevelDebug
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))
	attachNamed := false
	fs.Visit(func(f *flag.Flag) { attachNamed = attachNamed || f.Name == "attach" })
	if check {
		if err := Check(cfg, stdout); err != nil {
			return err
		}
		msg, err := checkAttach(*attachPath, attachNamed)
		if err == nil {
			fmt.Fprintln(stdout, msg)
		}
		return err
	}
	d, err := New(cfg, log)
	if err != nil {
		return err
	}
	if err := d.EnableAttach(*attachPath, attachNamed); err != nil {
		return err
	}
	return d.serve(ctx, hup)
}

// Check builds every object the settings and rules describe, as the daemon would, and
// reports what it found (the `check` command).
func Check(cfg *config.Config, out io.Writer) error {
	p, err := loadRules(cfg)
	if err != nil {
		return err
	}
	if _, _, err := buildExits(cfg); err != nil {
		return err
	}
	fmt.Fprintf(out, "settings ok: socket %s, state %s, redirect port %d, mark %#x, %d named exits\n",
		cfg.Socket, cfg.StateDir, cfg.RedirectPort, cfg.Mark, len(cfg.Exits))
	fmt.Fprintf(out, "rules ok: %s (sha256 %s)\n", cfg.Rules, p.Hash())
	return nil
}

func loadRules(cfg *config.Config) (*rules.Policy, error) {
	o := loadOptions(cfg)
	var p *rules.Policy
	var err error
	switch {
	case cfg.PAC != "":
		var src []byte
		if src, err = rules.ReadFile(cfg.PAC, pac.MaxScriptBytes); err == nil {
			p, err = rules.FromScript(cfg.PAC, src, cfg.RouteDefault, o)
		}
	case cfg.FlagRoutes():
		p, err = rules.FromRoutes(cfg.Routes, cfg.RouteDefault, o)
	default:
		p, err = rules.Load(cfg.Rules, o)
	}
	if err != nil {
		return nil, fmt.Errorf("load rules %s: %w", cfg.Rules, err)
	}
	return p, nil
}

// loadOptions are what the daemon's settings allow a rules file.
func loadOptions(cfg *config.Config) rules.LoadOptions {
	return rules.LoadOptions{Exits: cfg.HasExit, AllowGateway: cfg.Gateway, Detached: cfg.Detached}
}

// lastPublished loads the rules the daemon last published for containers (only rules
// that loaded are published): what it starts on when the rules file is refused at start.
// Their directory is under /run, so they never outlive a reboot. Routes given as flags
// have no file to fall back from.
func lastPublished(cfg *config.Config) (*rules.Policy, error) {
	if cfg.PublishedRules == "-" || cfg.FlagRoutes() {
		return nil, errors.New("no published rules")
	}
	src, err := publish.Read(cfg.PublishedRules)
	if err != nil {
		return nil, err
	}
	return rules.Parse(filepath.Join(cfg.PublishedRules, publish.FileName), src, loadOptions(cfg))
}

// Daemon is one running kl-relayd.
type Daemon struct {
	cfg     *config.Config
	log     *slog.Logger
	started time.Time

	// policy is the live rule set. Every flow loads it once; a reload swaps it.
	policy   atomic.Pointer[rules.Policy]
	reloadMu sync.Mutex // one Reload at a time, from reading the file to the swap
	rulesMu  sync.Mutex
	rules    api.RulesStatus
	// hitsSince is when the rules whose numbers the hit counts use loaded (under rulesMu).
	hitsSince time.Time
	// fallback: the live rules are the last published ones, the file having been refused
	// since the start (under rulesMu; a load of the file ends it).
	fallback bool

	store   *registry.Store
	relay   *relay.Relay
	audit   *audit.Log
	fast    *fastpath.Manager // nil when the kernel fast path is off
	metrics *metrics.Metrics
	metReg  *prometheus.Registry // nil when metrics are off
	ready   atomic.Bool

	attach       atomic.Pointer[attach.Server] // nil when the attach listener is off
	attachListen string

	mu   sync.Mutex // serialises registration changes
	regs map[string]registry.Entry
	// pending holds saved registrations a shortage kept from being restored (under mu):
	// still saved, tried again every retryInterval until they open, their netns goes or
	// their id is registered or deregistered anew.
	pending map[string]registry.Entry
	rescan  bool // under mu: a shortage kept saved registrations from being read; retryPending reads them again

	fastClosed bool // under mu: late fast path retries stop after shutdown

	restored func(id string) // tests: called after restore reopens each registration

	hostNetns [2]uint64 // the daemon's own netns (device, inode); zero when unknown
	unlock    func()    // releases the state directory's lock (lockState)
}

// New takes the state directory (one daemon per state directory: a second one stops
// here, before it changes anything), loads the rules and opens the state; nothing
// listens yet.
func New(cfg *config.Config, log *slog.Logger) (_ *Daemon, err error) {
	unlock, err := lockState(cfg.StateDir)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			unlock()
		}
	}()
	d := &Daemon{cfg: cfg, log: log, started: time.Now(), regs: map[string]registry.Entry{}, pending: map[string]registry.Entry{}, unlock: unlock}
	if dev, ino, err := netnsID("/proc/self/ns/net"); err == nil {
		d.hostNetns = [2]uint64{dev, ino}
	}
	p, err := loadRules(cfg)
	var refused error
	if err != nil {
		last, lerr := lastPublished(cfg)
		if lerr != nil {
			return nil, err
		}
		// A restart (an upgrade, the watchdog, an OOM kill) while the file is broken must
		// not take the node's pods down with it: the rules they ran on stay live, as a
		// reload of the same file would have kept them.
		log.Error("rules refused at start; running the last rules that loaded, published in "+cfg.PublishedRules+", until the file loads",
			"path", cfg.Rules, "err", err, "hash", last.Hash())
		p, refused = last, err
	}
	d.policy.Store(p)
	d.publishRules(p)
	d.rules = api.RulesStatus{Path: cfg.Rules, Hash: p.Hash(), LoadedAt: time.Now()}
	d.hitsSince = d.rules.LoadedAt.UTC()
	if refused != nil {
		d.fallback = true
		d.rules.LastError = d.refusedText(refused)
		d.rules.LastErrorCode = errCode(refused)
		d.rules.LastErrorAt = d.rules.LoadedAt
	}
	exits, upstreams, err := buildExits(cfg)
	if err != nil {
		return nil, err
	}
	exits[rules.ExitClient] = d.clientExit
	if d.store, err = registry.Open(cfg.StateDir); err != nil {
		return nil, err
	}
	if cfg.Metrics != "" {
		d.metReg = prometheus.NewRegistry()
		if d.metrics, err = metrics.New(d.metReg); err != nil {
			return nil, err
		}
		d.metrics.Reloaded(time.Now(), d.rules.LastErrorCode)
	}
	if d.audit, err = audit.New(cfg.Audit.Path, cfg.Audit.MaxBytes, cfg.Audit.Keep, cfg.Audit.Ring); err != nil {
		return nil, err
	}
	d.audit.SetLogger(log)
	d.metrics.AuditDropped(func() uint64 { n, _ := d.audit.WriteErr(); return n })
	if !cfg.NoFastPath {
		d.fast = fastpath.New(fastpath.Options{Sink: d.audit, Log: log, RedirectPort: cfg.RedirectPort})
	}
	d.relay = relay.New(relay.Options{
		RedirectPort:   cfg.RedirectPort,
		HTTPPort:       cfg.HTTPPort,
		SOCKSPort:      cfg.SOCKSPort,
		Mark:           cfg.Mark,
		IdleTimeout:    cfg.IdleTimeout,
		ConnectTimeout: cfg.ConnectTimeout,
		Debug:          cfg.Debug,
		SniffWait:      cfg.Sniff.Wait,
		SniffSkipPorts: cfg.Sniff.SkipPorts,
		Loops:          cfg.Loops,
		Policy:         func() relay.Decider { return d.policy.Load() },
		Exits:          exits,
		Upstreams:      upstreams,
		Log:            log,
		Audit:          d.audit,
		Metrics:        d.metrics,
	})
	return d, nil
}

// Serve restores the registrations, listens on the API socket, reports ready and serves
// until ctx is done; then it stops accepting, drains flows briefly and returns. SIGHUP
// reloads the rules; one that comes before the daemon is ready is kept and handled once it
// is (several in a row make one reload).
func (d *Daemon) Serve(ctx context.Context) error {
	hup := notifyHUP()
	defer stopHUP(hup)
	return d.serve(ctx, hup)
}

// serve is Serve with hup already catching SIGHUP.
func (d *Daemon) serve(ctx context.Context, hup <-chan os.Signal) error {
	disableCoreDumps(d.log)
	soft, hard, err := raiseNofile()
	if err != nil {
		d.log.Warn("cannot raise the descriptor limit", "err", err)
	} else {
		d.log.Info("descriptor limit", "soft", soft, "hard", hard)
	}
	d.restore(ctx)
	if ctx.Err() != nil {
		// Stopped while restoring: never ready, no API; close what restore opened.
		d.shutdown(nil)
		return nil
	}

	ln, err := listenUnix(d.cfg.Socket)
	if err != nil {
		d.shutdown(nil)
		return err
	}
	srv := &http.Server{Handler: d.Handler(), ReadHeaderTimeout: 5 * time.Second, ErrorLog: slog.NewLogLogger(d.log.Handler(), slog.LevelWarn)}
	errc := make(chan error, 2)
	go func() { errc <- srv.Serve(ln) }()
	if d.metReg != nil {
		mln, err := net.Listen("tcp", d.cfg.Metrics)
		if err != nil {
			d.shutdown(srv)
			return fmt.Errorf("metrics: %w", err)
		}
		mux := http.NewServeMux()
		mux.Handle("GET /metrics", promhttp.HandlerFor(d.metReg, promhttp.HandlerOpts{}))
		msrv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
		go func() { errc <- msrv.Serve(mln) }()
		defer msrv.Close()
		d.log.Info("metrics", "addr", mln.Addr().String())
	}
	stopAttach, err := d.serveAttach(ctx)
	if err != nil {
		d.shutdown(srv)
		return err
	}
	defer stopAttach()
	d.ready.Store(true)
	d.log.Info("ready", "socket", d.cfg.Socket, "workloads", d.relay.Len(), "rules", d.cfg.Rules, "hash", d.policy.Load().Hash())
	if err := sdNotify("READY=1"); err != nil {
		d.log.Warn("sd_notify", "err", err)
	}
	go d.reap(ctx)
	if every, err := watchdogInterval(); err != nil {
		d.log.Warn("systemd watchdog disabled", "err", err)
	} else if every > 0 {
		probe := api.NewClient(d.cfg.Socket, every)
		go watchdog(ctx, every, func(ctx context.Context) error { return d.healthy(ctx, probe) }, d.log)
	}
	wctx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	if !d.cfg.FlagRoutes() {
		go d.watchRules(wctx) // flags never change under a running daemon
	}
	var serveErr error
wait:
	for {
		select {
		case <-ctx.Done():
			break wait
		case serveErr = <-errc:
			break wait
		case <-hup:
			_ = d.Reload()
		}
	}
	d.shutdown(srv)
	if errors.Is(serveErr, http.ErrServerClosed) {
		serveErr = nil
	}
	return serveErr
}

// shutdown is serve's end, also when it fails to start: it stops the API server srv (nil
// when the API was never served) and the relay, letting flows finish for up to 5s, then closes the fast path
// and the audit log.
func (d *Daemon) shutdown(srv *http.Server) {
	d.ready.Store(false)
	_ = sdNotify("STOPPING=1")
	d.log.Info("shutting down")
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if srv != nil {
		_ = srv.Shutdown(sctx)
	}
	_ = d.relay.Shutdown(sctx)
	if srv != nil {
		os.Remove(d.cfg.Socket)
	}
	d.fastClose()
	if err := d.audit.Close(); err != nil {
		d.log.Warn("audit log", "err", err)
	}
	d.unlock()
}

// healthy is the watchdog's liveness check: the daemon has restored its registrations
// and its API answers a readiness request over its own socket (the accept loop, the
// handlers and the descriptor budget all work).
func (d *Daemon) healthy(ctx context.Context, probe *api.Client) error {
	if !d.ready.Load() {
		return errors.New("not ready")
	}
	if err := probe.Ping(ctx); err != nil {
		return fmt.Errorf("api socket: %w", err)
	}
	return nil
}

// restore reopens the listeners of every persisted registration whose netns still
// exists (the same netns, by device and inode) and drops the others. Once ctx is done it
// stops: the registrations not reached yet stay in the store for the next start. One
// that a shortage (descriptors, memory) keeps from opening is neither: it stays saved and
// is tried again (pending), since nothing says its pod is gone.
func (d *Daemon) restore(ctx context.Context) {
	entries, rescan := d.loadSaved()
	d.mu.Lock()
	d.rescan = rescan
	d.mu.Unlock()
	var n [3]int // by restoreOne's outcome
	for i, e := range entries {
		if ctx.Err() != nil {
			d.log.Info("stopped restoring registrations; the rest are left for the next start",
				"kept", n[restoredKept], "dropped", n[restoredDropped], "pending", n[restoredPending], "left", len(entries)-i)
			return
		}
		d.mu.Lock()
		out := d.restoreOne(e)
		d.mu.Unlock()
		n[out]++
	}
	if len(entries) > 0 {
		d.log.Info("registrations restored", "kept", n[restoredKept], "dropped", n[restoredDropped], "pending", n[restoredPending])
	}
}

const (
	restoredKept = iota
	restoredDropped
	restoredPending
)

// restoreOne reopens saved registration e, under d.mu (a fast-path retry, fastRegister's
// timer, may read d.regs while a long restore goes on): kept, dropped (its netns is gone
// or it cannot be served: removed from the store) or pending (a shortage: left saved, in
// d.pending, for retryPending).
func (d *Daemon) restoreOne(e registry.Entry) int {
	w := e.Registration.Workload
	delete(d.pending, w.ID)
	dev, ino, err := netnsID(w.Netns)
	if err == nil && (dev != e.NetnsDev || ino != e.NetnsIno) {
		err = errors.New("netns replaced")
	}
	if err == nil {
		for id, r := range d.regs {
			if id != w.ID && r.NetnsDev == dev && r.NetnsIno == ino {
				err = fmt.Errorf("netns %s is served for workload %s now", w.Netns, id)
			}
		}
	}
	if err == nil {
		_, err = d.relay.Open(w)
	}
	switch {
	case err == nil:
		d.regs[w.ID] = e
		d.fastRegister(w)
		if d.restored != nil {
			d.restored(w.ID)
		}
		return restoredKept
	case transient(err):
		d.log.Warn("saved registration not restored for now; kept, and tried again", "workload", w.ID, "err", err, "every", retryInterval)
		d.pending[w.ID] = e
		return restoredPending
	}
	d.log.Info("dropping saved registration", "workload", w.ID, "why", err)
	if err := d.store.Delete(w.ID); err != nil {
		d.log.Error("saved registration not removed", "workload", w.ID, "err", err)
	}
	return restoredDropped
}

// loadSaved reads the saved registrations; rescan: a shortage kept some from being read
// (the directory or a file), for retryPending to read again (d.rescan). One that is
// unreadable otherwise, or that the API would refuse, is left in place for the operator.
func (d *Daemon) loadSaved() (_ []registry.Entry, rescan bool) {
	entries, errs := d.store.Load()
	for _, err := range errs {
		if transient(err) {
			d.log.Warn("saved registrations not read for now; read again", "err", err, "every", retryInterval)
			rescan = true
			continue
		}
		d.log.Error("saved registration unreadable or refused; left in place", "err", err)
	}
	return entries, rescan
}

// retryPending tries the pending registrations again, and first reads the saved ones
// again when a shortage kept some from being read (under d.mu throughout, so that no
// registration or deregistration comes between the read and what it finds).
func (d *Daemon) retryPending() {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.rescan {
		var entries []registry.Entry
		entries, d.rescan = d.loadSaved()
		for _, e := range entries {
			if _, ok := d.regs[e.Registration.Workload.ID]; !ok { // a registration since is newer
				d.pending[e.Registration.Workload.ID] = e
			}
		}
	}
	for _, e := range d.pending {
		if d.restoreOne(e) == restoredKept {
			d.log.Info("saved registration restored", "workload", e.Registration.Workload.ID)
		}
	}
}

// transient says whether err is a shortage that passes (descriptors, memory, the
// descriptor budget) rather than anything about the registration or its netns.
func transient(err error) bool {
	for _, t := range []error{syscall.EMFILE, syscall.ENFILE, syscall.ENOMEM, syscall.ENOBUFS, syscall.EAGAIN, syscall.EINTR, errBudget} {
		if errors.Is(err, t) {
			return true
		}
	}
	return false
}

// reap drops registrations whose netns has disappeared without a deregistration, and
// tries the pending ones again.
func (d *Daemon) reap(ctx context.Context) {
	t := time.NewTicker(reapInterval)
	defer t.Stop()
	retry := time.NewTicker(retryInterval)
	defer retry.Stop()
	var missing map[string]bool
	for {
		select {
		case <-ctx.Done():
			return
		case <-retry.C:
			d.retryPending()
		case <-t.C:
			missing = d.sweep(missing)
		}
	}
}

// sweep drops the registrations whose netns path no longer names their netns and did
// not at the sweep before either (missing, which it returns for the next one), then
// checks the fast path's tables, but for the registrations it keeps in grace. The grace
// of one interval is for a netns that outlives its path: containers sharing one
// (--network container:A) are registered through A's /proc/PID/ns/net, gone when A's
// process ends, and kl-hook moves the registration to a container still in the netns
// only at A's poststop, which comes later; dropped meanwhile, the others' flows would be
// cut and their new connections refused until then, and their kernel-decided ones
// unrecorded.
func (d *Daemon) sweep(missing map[string]bool) map[string]bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	now := map[string]bool{}
	for id, e := range d.regs {
		dev, ino, err := netnsID(e.Registration.Workload.Netns)
		if err == nil && dev == e.NetnsDev && ino == e.NetnsIno || transient(err) {
			continue // there, or a shortage that says nothing about it
		}
		if !missing[id] {
			now[id] = true
			d.log.Debug("registration's netns path is gone; dropped at the next sweep if it still is", "workload", id, "netns", e.Registration.Workload.Netns)
			continue
		}
		d.log.Info("dropping registration: its netns is gone", "workload", id)
		d.relay.Close(id)
		d.fastRemove(id)
		d.store.Delete(id)
		delete(d.regs, id)
	}
	d.fastVerify(now)
	return now
}

// listenUnix listens on the API socket, replacing a stale socket file but refusing to
// steal one a live daemon still serves.
func listenUnix(path string) (net.Listener, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, fmt.Errorf("api socket: %w", err)
	}
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode().Type() != os.ModeSocket {
			return nil, fmt.Errorf("api socket %s exists and is not a socket", path)
		}
		if c, err := net.DialTimeout("unix", path, time.Second); err == nil {
			c.Close()
			return nil, fmt.Errorf("api socket %s: another kl-relayd is serving it", path)
		}
		os.Remove(path)
	}
	ln, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("api socket: %w", err)
	}
	// Registrations change what the node's pods can reach: root and the socket's group only.
	if err := os.Chmod(path, 0o660); err != nil {
		ln.Close()
		return nil, fmt.Errorf("api socket: %w", err)
	}
	return ln, nil
}

// routeFlags collects repeated --egress-route flags.
type routeFlags []string

func (r *routeFlags) String() string     { return strings.Join(*r, " ") }
func (r *routeFlags) Set(v string) error { *r = append(*r, v); return nil }
