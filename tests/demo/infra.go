//go:build linux

package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// cleanups is a LIFO stack of undo steps; every resource the demo creates pushes its
// removal the moment it exists, so an error or a signal at any point undoes exactly what
// was made.
type cleanups struct {
	mu    sync.Mutex
	steps []cleanupStep
}

type cleanupStep struct {
	what string
	fn   func() error
}

func (c *cleanups) push(what string, fn func() error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.steps = append(c.steps, cleanupStep{what, fn})
}

// run undoes everything, newest first, and returns the steps that failed.
func (c *cleanups) run() []error {
	c.mu.Lock()
	steps := c.steps
	c.steps = nil
	c.mu.Unlock()
	var errs []error
	for i := len(steps) - 1; i >= 0; i-- {
		start := time.Now()
		err := steps[i].fn()
		if os.Getenv("KL_DEMO_DEBUG") != "" {
			fmt.Fprintf(os.Stderr, "cleanup %s: %v (%v)\n", steps[i].what, err, time.Since(start))
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", steps[i].what, err))
		}
	}
	return errs
}

// output runs a command (bounded by ctx) and returns its combined output.
func output(ctx context.Context, name string, args ...string) (string, error) {
	var b bytes.Buffer
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Stdout, cmd.Stderr = &b, &b
	cmd.WaitDelay = time.Second
	err := cmd.Run()
	if err != nil {
		return b.String(), fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, strings.TrimSpace(b.String()))
	}
	return b.String(), nil
}

// nsPrefix starts the name of every netns the demo creates.
const nsPrefix = "kldemo"

var runSeq atomic.Uint64

// vethNames returns a fresh pair of interface names (at most 15 bytes).
func (d *demo) vethNames() (string, string) {
	d.seq++
	return fmt.Sprintf("kd%s-%da", d.tag, d.seq), fmt.Sprintf("kd%s-%db", d.tag, d.seq)
}

// ns is one named network namespace of the demo.
type ns struct {
	Name string // ip netns name
	Path string // /var/run/netns/NAME
}

// newNS creates a netns with loopback up; cleanup deletes it.
func (d *demo) newNS(ctx context.Context, role string) (*ns, error) {
	name := nsPrefix + d.tag + "-" + role
	if _, err := output(ctx, "ip", "netns", "add", name); err != nil {
		return nil, err
	}
	n := &ns{Name: name, Path: "/var/run/netns/" + name}
	d.undo.push("delete netns "+name, func() error {
		_, err := output(context.Background(), "ip", "netns", "del", name)
		return err
	})
	if _, err := n.exec(ctx, "ip", "link", "set", "lo", "up"); err != nil {
		return nil, err
	}
	return n, nil
}

// exec runs a command inside the netns.
func (n *ns) exec(ctx context.Context, name string, args ...string) (string, error) {
	return output(ctx, "ip", append([]string{"netns", "exec", n.Name, name}, args...)...)
}

// link joins two netns with a veth pair and assigns addresses (CIDR notation).
func (d *demo) link(ctx context.Context, a *ns, aAddrs []string, b *ns, bAddrs []string) error {
	aIf, bIf := d.vethNames()
	if _, err := output(ctx, "ip", "link", "add", aIf, "netns", a.Name, "type", "veth", "peer", "name", bIf, "netns", b.Name); err != nil {
		return err
	}
	// Deleting either netns removes the pair; nothing else to undo.
	for _, side := range []struct {
		n     *ns
		ifc   string
		addrs []string
	}{{a, aIf, aAddrs}, {b, bIf, bAddrs}} {
		for _, ad := range side.addrs {
			if _, err := side.n.exec(ctx, "ip", "addr", "add", ad, "dev", side.ifc); err != nil {
				return err
			}
		}
		if _, err := side.n.exec(ctx, "ip", "link", "set", side.ifc, "up"); err != nil {
			return err
		}
	}
	return nil
}

// proc is a long-running process the demo started; it is stopped by its PID.
type proc struct {
	name string
	cmd  *exec.Cmd
	log  string
	done chan struct{}
}

// start runs a daemon (inside netns n when n is not nil) in its own process group, with
// its output in logPath, and registers its stop (SIGTERM, then SIGKILL after grace).
func (d *demo) start(n *ns, logPath string, env []string, grace time.Duration, name string, args ...string) (*proc, error) {
	if n != nil {
		args = append([]string{"netns", "exec", n.Name, name}, args...)
		name = "ip"
	}
	lf, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	defer lf.Close()
	cmd := exec.Command(name, args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout, cmd.Stderr = lf, lf
	// Its own process group: a Ctrl-C on the terminal reaches the demo, which stops its
	// daemons in order (containerd before its shims' cleanup, for instance).
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &proc{name: name, cmd: cmd, log: logPath, done: make(chan struct{})}
	go func() { cmd.Wait(); close(p.done) }()
	d.undo.push(fmt.Sprintf("stop %s (pid %d)", strings.Join(cmd.Args, " "), cmd.Process.Pid), func() error {
		p.stop(grace)
		return nil
	})
	return p, nil
}

// stop sends SIGTERM to the process's PID, then SIGKILL after grace.
func (p *proc) stop(grace time.Duration) {
	select {
	case <-p.done:
		return
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(grace):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// tail is the end of the process's log, for error messages.
func (p *proc) tail() string {
	data, _ := os.ReadFile(p.log)
	if len(data) > 3000 {
		data = data[len(data)-3000:]
	}
	return string(data)
}

// waitFor polls cond every 25ms until it holds, the timeout passes or ctx ends.
func waitFor(ctx context.Context, timeout time.Duration, cond func() bool) error {
	deadline := time.Now().Add(timeout)
	for !cond() {
		if err := ctx.Err(); err != nil {
			return err
		}
		if time.Now().After(deadline) {
			return errors.New("timed out")
		}
		time.Sleep(25 * time.Millisecond)
	}
	return nil
}

// waitPort waits until something listens on the TCP port inside n.
func (n *ns) waitPort(ctx context.Context, port string, timeout time.Duration, p *proc) error {
	err := waitFor(ctx, timeout, func() bool {
		if p != nil && p.exited() {
			return true
		}
		out, _ := n.exec(ctx, "ss", "-Hltn")
		return strings.Contains(out, ":"+port+" ")
	})
	if p != nil && p.exited() {
		return fmt.Errorf("%s exited:\n%s", p.cmd.Path, p.tail())
	}
	if err != nil {
		return fmt.Errorf("nothing listens on :%s in %s: %w", port, n.Name, err)
	}
	return nil
}

// lineWriter prefixes each line written to it (progress of a sub-command).
type lineWriter struct {
	w      io.Writer
	prefix string
	buf    []byte
}

func (l *lineWriter) Write(p []byte) (int, error) {
	l.buf = append(l.buf, p...)
	for {
		i := bytes.IndexByte(l.buf, '\n')
		if i < 0 {
			return len(p), nil
		}
		fmt.Fprintf(l.w, "%s%s\n", l.prefix, l.buf[:i])
		l.buf = l.buf[i+1:]
	}
}
