package ctl

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/kl-egress/kl/relayd/attach"
)

func init() {
	Register(Command{Name: "attach", Summary: "hold a session that carries a node's `client` flows out through this machine's network", Run: attachCmd})
}

// tokenEnv carries the bearer token without putting it on a command line.
const tokenEnv = "KL_ATTACH_TOKEN"

type attachFlags struct {
	server, serverName, ca   string
	token, tokenFile         string
	cert, key                string
	workloads                multiFlag
	selector                 string
	background, agent, quiet bool
	allowLocal               bool
	verbose                  bool
	control, logFile         string
}

func attachCmd(ctx context.Context, env *Env, args []string) error {
	if len(args) > 0 && (args[0] == "status" || args[0] == "stop") {
		return attachControl(ctx, env, args[0], args[1:])
	}
	fs := flag.NewFlagSet("attach", flag.ContinueOnError)
	var af attachFlags
	fs.StringVar(&af.server, "server", "", "the node's attach listener `HOST:PORT`")
	fs.StringVar(&af.serverName, "server-name", "", "the TLS `NAME` to verify (default: the server's host)")
	fs.StringVar(&af.ca, "ca", "", "CA bundle `FILE` that signed the daemon's certificate (default: the system's)")
	fs.StringVar(&af.token, "token", "", "bearer `TOKEN` (prefer --token-file or $"+tokenEnv+": a flag shows in ps)")
	fs.StringVar(&af.tokenFile, "token-file", "", "read the bearer token from `FILE`")
	fs.StringVar(&af.cert, "cert", "", "client certificate `FILE` (instead of a token)")
	fs.StringVar(&af.key, "key", "", "client certificate key `FILE`")
	fs.Var(&af.workloads, "workload", "carry only this workload `ID` (repeatable)")
	fs.StringVar(&af.selector, "selector", "", "carry only workloads with these labels `K=V,...`")
	fs.BoolVar(&af.background, "background", false, "run the session in a background agent that reconnects; see attach status|stop")
	fs.BoolVar(&af.agent, "agent", false, "(internal) be the background agent")
	fs.StringVar(&af.control, "control", "", "the agent's control `SOCKET` (default "+attach.DefaultControl(env.Getenv)+")")
	fs.StringVar(&af.logFile, "log", "", "the background agent's log `FILE` (default: the control socket's path + .log)")
	fs.BoolVar(&af.verbose, "verbose", false, "show each flow's destination in the progress")
	fs.BoolVar(&af.quiet, "quiet", false, "no progress, only the summary")
	fs.BoolVar(&af.allowLocal, "allow-local", false, "let flows reach this machine itself (loopback, link-local), e.g. a tunnel on localhost; refused by default")
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: kl-ctl attach --server HOST:PORT [--ca FILE] (--token-file FILE | --cert FILE --key FILE) [--workload ID]... [--selector K=V] [--allow-local] [--background]\n       kl-ctl attach status|stop [--control SOCKET] [--json]")
		fs.PrintDefaults()
	}
	pos, err := parseFlags(env, fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return usageError(env, "attach", "unexpected argument %q", pos[0])
	}
	if af.server == "" {
		return usageError(env, "attach", "--server is required")
	}
	if af.control == "" {
		af.control = attach.DefaultControl(env.Getenv)
	}
	token, err := af.readToken(env)
	if err != nil {
		return usageError(env, "attach", "%v", err)
	}
	o := attach.ClientOptions{Server: af.server, ServerName: af.serverName, CAFile: af.ca, Token: token,
		CertFile: af.cert, KeyFile: af.key, Workloads: af.workloads, Selector: af.selector, Getenv: env.Getenv,
		AllowLocal: af.allowLocal}
	if _, err := attach.NewClient(o); err != nil {
		return usageError(env, "attach", "%v", err)
	}
	switch {
	case af.background:
		return startAgent(ctx, env, &af, token)
	case af.agent:
		return runAgent(ctx, env, &af, o)
	}
	return runForeground(ctx, env, &af, o)
}

func (af *attachFlags) readToken(env *Env) (string, error) {
	switch {
	case af.token != "":
		return af.token, nil
	case af.tokenFile != "":
		b, err := os.ReadFile(af.tokenFile)
		if err != nil {
			return "", fmt.Errorf("--token-file: %w", err)
		}
		tok := strings.TrimSpace(string(b))
		if tok == "" {
			return "", fmt.Errorf("--token-file %s is empty", af.tokenFile)
		}
		return tok, nil
	}
	return env.Getenv(tokenEnv), nil
}

// progress shows a session's life: on a terminal one line rewritten every second plus
// a line per refusal; otherwise one line per event.
type progress struct {
	mu      sync.Mutex
	w       io.Writer
	tty     bool
	verbose bool
	quiet   bool
	c       *attach.Client
	dirty   bool
}

func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

