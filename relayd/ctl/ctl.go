// Package ctl is kl-ctl, the operator's command line: one subcommand per file
// (explain and lint here; status and attach talk to the daemon). Each subcommand
// registers itself in an init function; Run picks one by name.
//
// It holds no engine or daemon logic of its own: explain and lint load a policy with
// package rules exactly as the daemon would in the same environment, and print what the
// engine answers.
package ctl

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
)

// Env is what a subcommand may touch of the outside world.
type Env struct {
	Stdout io.Writer
	Stderr io.Writer
	Getenv func(string) string
}

// Command is one kl-ctl subcommand.
type Command struct {
	Name    string
	Summary string // one line for `kl-ctl help`
	Run     func(ctx context.Context, env *Env, args []string) error
}

var commands = map[string]Command{}

// Register adds a subcommand; call it from an init function.
func Register(c Command) {
	if _, dup := commands[c.Name]; dup {
		panic("ctl: command registered twice: " + c.Name)
	}
	commands[c.Name] = c
}

// ExitError ends kl-ctl with a given status after its message has been printed.
type ExitError struct {
	Code int
	Err  error // already reported
}

func (e *ExitError) Error() string {
	if e.Err == nil {
		return fmt.Sprintf("exit status %d", e.Code)
	}
	return e.Err.Error()
}

func (e *ExitError) Unwrap() error { return e.Err }

// Exit statuses.
const (
	ExitFail    = 1 // the command failed
	ExitInvalid = 2 // the policy does not load, or the command line is wrong
	ExitNoAgent = 3 // attach status|stop: no attach agent runs on the control socket
)

// Run runs kl-ctl with the process's standard streams and environment.
func Run(ctx context.Context, args []string) error {
	return RunEnv(ctx, &Env{Stdout: os.Stdout, Stderr: os.Stderr, Getenv: os.Getenv}, args)
}

// RunEnv runs kl-ctl; args[0] is the program name. Every error it returns has been
// printed already; ExitStatus tells the status to exit with.
func RunEnv(ctx context.Context, env *Env, args []string) error {
	if len(args) < 2 || args[1] == "help" || args[1] == "-h" || args[1] == "--help" {
		usage(env.Stdout)
		if len(args) < 2 {
			return &ExitError{Code: ExitInvalid}
		}
		return nil
	}
	c, ok := commands[args[1]]
	if !ok {
		fmt.Fprintf(env.Stderr, "kl-ctl: unknown command %q\n", args[1])
		usage(env.Stderr)
		return &ExitError{Code: ExitInvalid}
	}
	err := c.Run(ctx, env, args[2:])
	if err == nil {
		return nil
	}
	var ee *ExitError
	if errors.As(err, &ee) {
		return err
	}
	if errors.Is(err, flag.ErrHelp) {
		return nil
	}
	fmt.Fprintf(env.Stderr, "kl-ctl %s: %v\n", c.Name, err)
	return &ExitError{Code: ExitFail, Err: err}
}

// ExitStatus is the process status for an error returned by Run.
func ExitStatus(err error) int {
	if err == nil {
		return 0
	}
	var ee *ExitError
	if errors.As(err, &ee) {
		return ee.Code
	}
	return ExitFail
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "usage: kl-ctl COMMAND [flags]\n\ncommands:")
	names := make([]string, 0, len(commands))
	for n := range commands {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(w, "  %-10s %s\n", n, commands[n].Summary)
	}
	fmt.Fprintln(w, "\nRun kl-ctl COMMAND -h for a command's flags.")
}

// parseFlags parses flags and positional arguments in any order (`lint FILE --json`
// as well as `lint --json FILE`). A bad flag is reported and ends with status 2.
func parseFlags(env *Env, fs *flag.FlagSet, args []string) ([]string, error) {
	fs.SetOutput(env.Stderr)
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return nil, err
			}
			return nil, &ExitError{Code: ExitInvalid, Err: err}
		}
		args = fs.Args()
		if len(args) == 0 {
			return pos, nil
		}
		if args[0] == "--" {
			return append(pos, args[1:]...), nil
		}
		pos = append(pos, args[0])
		args = args[1:]
	}
}

// usageError reports a wrong command line and ends with status 2.
func usageError(env *Env, cmd, format string, a ...any) error {
	err := fmt.Errorf(format, a...)
	fmt.Fprintf(env.Stderr, "kl-ctl %s: %v\n", cmd, err)
	return &ExitError{Code: ExitInvalid, Err: err}
}

// multiFlag is a repeatable string flag.
type multiFlag []string

func (m *multiFlag) String() string     { return strings.Join(*m, ",") }
func (m *multiFlag) Set(s string) error { *m = append(*m, s); return nil }
