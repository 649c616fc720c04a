package ctl

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"

	"github.com/kl-egress/kl/rules"
)

func init() {
	Register(Command{Name: "lint", Summary: "check a rules file as the daemon would load it, and warn about likely mistakes", Run: lint})
}

type lintError struct {
	Code string `json:"code"`
	Rule int    `json:"rule"`
	Line int    `json:"line"`
	Msg  string `json:"message"`
}

type lintJSON struct {
	File     string          `json:"file"`
	OK       bool            `json:"ok"`
	Error    *lintError      `json:"error"`
	Hash     string          `json:"hash,omitempty"`
	Form     string          `json:"form,omitempty"`
	Rules    int             `json:"rules"`
	Warnings []rules.Warning `json:"warnings"`
}

func lint(ctx context.Context, env *Env, args []string) error {
	fs := flag.NewFlagSet("lint", flag.ContinueOnError)
	var pf policyFlags
	pf.register(fs, false)
	asJSON := fs.Bool("json", false, "print one JSON object")
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: kl-ctl lint (FILE | --egress-route PATTERN=ROUTE... [--egress-default ROUTE]) [--detached] [--json]")
		fs.PrintDefaults()
	}
	pos, err := parseFlags(env, fs, args)
	if err != nil {
		return err
	}
	switch len(pos) {
	case 0:
	case 1:
		pf.rules = pos[0]
	default:
		return usageError(env, "lint", "one file at a time (got %d)", len(pos))
	}
	out := lintJSON{File: pf.source(), Warnings: []rules.Warning{}}
	quiet := &Env{Stdout: env.Stdout, Stderr: discard{}, Getenv: env.Getenv}
	p, loadErr := pf.load(quiet, "lint", pf.options(env, pf.detached))
	var re *rules.Error
	if loadErr != nil && !errors.As(loadErr, &re) {
		return pf.reportUsage(env, loadErr)
	}
	if re != nil && re.Code == rules.CodeClientDetached {
		// Say where every use of client is, not only the first.
		if q, err := pf.load(quiet, "lint", pf.options(env, false)); err == nil {
			out.Warnings = append(out.Warnings, rules.Lint(q, rules.LintOptions{Detached: true})...)
		}
	}
	if re != nil {
		out.Error = &lintError{Code: string(re.Code), Rule: re.Rule, Line: re.Line, Msg: re.Msg}
	} else {
		out.OK = true
		out.Hash = p.Hash()
		out.Rules = p.Len()
		out.Form = "dimension"
		switch {
		case p.HasScript():
			out.Form = "script"
		case p.PatternForm():
			out.Form = "pattern"
		}
		out.Warnings = append(out.Warnings, rules.Lint(p, rules.LintOptions{Detached: pf.detached})...)
	}
	if *asJSON {
		b, err := json.MarshalIndent(out, "", "  ")
		if err != nil {
			return err
		}
		fmt.Fprintf(env.Stdout, "%s\n", b)
	} else {
		for _, w := range out.Warnings {
			fmt.Fprintf(env.Stdout, "%s: warning: %s\n", out.File, w)
		}
		if out.OK {
			fmt.Fprintf(env.Stdout, "%s: ok: %s form, %s, %s, sha256 %s\n", out.File, out.Form, plural(out.Rules, "rule"), plural(len(out.Warnings), "warning"), out.Hash)
		}
	}
	if re != nil {
		fmt.Fprintln(env.Stderr, re.Error())
		return &ExitError{Code: ExitInvalid, Err: re}
	}
	return nil
}

// reportUsage prints a command-line problem that load reported to the quiet env.
func (pf *policyFlags) reportUsage(env *Env, err error) error {
	fmt.Fprintf(env.Stderr, "kl-ctl lint: %v\n", err)
	return err
}

type discard struct{}

func (discard) Write(b []byte) (int, error) { return len(b), nil }