func (p *progress) event(e attach.Event) {
	if p.quiet {
		return
	}
	var line string
	dest := ""
	if p.verbose && e.Dest != "" {
		dest = " to " + e.Dest
	}
	via := ""
	if e.Via != "" {
		via = " via " + e.Via
	}
	switch e.Kind {
	case "session":
		line = fmt.Sprintf("attached: session %s, carrying %s", e.Session, e.Reason)
	case "policy":
		line = fmt.Sprintf("policy %.12s", e.Reason)
	case "flow":
		if p.tty {
			return
		}
		line = fmt.Sprintf("flow %d of %s%s%s", e.Flow, e.Workload, dest, via)
	case "end":
		if p.tty {
			return
		}
		line = fmt.Sprintf("flow %d ended: %d bytes out, %d in", e.Flow, e.BytesOut, e.BytesIn)
	case "refused":
		line = fmt.Sprintf("refused flow %d of %s%s: %s: %s", e.Flow, e.Workload, dest, e.Code, e.Reason)
	case "disconnected":
		line = "session lost: " + e.Reason
	case "retry":
		line = "not attached: " + e.Reason
	default:
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.dirty {
		fmt.Fprint(p.w, "\r\033[K")
		p.dirty = false
	}
	fmt.Fprintf(p.w, "%s %s\n", e.At.Format("15:04:05"), line)
}

func (p *progress) tick() {
	s := p.c.Stats()
	state := "connected"
	if !s.Connected {
		state = "reconnecting"
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	fmt.Fprintf(p.w, "\r\033[K%s  flows %d (active %d)  refused %d  out %s  in %s", state, s.Flows, s.Active, s.Refused, human(s.BytesOut), human(s.BytesIn))
	p.dirty = true
}

func human(n uint64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}

func summary(w io.Writer, s attach.Stats, lasted time.Duration) {
	fmt.Fprintf(w, "attach summary: %d session(s) over %s, %d flows, %d refused, %s out, %s in\n",
		s.Sessions, lasted.Round(time.Second), s.Flows, s.Refused, human(s.BytesOut), human(s.BytesIn))
	for code, n := range s.ByCode {
		fmt.Fprintf(w, "  refused %s: %d\n", code, n)
	}
}

func runForeground(ctx context.Context, env *Env, af *attachFlags, o attach.ClientOptions) error {
	p := &progress{w: env.Stderr, tty: isTerminal(env.Stderr), verbose: af.verbose, quiet: af.quiet}
	o.OnEvent = p.event
	c, err := attach.NewClient(o)
	if err != nil {
		return err
	}
	p.c = c
	start := time.Now()
	done := make(chan error, 1)
	go func() { done <- c.Keep(ctx) }()
	var tick <-chan time.Time
	if p.tty && !p.quiet {
		t := time.NewTicker(time.Second)
		defer t.Stop()
		tick = t.C
	}
	for {
		select {
		case err = <-done:
			if p.dirty {
				fmt.Fprintln(env.Stderr)
			}
			st := c.Stats()
			summary(env.Stdout, st, time.Since(start))
			if err == nil && st.Sessions == 0 {
				// Stopped before any session: the workloads never had their route.
				if st.LastError == "" {
					return fmt.Errorf("never attached to %s", o.Server)
				}
				return fmt.Errorf("never attached to %s: %s", o.Server, st.LastError)
			}
			return err
		case <-tick:
			p.tick()
		}
	}
}

// Test seams: the program startAgent runs as the agent, and how long it waits for the
// agent's answer.
var (
	agentExecutable   = os.Executable
	agentStartTimeout = 15 * time.Second
)

// startAgent re-runs kl-ctl as a detached background agent and waits until it answers
// on its control socket. An agent that does not answer in time is stopped: the caller
// is told it failed, so it must not keep a session on its own.
func startAgent(ctx context.Context, env *Env, af *attachFlags, token string) error {
	// The agent runs in /, and this process looks for its socket and log: both must be
	// the same files whatever the directory.
	control, err := filepath.Abs(af.control)
	if err != nil {
		return fmt.Errorf("--control: %w", err)
	}
	af.control = control
	logPath := af.logFile
	if logPath == "" {
		logPath = af.control + ".log"
	}
	if logPath, err = filepath.Abs(logPath); err != nil {
		return fmt.Errorf("--log: %w", err)
	}
	if st, err := attach.AgentRequest(ctx, af.control, "status"); err == nil {
		return fmt.Errorf("an attach agent (pid %d, server %s) already runs on %s; kl-ctl attach stop first", st.PID, st.Server, af.control)
	}
	self, err := agentExecutable()
	if err != nil {
		return err
	}
	args := []string{"attach", "--agent", "--server", af.server, "--control", af.control}
	for _, kv := range [][2]string{{"--server-name", af.serverName}, {"--ca", af.ca}, {"--cert", af.cert}, {"--key", af.key}, {"--selector", af.selector}} {
		if kv[1] != "" {
			args = append(args, kv[0], abs(kv[0], kv[1]))
		}
	}
	for _, w := range af.workloads {
		args = append(args, "--workload", w)
	}
	if af.verbose {
		args = append(args, "--verbose")
	}
	if af.allowLocal {
		args = append(args, "--allow-local")
	}
	if err := os.MkdirAll(filepath.Dir(af.control), 0o700); err != nil {
		return err
	}
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return fmt.Errorf("agent log: %w", err)
	}
	defer logf.Close()
	cmd := exec.Command(self, args...)
	cmd.Env = append(os.Environ(), tokenEnv+"="+token)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Dir = "/"
	// Its own session, away from the terminal: a hangup there must not end it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start the agent: %w", err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	stop := func() {
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(2 * time.Second):
			cmd.Process.Kill()
			<-exited
		}
	}
	deadline := time.Now().Add(agentStartTimeout)
	for {
		st, err := attach.AgentRequest(ctx, af.control, "status")
		if err == nil && (st.Stats.Connected || st.Stats.LastError != "") {
			state := "connected"
			if !st.Stats.Connected {
				state = "not connected yet (" + st.Stats.LastError + "); retrying"
			}
			fmt.Fprintf(env.Stdout, "attach agent running (pid %d), %s; log %s\nkl-ctl attach status | kl-ctl attach stop\n", st.PID, state, logPath)
			return nil
		}
		select {
		case err := <-exited:
			b, _ := os.ReadFile(logPath)
			return fmt.Errorf("the agent exited (%v):\n%s", err, tail(string(b), 10))
		case <-ctx.Done():
			stop()
			return fmt.Errorf("stopped the agent (pid %d) before it answered: %w", cmd.Process.Pid, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			stop()
			return fmt.Errorf("the agent (pid %d) did not answer on %s within %s; stopped it; see %s", cmd.Process.Pid, af.control, agentStartTimeout, logPath)
		}
	}
}

