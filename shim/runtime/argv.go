package runtime

import (
	"errors"
	"fmt"
	"strings"
)

// Invocation is what kl-runtime needs from a runc-style command line. The command line
// itself is never changed: it is forwarded to the real runtime as it came.
type Invocation struct {
	Command     string // first non-flag argument: create, run, exec, start, state, kill, delete, …
	ContainerID string // create, run and exec: the first non-flag argument after the command
	Bundle      string // --bundle/-b of create and run, as given ("" = current directory)
	ConfigFile  string // crun's --config/-f of create and run, as given
	ProcessFile string // --process/-p of exec, as given
	Log         string // global --log
	LogFormat   string // global --log-format
	Root        string // global --root
}

// ErrUsage marks a command line kl-runtime cannot interpret for a command it must edit.
var ErrUsage = errors.New("bad runtime command line")

// Global flags of runc and crun that take a value; every other global flag is boolean.
var globalValue = map[string]bool{
	"log": true, "log-format": true, "log-level": true, "root": true, "criu": true,
	"rootless": true, "cgroup-manager": true,
}

// Flags of create and run that take a value (runc and crun).
var createValue = map[string]bool{
	"bundle": true, "b": true, "console-socket": true, "pidfd-socket": true, "pid-file": true,
	"preserve-fds": true, "config": true, "f": true,
}

// Flags of exec that take a value (runc and crun).
var execValue = map[string]bool{
	"process": true, "p": true, "console-socket": true, "pidfd-socket": true, "pid-file": true,
	"cwd": true, "env": true, "e": true, "user": true, "u": true, "additional-gids": true, "g": true,
	"process-label": true, "apparmor": true, "cap": true, "c": true, "preserve-fds": true, "cgroup": true,
}

// ParseArgs reads a runc command line (without argv[0]). Global flags come before the
// command; the flags of create and run may come before or after the container id, as
// runc's CLI library allows. Both `--flag value` and `--flag=value` work, with one or
// two dashes. Unknown flags are taken as boolean unless written with `=`. A flag value
// missing at the end of the line is an error only for create and run, the commands whose
// spec kl-runtime edits; for anything else the real runtime gets to complain. Of exec it
// reads the container id and the process file (--process), whose environment kl-runtime
// edits.
func ParseArgs(args []string) (Invocation, error) {
	var inv Invocation
	i := 0
	for ; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			i++
			break
		}
		name, val, hasVal, isFlag := splitFlag(a)
		if !isFlag {
			break
		}
		if globalValue[name] && !hasVal {
			if i+1 >= len(args) {
				return inv, nil // no command follows: nothing to edit
			}
			i++
			val = args[i]
		}
		switch name {
		case "log":
			inv.Log = val
		case "log-format":
			inv.LogFormat = val
		case "root":
			inv.Root = val
		}
	}
	if i >= len(args) {
		return inv, nil
	}
	inv.Command = args[i]
	rest := args[i+1:]
	if inv.Command == "exec" {
		parseExec(&inv, rest)
		return inv, nil
	}
	edit := inv.Command == "create" || inv.Command == "run"
	if !edit {
		// Other commands go through untouched, and their flags (which may take values)
		// are not modelled, so nothing more is read.
		return inv, nil
	}
	for j := 0; j < len(rest); j++ {
		a := rest[j]
		if a == "--" {
			if inv.ContainerID == "" && j+1 < len(rest) {
				inv.ContainerID = rest[j+1]
			}
			break
		}
		name, val, hasVal, isFlag := splitFlag(a)
		if !isFlag {
			if inv.ContainerID == "" {
				inv.ContainerID = a
			}
			continue
		}
		if createValue[name] && !hasVal {
			if j+1 >= len(rest) {
				return inv, fmt.Errorf("%w: %s: flag %s needs a value", ErrUsage, inv.Command, a)
			}
			j++
			val = rest[j]
		}
		switch name {
		case "bundle", "b":
			inv.Bundle = val
		case "config", "f":
			inv.ConfigFile = val
		}
	}
	if inv.ContainerID == "" {
		return inv, fmt.Errorf("%w: %s: no container id", ErrUsage, inv.Command)
	}
	return inv, nil
}

// parseExec reads exec's flags and the container id. runc and crun take exec's flags
// only before the id (what follows it is the command to run), so reading stops there. A
// command line it cannot read leaves ContainerID or ProcessFile empty: the real runtime
// gets it unchanged and judges it.
func parseExec(inv *Invocation, rest []string) {
	for j := 0; j < len(rest); j++ {
		a := rest[j]
		if a == "--" {
			if j+1 < len(rest) {
				inv.ContainerID = rest[j+1]
			}
			return
		}
		name, val, hasVal, isFlag := splitFlag(a)
		if !isFlag {
			inv.ContainerID = a
			return
		}
		if execValue[name] && !hasVal {
			if j+1 >= len(rest) {
				return
			}
			j++
			val = rest[j]
		}
		if name == "process" || name == "p" {
			inv.ProcessFile = val
		}
	}
}

// splitFlag splits "-x", "--name", "--name=value" into the name and value.
func splitFlag(a string) (name, val string, hasVal, isFlag bool) {
	if len(a) < 2 || a[0] != '-' {
		return "", "", false, false
	}
	s := a[1:]
	if s[0] == '-' {
		s = s[1:]
	}
	if s == "" || s[0] == '-' || s[0] == '=' {
		return "", "", false, false
	}
	name, val, hasVal = strings.Cut(s, "=")
	return name, val, hasVal, true
}
