package ctl

import (
	"bytes"
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kl-egress/kl/relayd/attach"
)

// agentModeEnv makes the test binary a background agent when kl-ctl attach --background
// starts it: "run" runs kl-ctl as the real one would, "hang" never answers. Either
// writes its pid to the file agentPIDEnv names, and gives up after a minute.
const (
	agentModeEnv = "KL_CTL_TEST_AGENT"
	agentPIDEnv  = "KL_CTL_TEST_AGENT_PID"
)

func TestMain(m *testing.M) {
	mode := os.Getenv(agentModeEnv)
	if mode != "" {
		os.WriteFile(os.Getenv(agentPIDEnv), []byte(strconv.Itoa(os.Getpid())), 0o600)
	}
	switch mode {
	case "run":
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		err := Run(ctx, os.Args)
		cancel()
		os.Exit(ExitStatus(err))
	case "hang":
		time.Sleep(time.Minute)
		os.Exit(1)
	}
	os.Exit(m.Run())
}

// backgroundAttach runs kl-ctl attach --background with these extra arguments, against a
// server that refuses connections (the agent answers, not connected, at once), with the
// test binary in agent mode as the agent. It returns the command's output and error, and
// the agent's pid, which is killed at the test's end should it still run.
func backgroundAttach(t *testing.T, mode string, extra ...string) (string, int, error) {
	t.Helper()
	pidFile := filepath.Join(t.TempDir(), "pid")
	t.Setenv(agentModeEnv, mode)
	t.Setenv(agentPIDEnv, pidFile)
	out, err := runBackground(extra)
	b, rerr := os.ReadFile(pidFile)
	pid, perr := strconv.Atoi(string(b))
	if rerr != nil || perr != nil {
		t.Fatalf("the agent's pid file: %v %v (kl-ctl: %v)\n%s", rerr, perr, err, out)
	}
	t.Cleanup(func() { syscall.Kill(pid, syscall.SIGKILL) })
	return out, pid, err
}

func runBackground(extra []string) (string, error) {
	var stdout, stderr bytes.Buffer
	env := &Env{Stdout: &stdout, Stderr: &stderr, Getenv: func(k string) string { return "" }}
	args := append([]string{"kl-ctl", "attach", "--background", "--server", "127.0.0.1:1", "--token", "t0ken"}, extra...)
	err := RunEnv(context.Background(), env, args)
	return stdout.String() + stderr.String(), err
}

// TestAttachBackgroundRelativeControl: a relative --control names the same socket for
// the agent (which runs in /) as for the command that started it and for attach
// status|stop run from the same directory; the log lands next to it.
func TestAttachBackgroundRelativeControl(t *testing.T) {
	dir := t.TempDir()
	t.Chdir(dir)
	// An agent that took the name as relative to / would make its socket there.
	t.Cleanup(func() { os.Remove("/agent.sock") })
	out, pid, err := backgroundAttach(t, "run", "--control", "agent.sock")
	if err != nil {
		t.Fatalf("kl-ctl attach --background --control agent.sock: %v\n%s", err, out)
	}
	sock := filepath.Join(dir, "agent.sock")
	st, err := attach.AgentRequest(context.Background(), "agent.sock", "stop")
	if err != nil {
		t.Fatalf("stopping the agent on %s: %v", sock, err)
	}
	if st.PID != pid {
		t.Errorf("the agent on %s has pid %d, want %d", sock, st.PID, pid)
	}
	if !strings.Contains(out, filepath.Join(dir, "agent.sock.log")) {
		t.Errorf("the output does not name the log %s:\n%s", filepath.Join(dir, "agent.sock.log"), out)
	}
	if _, err := os.Stat(filepath.Join(dir, "agent.sock.log")); err != nil {
		t.Errorf("agent log: %v", err)
	}
	waitGone(t, pid)
}

// TestAttachBackgroundNoAnswer: an agent that does not answer in time is stopped and
// reaped, not left running on its own while the command reports failure.
func TestAttachBackgroundNoAnswer(t *testing.T) {
	defer func(d time.Duration) { agentStartTimeout = d }(agentStartTimeout)
	agentStartTimeout = 300 * time.Millisecond
	out, pid, err := backgroundAttach(t, "hang", "--control", filepath.Join(t.TempDir(), "agent.sock"))
	if err == nil {
		t.Fatalf("kl-ctl attach --background succeeded with an agent that never answers:\n%s", out)
	}
	// Killed and reaped: a zombie would still take signal 0.
	if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
		t.Errorf("after kl-ctl reported %q, the agent (pid %d) is still there (kill 0: %v)", strings.TrimSpace(out), pid, err)
	}
}

// waitGone waits until process pid has exited and been reaped.
func waitGone(t *testing.T, pid int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for syscall.Kill(pid, 0) == nil {
		if time.Now().After(deadline) {
			syscall.Kill(pid, syscall.SIGKILL)
			t.Fatalf("the agent (pid %d) did not exit after stop", pid)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// A foreground attach that cannot reach the daemon says why at every try, and ends with
// an error when it never attached (not a clean summary of nothing).
func TestAttachForegroundNeverAttached(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens there now: connection refused
	ctx, cancel := context.WithTimeout(context.Background(), 1500*time.Millisecond)
	defer cancel()
	var stdout, stderr bytes.Buffer
	env := &Env{Stdout: &stdout, Stderr: &stderr, Getenv: func(string) string { return "" }}
	err = RunEnv(ctx, env, []string{"kl-ctl", "attach", "--server", addr, "--token", strings.Repeat("t", 24)})
	if ExitStatus(err) == 0 || !strings.Contains(err.Error(), "never attached") {
		t.Errorf("attach that never connected: exit %d, %v; want a failure saying it never attached", ExitStatus(err), err)
	}
	if !strings.Contains(stderr.String(), "not attached:") || !strings.Contains(stderr.String(), "connection refused") {
		t.Errorf("stderr does not say why it cannot attach:\n%s", stderr.String())
	}
}