func abs(flagName, p string) string {
	if flagName == "--selector" || flagName == "--server-name" {
		return p
	}
	if a, err := filepath.Abs(p); err == nil {
		return a
	}
	return p
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// runAgent is the background agent: it keeps the session (reconnecting) and serves the
// control socket until stopped.
func runAgent(ctx context.Context, env *Env, af *attachFlags, o attach.ClientOptions) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	// Detached from the terminal: a hangup must not end the session.
	signal.Ignore(syscall.SIGHUP)
	o.Log = slog.New(slog.NewTextHandler(env.Stderr, nil))
	p := &progress{w: env.Stderr, verbose: af.verbose}
	o.OnEvent = p.event
	c, err := attach.NewClient(o)
	if err != nil {
		return err
	}
	p.c = c
	start := time.Now()
	ctlErr := make(chan error, 1)
	go func() { ctlErr <- attach.ServeControl(ctx, af.control, c, cancel) }()
	keepErr := make(chan error, 1)
	go func() { keepErr <- c.Keep(ctx) }()
	select {
	case err = <-keepErr:
		cancel()
		<-ctlErr
	case err = <-ctlErr:
		cancel()
		<-keepErr
	}
	summary(env.Stderr, c.Stats(), time.Since(start))
	return err
}

func attachControl(ctx context.Context, env *Env, what string, args []string) error {
	fs := flag.NewFlagSet("attach "+what, flag.ContinueOnError)
	control := fs.String("control", attach.DefaultControl(env.Getenv), "the agent's control `SOCKET`")
	asJSON := fs.Bool("json", false, "print the agent's status as JSON")
	pos, err := parseFlags(env, fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return usageError(env, "attach", "unexpected argument %q", pos[0])
	}
	st, err := attach.AgentRequest(ctx, *control, what)
	if err != nil {
		if errors.Is(err, attach.ErrNoAgent) {
			fmt.Fprintf(env.Stderr, "kl-ctl attach %s: %v\n", what, err)
			return &ExitError{Code: ExitNoAgent, Err: err}
		}
		return err
	}
	if *asJSON {
		enc := json.NewEncoder(env.Stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(st)
	}
	s := st.Stats
	state := "connected"
	if !s.Connected {
		state = "not connected"
		if s.LastError != "" {
			state += " (" + s.LastError + ")"
		}
	}
	if what == "stop" {
		fmt.Fprintf(env.Stdout, "stopped the attach agent (pid %d)\n", st.PID)
	} else {
		fmt.Fprintf(env.Stdout, "agent pid %d, server %s: %s\n", st.PID, st.Server, state)
		if s.Session != "" {
			fmt.Fprintf(env.Stdout, "session %s since %s, carrying %s, policy %.12s\n", s.Session, s.Since.Format(time.RFC3339), s.Scope, s.Policy)
		}
	}
	fmt.Fprintf(env.Stdout, "flows %d (active %d), refused %d, %s out, %s in, %d session(s), %d reconnect(s)\n",
		s.Flows, s.Active, s.Refused, human(s.BytesOut), human(s.BytesIn), s.Sessions, s.Reconnects)
	return nil
}
